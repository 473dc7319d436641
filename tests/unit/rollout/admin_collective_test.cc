// The vllm and sglang admin dialects driving a collective weight update, against
// InferenceServerFake's vLLM and SGLang personalities (testing/inference_server_fake.h): real
// loopback servers that model the servers' ordering rules and refuse any request out of order (here
// failing the test), and a CollectiveSession double that completes a broadcast only once the server
// holds the metadata request (as NCCL does: the receivers allocate from it), while the server
// answers that request only once the broadcast ended or was aborted (the servers' weights hook).
#include <gtest/gtest.h>

#include <set>

#include "rollout/admin.h"
#include "testing/inference_server_fake.h"
#include "tests/unit/rollout/rollout_test_util.h"

namespace arlo::rollout {
namespace {

using arlo::testing::Dialect;
using arlo::testing::InferenceServerFake;
using arlo::testing::json_keys;
using test::run;
namespace asio = boost::asio;
using namespace std::chrono_literals;

constexpr auto kWindow = 10s;  // generous: every wait below ends on an event long before this

// A one-shot signal whose wait has a deadline.
class Signal {
 public:
  explicit Signal(asio::any_io_executor ex) : timer_(ex) {}
  void set() {
    set_ = true;
    timer_.cancel();
  }
  bool is_set() const { return set_; }
  asio::awaitable<bool> wait(std::chrono::steady_clock::duration limit = kWindow) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (!set_ && std::chrono::steady_clock::now() < end) {
      timer_.expires_at(end);
      boost::system::error_code ec;
      co_await timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    co_return set_;
  }

 private:
  asio::steady_timer timer_;
  bool set_ = false;
};

// One version's broadcast, shared by the session double and the test server.
struct Broadcast {
  explicit Broadcast(asio::any_io_executor ex) : arrived(ex), ended(ex), aborted(ex) {}
  Signal arrived;  // the server holds the metadata request
  Signal ended;    // the publisher's broadcast completed
  Signal aborted;  // the group was aborted (failed())
};

struct Rendezvous {
  explicit Rendezvous(asio::any_io_executor e) : ex(std::move(e)) {}
  asio::any_io_executor ex;
  std::shared_ptr<Broadcast> current;
  std::shared_ptr<Broadcast> get() {
    if (!current) current = std::make_shared<Broadcast>(ex);
    return current;
  }
};

Json tensor_list() {
  return Json::parse(R"([{"name": "model.embed_tokens.weight", "dtype": "bfloat16", "shape": [32, 8]},
                         {"name": "lm_head.weight", "dtype": "float32", "shape": [32, 8]}])");
}

Json make_group(std::int64_t generation, int world_size, bool with_uid) {
  Json g = {{"generation", generation},
            {"master_address", "127.0.0.1"},
            {"master_port", 29500 + static_cast<int>(generation)},
            {"rank_offset", 1},
            {"world_size", 1 + world_size},
            {"group_name", fmt::format("arlo-g{}", generation)},
            {"packed", true},
            {"packed_buffer_size_bytes", 1024},
            {"packed_num_buffers", 2}};
  if (with_uid) g["nccl_unique_id_b64"] = std::string(172, 'A');  // base64 of 128 bytes
  return g;
}

// The CollectiveSession double. Records what adapters call, in order, in `log`.
class FakeSession final : public CollectiveSession {
 public:
  explicit FakeSession(std::shared_ptr<Rendezvous> rv) : rv_(std::move(rv)) {}

  asio::awaitable<Result<Json>> group(std::string worker, int world_size) override {
    log.push_back(fmt::format("group {} {}", worker_name(worker), world_size));
    world_sizes.push_back(world_size);
    co_return make_group(generation, world_size, offer_uid);
  }
  asio::awaitable<Result<Json>> tensors() override { co_return tensor_list(); }
  asio::awaitable<Result<std::int64_t>> receiving(std::string /*worker*/, std::int64_t gen,
                                                  std::int64_t version) override {
    log.push_back(fmt::format("receiving v{} g{}", version, gen));
    if (gen != generation) ADD_FAILURE() << "receiving in generation " << gen << " but the group is in " << generation;
    auto b = rv_->get();
    if (fail_receiving) {
      log.push_back("receiving failed");
      b->aborted.set();
      co_return make_error(ErrorCode::kTimeout, "broadcast of v" + std::to_string(version) + " timed out");
    }
    // Like NCCL: the broadcast completes only with the receiver inside its receive call.
    const auto end = std::chrono::steady_clock::now() + kWindow;
    while (!b->arrived.is_set() && !b->aborted.is_set()) {
      if (std::chrono::steady_clock::now() >= end) {
        ADD_FAILURE() << "the broadcast of v" << version
                      << " was asked for but the metadata request never reached the server";
        co_return make_error(ErrorCode::kTimeout, "no metadata request");
      }
      auto arrival = b->arrived.wait(50ms);
      co_await std::move(arrival);
    }
    if (b->aborted.is_set()) {
      log.push_back("receiving aborted");
      co_return make_error(ErrorCode::kCancelled, "the group was aborted");
    }
    log.push_back("broadcast v" + std::to_string(version));
    b->ended.set();
    co_return sent_instead.value_or(version);
  }
  void failed(std::string worker, std::int64_t gen, std::string why) override {
    log.push_back(fmt::format("failed {} g{}", worker_name(worker), gen));
    last_failure = why;
    if (gen == generation) ++generation;  // the group is aborted; the next one is a new generation
    rv_->get()->aborted.set();
    rv_->current.reset();  // whoever waits on it holds it
  }

  std::string worker_name(const std::string& url) const { return url == worker_url ? "W" : url; }

  std::string worker_url;
  std::int64_t generation = 0;
  bool offer_uid = true;
  bool fail_receiving = false;
  std::optional<std::int64_t> sent_instead;
  std::vector<std::string> log;
  std::vector<int> world_sizes;
  std::string last_failure;

 private:
  std::shared_ptr<Rendezvous> rv_;
};

AdminOptions fast() {
  AdminOptions o;
  o.call_timeout = 5s;
  o.transfer_timeout = 5s;
  o.retry = {3, 1ms, 5ms};
  return o;
}

WeightUpdate collective_update(std::int64_t version, std::shared_ptr<CollectiveSession> session) {
  WeightUpdate u;
  u.version = version;
  u.collective = std::move(session);
  return u;
}

struct Rig {
  asio::io_context io;
  std::shared_ptr<Rendezvous> rv = std::make_shared<Rendezvous>(io.get_executor());
  std::shared_ptr<FakeSession> session = std::make_shared<FakeSession>(rv);
  http::Client client{io};
  std::vector<std::unique_ptr<InferenceServerFake>> servers;  // destroyed before io

  // A vLLM server of `version` with `world_size` workers, coupled to the session's broadcasts.
  InferenceServerFake& vllm(std::string version, int world_size, bool weight_info = true) {
    return serve({.dialect = Dialect::kVllm,
                  .vllm_version = std::move(version),
                  .world_size = world_size,
                  .weight_info = weight_info});
  }
  InferenceServerFake& sglang(int tp_size) { return serve({.dialect = Dialect::kSglang, .world_size = tp_size}); }

  // An admin client of `dialect` for the server at `url`, the worker the session names "W".
  std::unique_ptr<AdminClient> admin_for_worker(AdminDialect dialect, const std::string& url) {
    session->worker_url = url;
    return make_admin_client(dialect, client, url, fast());
  }

 private:
  InferenceServerFake& serve(testing::InferenceServerOptions o) {
    auto& srv = *servers.emplace_back(std::make_unique<InferenceServerFake>(io, std::move(o)));
    srv.on_violation = [](const std::string& what) { ADD_FAILURE() << "server saw a violation: " << what; };
    srv.on_weights_request = [this, &srv](Json) { return hold_for_broadcast(srv); };
    return srv;
  }
  // Answers a metadata request the way both servers do: after the broadcast into it ended (or the
  // group was aborted, which a real server reports as a failed update).
  asio::awaitable<std::optional<http::Response>> hold_for_broadcast(InferenceServerFake& srv) {
    auto b = rv->get();
    if (b->arrived.is_set()) co_return srv.violation("a second metadata request while one is in flight");
    b->arrived.set();
    while (!b->ended.is_set() && !b->aborted.is_set()) {
      auto w = b->ended.wait(50ms);
      co_await std::move(w);
    }
    rv->current.reset();
    if (!b->ended.is_set())
      co_return http::Response::json(500, Json{{"error", "NCCL error: the communicator was aborted"}});
    co_return std::nullopt;
  }
};

std::string what(const Status& s) { return s ? std::string("ok") : s.error().what(); }

// ---- vLLM ----

// One full cycle per version, twice, for a server of the given version.
void vllm_two_updates(Rig& rig, InferenceServerFake& srv, int world_size) {
  auto admin = rig.admin_for_worker(AdminDialect::kVllm, srv.url());
  run(rig.io, [&]() -> asio::awaitable<void> {
    for (std::int64_t v : {1, 2}) {
      EXPECT_EQ(what(co_await admin->pause(PauseMode::kKeep)), "ok");
      EXPECT_EQ(what(co_await admin->prepare_weights(collective_update(v, rig.session))), "ok");
      EXPECT_EQ(what(co_await admin->commit_weights(v)), "ok");
      EXPECT_EQ(what(co_await admin->resume()), "ok");
    }
    auto w = co_await admin->weights();
    EXPECT_TRUE(w && w->version == 2) << (w ? "" : w.error().what());
  }());
  EXPECT_TRUE(srv.violations.empty());
  EXPECT_EQ(srv.count("GET /version"), 1);
  EXPECT_EQ(srv.count("GET /get_world_size"), 1);
  EXPECT_EQ(srv.count("POST /init_weight_transfer_engine"), 1);
  EXPECT_EQ(srv.count("POST /update_weights"), 2);
  EXPECT_EQ(srv.body_of("POST /finish_weight_update", 0), Json({{"weight_version", "1"}}));
  EXPECT_EQ(srv.body_of("POST /finish_weight_update", 1), Json({{"weight_version", "2"}}));
  // The group is asked for every update (it may be a new one) and joined once.
  EXPECT_EQ(rig.session->log,
            (std::vector<std::string>{fmt::format("group W {}", world_size), "receiving v1 g0", "broadcast v1",
                                      fmt::format("group W {}", world_size), "receiving v2 g0", "broadcast v2"}));
}

TEST(AdminVllmCollective, Version026SendsPackedFieldsWithTheUpdateAndACheckpointStart) {
  Rig rig;
  auto& srv = rig.vllm("0.26.0", 2);
  vllm_two_updates(rig, srv, 2);
  const Json init = srv.body_of("POST /init_weight_transfer_engine")["init_info"];
  EXPECT_EQ(init,
            Json({{"master_address", "127.0.0.1"}, {"master_port", 29500}, {"rank_offset", 1}, {"world_size", 3}}));
  EXPECT_EQ(srv.body_of("POST /start_weight_update"), Json({{"is_checkpoint_format", true}}));
  const Json info = srv.body_of("POST /update_weights")["update_info"];
  EXPECT_EQ(info["packed"], true);
  EXPECT_EQ(info["packed_buffer_size_bytes"], 1024);
  EXPECT_EQ(info["shapes"][0], Json::array({32, 8}));
  const std::vector<std::string> first_cycle(srv.requests.begin(), srv.requests.begin() + 8);
  EXPECT_EQ(first_cycle,
            (std::vector<std::string>{"POST /pause", "GET /version", "GET /get_world_size",
                                      "POST /init_weight_transfer_engine", "POST /start_weight_update",
                                      "POST /update_weights", "POST /finish_weight_update", "POST /resume"}));
}

TEST(AdminVllmCollective, Version028MovesPackingIntoInitAndStartsWithAnEmptyObject) {
  Rig rig;
  auto& srv = rig.vllm("0.28.0", 2);
  vllm_two_updates(rig, srv, 2);  // the session offers a unique id too: 0.28 has no such field
  const Json init = srv.body_of("POST /init_weight_transfer_engine")["init_info"];
  EXPECT_FALSE(init.contains("nccl_unique_id_b64"));
  EXPECT_EQ(init["master_port"], 29500);
  EXPECT_EQ(init["packed_num_buffers"], 2);
  EXPECT_EQ(srv.body_of("POST /start_weight_update", 0), Json::object());
  EXPECT_EQ(srv.body_of("POST /start_weight_update", 1), Json::object());
  EXPECT_EQ(json_keys(srv.body_of("POST /update_weights")["update_info"]),
            (std::set<std::string>{"names", "dtype_names", "shapes"}));
}

TEST(AdminVllmCollective, MainBuildTakesTheUniqueIdInsteadOfTheStore) {
  Rig rig;
  auto& srv = rig.vllm("0.30.0rc1.dev42+g0123abc", 1);
  vllm_two_updates(rig, srv, 1);
  const Json init = srv.body_of("POST /init_weight_transfer_engine")["init_info"];
  EXPECT_EQ(init["nccl_unique_id_b64"], std::string(172, 'A'));
  EXPECT_FALSE(init.contains("master_address"));
  EXPECT_EQ(init["world_size"], 2);
  EXPECT_EQ(rig.session->world_sizes, (std::vector<int>{1, 1}));  // one group() per update
}

// A release that refuses the base64 id joins the same group through the store, and is sent the
// store's fields for every later group.
TEST(AdminVllmCollective, AServerRefusingTheUniqueIdJoinsTheSameGroupThroughTheStore) {
  Rig rig;
  auto& srv = rig.vllm("0.29.0", 1);
  srv.vllm.refuse_unique_id = true;
  auto admin = rig.admin_for_worker(AdminDialect::kVllm, srv.url());
  run(rig.io, [&]() -> asio::awaitable<void> {
    EXPECT_EQ(what(co_await admin->prepare_weights(collective_update(1, rig.session))), "ok");
    EXPECT_EQ(what(co_await admin->commit_weights(1)), "ok");
    srv.vllm.fail_update = true;  // the group fails: the next update joins a new generation
    EXPECT_FALSE(co_await admin->prepare_weights(collective_update(2, rig.session)));
    srv.vllm.fail_update = false;
    EXPECT_EQ(what(co_await admin->prepare_weights(collective_update(3, rig.session))), "ok");
    EXPECT_EQ(what(co_await admin->commit_weights(3)), "ok");
  }());
  EXPECT_TRUE(srv.violations.empty());
  ASSERT_EQ(srv.count("POST /init_weight_transfer_engine"), 3);
  const Json refused = srv.body_of("POST /init_weight_transfer_engine", 0)["init_info"];
  EXPECT_EQ(refused["nccl_unique_id_b64"], std::string(172, 'A'));
  const Json joined = srv.body_of("POST /init_weight_transfer_engine", 1)["init_info"];
  EXPECT_FALSE(joined.contains("nccl_unique_id_b64"));
  EXPECT_EQ(joined["master_address"], "127.0.0.1");
  EXPECT_EQ(joined["master_port"], 29500);  // the same group (generation 0)
  EXPECT_EQ(joined["rank_offset"], refused["rank_offset"]);
  const Json next = srv.body_of("POST /init_weight_transfer_engine", 2)["init_info"];
  EXPECT_FALSE(next.contains("nccl_unique_id_b64"));
  EXPECT_EQ(next["master_port"], 29501);
  // The refusal aborted no group: only the failed update did.
  EXPECT_EQ(rig.session->log, (std::vector<std::string>{"group W 1", "receiving v1 g0", "broadcast v1", "group W 1",
                                                        "receiving v2 g0", "failed W g0", "receiving aborted",
                                                        "group W 1", "receiving v3 g1", "broadcast v3"}));
  EXPECT_EQ(srv.weight_version, "3");
}

// Any other init failure is not retried: it aborts the group.
TEST(AdminVllmCollective, AnInitFailureNotAboutTheUniqueIdIsNotRetried) {
  Rig rig;
  auto& srv = rig.vllm("0.29.0", 1);
  auto admin = rig.admin_for_worker(AdminDialect::kVllm, srv.url());
  srv.vllm.fail_init = true;
  run(rig.io, [&]() -> asio::awaitable<void> {
    EXPECT_FALSE(co_await admin->prepare_weights(collective_update(1, rig.session)));
  }());
  EXPECT_EQ(srv.count("POST /init_weight_transfer_engine"), 1);
  EXPECT_TRUE(srv.body_of("POST /init_weight_transfer_engine")["init_info"].contains("nccl_unique_id_b64"));
  EXPECT_EQ(rig.session->log, (std::vector<std::string>{"group W 1", "failed W g0"}));
}

TEST(AdminVllmCollective, MainBuildWithoutAUniqueIdUsesTheStore) {
  Rig rig;
  rig.session->offer_uid = false;
  auto& srv = rig.vllm("0.30.0", 1);
  vllm_two_updates(rig, srv, 1);
  EXPECT_EQ(srv.body_of("POST /init_weight_transfer_engine")["init_info"]["master_address"], "127.0.0.1");
}

TEST(AdminVllmCollective, ServerWithoutStartAndFinishIsRefusedBeforeAnyTransferCall) {
  Rig rig;
  auto& srv = rig.vllm("0.19.1", 1);
  auto admin = make_admin_client(AdminDialect::kVllm, rig.client, srv.url(), fast());
  run(rig.io, [&]() -> asio::awaitable<void> {
    auto r = co_await admin->prepare_weights(collective_update(1, rig.session));
    EXPECT_FALSE(r);
    EXPECT_NE(what(r).find("vLLM 0.19.1 lacks /start_weight_update"), std::string::npos) << what(r);
    EXPECT_NE(what(r).find(">= 0.22"), std::string::npos) << what(r);
  }());
  EXPECT_EQ(srv.requests, std::vector<std::string>{"GET /version"});
  EXPECT_TRUE(rig.session->log.empty());
}

TEST(AdminVllmCollective, FailedUpdateCallAbortsTheGroupOnceAndTheNextUpdateJoinsANewGeneration) {
  Rig rig;
  auto& srv = rig.vllm("0.26.0", 1);
  auto admin = rig.admin_for_worker(AdminDialect::kVllm, srv.url());
  run(rig.io, [&]() -> asio::awaitable<void> {
    srv.vllm.fail_update = true;
    auto r = co_await admin->prepare_weights(collective_update(1, rig.session));
    EXPECT_FALSE(r);
    EXPECT_NE(what(r).find("POST " + srv.url() + "/update_weights: HTTP 500"), std::string::npos) << what(r);
    EXPECT_NE(what(r).find("CUDA out of memory"), std::string::npos) << what(r);
    EXPECT_FALSE(co_await admin->commit_weights(1));  // nothing prepared
    srv.vllm.fail_update = false;
    // The open layerwise session ends with the failed server's engine re-initialised.
    EXPECT_EQ(what(co_await admin->prepare_weights(collective_update(2, rig.session))), "ok");
    EXPECT_EQ(what(co_await admin->commit_weights(2)), "ok");
  }());
  EXPECT_TRUE(srv.violations.empty());
  EXPECT_EQ(srv.count("POST /update_weights"), 2);  // not retried
  EXPECT_EQ(srv.vllm.init_ports, (std::vector<int>{29500, 29501}));
  EXPECT_EQ(rig.session->log,
            (std::vector<std::string>{"group W 1", "receiving v1 g0", "failed W g0", "receiving aborted", "group W 1",
                                      "receiving v2 g1", "broadcast v2"}));
  EXPECT_NE(rig.session->last_failure.find("HTTP 500"), std::string::npos);
  EXPECT_EQ(srv.weight_version, "2");
}

TEST(AdminVllmCollective, FailedBroadcastFailsThePrepareAndTheServerAnswersOnlyAfterIt) {
  Rig rig;
  auto& srv = rig.vllm("0.28.0", 1);
  auto admin = rig.admin_for_worker(AdminDialect::kVllm, srv.url());
  run(rig.io, [&]() -> asio::awaitable<void> {
    rig.session->fail_receiving = true;
    auto r = co_await admin->prepare_weights(collective_update(1, rig.session));
    EXPECT_FALSE(r);
    EXPECT_NE(what(r).find("broadcast of v1 timed out"), std::string::npos) << what(r);
    rig.session->fail_receiving = false;
    rig.session->generation = 1;  // the session aborted its group
    EXPECT_EQ(what(co_await admin->prepare_weights(collective_update(2, rig.session))), "ok");
  }());
  EXPECT_TRUE(srv.violations.empty());
  EXPECT_EQ(srv.count("POST /init_weight_transfer_engine"), 2);
}

TEST(AdminVllmCollective, ANewerVersionSentIsTheOneFinished) {
  Rig rig;
  auto& srv = rig.vllm("0.28.0", 1, /*weight_info=*/false);
  rig.session->sent_instead = 3;
  auto admin = make_admin_client(AdminDialect::kVllm, rig.client, srv.url(), fast());
  run(rig.io, [&]() -> asio::awaitable<void> {
    EXPECT_EQ(what(co_await admin->prepare_weights(collective_update(2, rig.session))), "ok");
    EXPECT_EQ(what(co_await admin->commit_weights(2)), "ok");
    auto w = co_await admin->weights();  // no /weight_info: what this adapter committed
    EXPECT_TRUE(w && w->version == 3);
  }());
  EXPECT_EQ(srv.weight_version, "3");
}

TEST(AdminVllmCollective, VerifyChecksumsEveryParameterOnceResumedAndComparesToABaseline) {
  Rig rig;
  auto& srv = rig.vllm("0.28.0", 1);
  AdminOptions o = fast();
  o.verify_weights = true;
  auto plain = make_admin_client(AdminDialect::kVllm, rig.client, srv.url(), o);
  o.verify_baseline = {{"model.embed_tokens.weight", "aa11"}, {"lm_head.weight", "ff00"}};
  auto baseline = make_admin_client(AdminDialect::kVllm, rig.client, srv.url(), o);
  run(rig.io, [&]() -> asio::awaitable<void> {
    EXPECT_EQ(what(co_await plain->pause(PauseMode::kAbort)), "ok");
    EXPECT_EQ(what(co_await plain->prepare_weights(collective_update(1, rig.session))), "ok");
    EXPECT_EQ(what(co_await plain->commit_weights(1)), "ok");
    EXPECT_EQ(what(co_await plain->resume()), "ok");
    auto w = co_await plain->weights();
    EXPECT_TRUE(w && w->checksum == "checksums:2") << (w ? w->checksum : w.error().what());
    EXPECT_EQ(what(co_await plain->resume()), "ok");  // checked once per committed version
    // A second adapter (its own group: a new generation) against a baseline that differs.
    rig.session->generation = 1;
    EXPECT_EQ(what(co_await baseline->pause(PauseMode::kAbort)), "ok");
    EXPECT_EQ(what(co_await baseline->prepare_weights(collective_update(2, rig.session))), "ok");
    EXPECT_EQ(what(co_await baseline->commit_weights(2)), "ok");
    auto r = co_await baseline->resume();
    EXPECT_NE(what(r).find("v2: /weight_checker: the weights differ from the baseline in [\"lm_head.weight\"]"),
              std::string::npos)
        << what(r);
  }());
  EXPECT_TRUE(srv.violations.empty());
  EXPECT_EQ(srv.count("POST /weight_checker"), 2);
  EXPECT_EQ(srv.body_of("POST /weight_checker", 0), Json({{"action", "checksum"}}));
  EXPECT_EQ(srv.body_of("POST /weight_checker", 1)["action"], "compare");
}

// arlo's own transports: the backend is checked once, then each update is start, update (the version
// and the receiver block), finish with the version; the session's group is never joined.
TEST(AdminVllmStreamed, UpdatesNameTheVersionAndTheReceiverBlock) {
  Rig rig;
  auto& srv = rig.vllm("0.32.0", 1);
  srv.vllm.arlo_backend = true;
  auto admin = make_admin_client(AdminDialect::kVllm, rig.client, srv.url(), fast());
  const Json block = {{"transport", "tcp"}, {"address", "10.0.0.5:29500"}, {"timeout_ms", 120000}};
  run(rig.io, [&]() -> asio::awaitable<void> {
    for (std::int64_t v : {3, 4}) {
      WeightUpdate u;
      u.version = v;
      u.weight_sync = block;
      EXPECT_EQ(what(co_await admin->pause(PauseMode::kAbort)), "ok");
      EXPECT_EQ(what(co_await admin->prepare_weights(u)), "ok");
      EXPECT_EQ(what(co_await admin->commit_weights(v)), "ok");
      EXPECT_EQ(what(co_await admin->resume()), "ok");
      auto w = co_await admin->weights();
      EXPECT_TRUE(w && w->version == v && w->checksum == "9cb6f9b675c9fd58") << (w ? w->checksum : w.error().what());
    }
  }());
  EXPECT_TRUE(srv.violations.empty()) << srv.violations.front();
  EXPECT_EQ(srv.count("POST /init_weight_transfer_engine"), 1);
  EXPECT_EQ(srv.count("GET /get_world_size"), 0);
  ASSERT_EQ(srv.vllm.streamed.size(), 2u);
  EXPECT_EQ(srv.vllm.streamed[1], Json({{"version", 4}, {"weight_sync", block}}));
  EXPECT_EQ(srv.weight_version, "4");
}

// The trainer's publisher serves its newest version: an update asked for v3 that brought v4 is
// finished as v4.
// keep must not clear the KV of the requests it keeps (vLLM clears caches unless told not to).
TEST(AdminVllmStreamed, KeepPausesWithoutClearingTheCache) {
  Rig rig;
  auto& srv = rig.vllm("0.32.0", 1);
  auto admin = make_admin_client(AdminDialect::kVllm, rig.client, srv.url(), fast());
  run(rig.io, [&]() -> asio::awaitable<void> {
    for (auto mode : {PauseMode::kKeep, PauseMode::kWait, PauseMode::kAbort})
      EXPECT_EQ(what(co_await admin->pause(mode)), "ok");
  }());
  EXPECT_EQ(srv.vllm.pause_targets,
            (std::vector<std::string>{"/pause?mode=keep&clear_cache=false", "/pause?mode=wait", "/pause?mode=abort"}));
}

TEST(AdminVllmStreamed, ANewerVersionReceivedIsTheOneFinished) {
  Rig rig;
  auto& srv = rig.vllm("0.32.0", 1);
  srv.vllm.arlo_backend = true;
  srv.vllm.ahead = 1;
  auto admin = make_admin_client(AdminDialect::kVllm, rig.client, srv.url(), fast());
  WeightUpdate u;
  u.version = 3;
  u.weight_sync = {{"transport", "tcp"}, {"address", "10.0.0.5:29500"}};
  run(rig.io, [&]() -> asio::awaitable<void> {
    EXPECT_EQ(what(co_await admin->prepare_weights(u)), "ok");
    EXPECT_EQ(what(co_await admin->commit_weights(3)), "ok");
  }());
  EXPECT_EQ(srv.weight_version, "4");
}

TEST(AdminVllmStreamed, AServerWithoutArlosBackendIsToldWhatToStartItWith) {
  Rig rig;
  auto& srv = rig.vllm("0.32.0", 1);  // vLLM's default backend: NCCL
  auto admin = make_admin_client(AdminDialect::kVllm, rig.client, srv.url(), fast());
  WeightUpdate u;
  u.version = 4;
  u.weight_sync = {{"transport", "filesystem"}, {"dir", "/shared/weights"}};
  run(rig.io, [&]() -> asio::awaitable<void> {
    auto r = co_await admin->prepare_weights(u);
    EXPECT_NE(what(r).find("Invalid init_info for NCCLWeightTransferEngine"), std::string::npos) << what(r);
    EXPECT_NE(what(r).find("vLLM takes arlo's filesystem transport through arlo's weight-transfer backend: start "
                           "it with VLLM_SERVER_DEV_MODE=1"),
              std::string::npos)
        << what(r);
    EXPECT_NE(what(r).find("--weight-transfer-config '{\"backend\": \"arlo\"}'"), std::string::npos) << what(r);
  }());
  EXPECT_EQ(srv.count("POST /start_weight_update"), 0);
}

// The fakes' own contract: a request out of order is logged, answered 400 and reported to the hook.
TEST(AdminVllmCollective, TheFakeReportsARequestOutOfOrder) {
  Rig rig;
  auto& srv = rig.vllm("0.28.0", 1);
  std::vector<std::string> seen;
  srv.on_violation = [&](const std::string& what) { seen.push_back(what); };
  const Json finish = {{"weight_version", "1"}};
  run(rig.io, [&]() -> asio::awaitable<void> {
    auto r = co_await rig.client.post_json(srv.url() + "/finish_weight_update", finish);
    EXPECT_TRUE(r && r->status == 400);
  }());
  EXPECT_EQ(seen, std::vector<std::string>{"/finish_weight_update without /start_weight_update"});
  EXPECT_EQ(srv.violations, seen);
  EXPECT_EQ(srv.requests, std::vector<std::string>{"POST /finish_weight_update"});
  EXPECT_TRUE(srv.weight_version.empty());
}

// ---- SGLang ----

TEST(AdminSglangCollective, GroupOncePerGenerationAndFlushOnlyWhenNothingRuns) {
  Rig rig;
  auto& srv = rig.sglang(2);
  auto admin = rig.admin_for_worker(AdminDialect::kSglang, srv.url());
  run(rig.io, [&]() -> asio::awaitable<void> {
    srv.sglang.running = 3;  // keep: the requests stay in the batch
    EXPECT_EQ(what(co_await admin->pause(PauseMode::kKeep)), "ok");
    EXPECT_EQ(what(co_await admin->prepare_weights(collective_update(1, rig.session))), "ok");
    EXPECT_EQ(what(co_await admin->commit_weights(1)), "ok");
    EXPECT_EQ(what(co_await admin->resume()), "ok");
    EXPECT_EQ(what(co_await admin->pause(PauseMode::kAbort)), "ok");  // aborts the 3
    EXPECT_EQ(what(co_await admin->prepare_weights(collective_update(2, rig.session))), "ok");
    EXPECT_EQ(what(co_await admin->resume()), "ok");
    srv.sglang.running = 0;  // wait: arlo drained its dispatcher before pausing
    EXPECT_EQ(what(co_await admin->pause(PauseMode::kWait)), "ok");
    EXPECT_EQ(what(co_await admin->prepare_weights(collective_update(3, rig.session))), "ok");
    EXPECT_EQ(what(co_await admin->resume()), "ok");
    srv.sglang.running = 2;  // an update without a pause: requests may run
    EXPECT_EQ(what(co_await admin->prepare_weights(collective_update(4, rig.session))), "ok");
    auto w = co_await admin->weights();
    EXPECT_TRUE(w && w->version == 4);
  }());
  EXPECT_TRUE(srv.violations.empty());
  EXPECT_EQ(srv.count("GET /get_server_info"), 1);
  EXPECT_EQ(srv.count("POST /init_weights_update_group"), 1);
  EXPECT_EQ(srv.body_of("POST /init_weights_update_group"), Json({{"master_address", "127.0.0.1"},
                                                                  {"master_port", 29500},
                                                                  {"rank_offset", 1},
                                                                  {"world_size", 3},
                                                                  {"group_name", "arlo-g0"},
                                                                  {"backend", "nccl"}}));
  EXPECT_EQ(srv.body_of("POST /pause_generation", 0), Json({{"mode", "in_place"}}));
  EXPECT_EQ(srv.body_of("POST /pause_generation", 1), Json({{"mode", "abort"}}));
  EXPECT_EQ(srv.body_of("POST /pause_generation", 2), Json({{"mode", "in_place"}}));
  std::vector<bool> flush;
  for (int i = 0; i < 4; ++i)
    flush.push_back(srv.body_of("POST /update_weights_from_distributed", i).value("flush_cache", true));
  EXPECT_EQ(flush, (std::vector<bool>{false, true, true, false}));
  const Json upd = srv.body_of("POST /update_weights_from_distributed", 0);
  EXPECT_EQ(upd["group_name"], "arlo-g0");
  EXPECT_EQ(upd["weight_version"], "1");
  EXPECT_EQ(upd["shapes"][1], Json::array({32, 8}));
  EXPECT_EQ(rig.session->world_sizes, (std::vector<int>{2, 2, 2, 2}));  // asked every update, init once
}

TEST(AdminSglangCollective, TheVersionComesFromModelInfoAndFromTheOldRouteOnlyWhereThatIsMissing) {
  Rig rig;
  auto& current = rig.sglang(1);
  auto& legacy = rig.sglang(1);
  legacy.sglang.legacy = true;
  current.weight_version = "7";
  legacy.weight_version = "6";
  auto a = make_admin_client(AdminDialect::kSglang, rig.client, current.url(), fast());
  auto b = make_admin_client(AdminDialect::kSglang, rig.client, legacy.url(), fast());
  run(rig.io, [&]() -> asio::awaitable<void> {
    auto w = co_await a->weights();
    EXPECT_TRUE(w && w->version == 7) << (w ? "" : w.error().what());
    w = co_await b->weights();
    EXPECT_TRUE(w && w->version == 6) << (w ? "" : w.error().what());
    current.weight_version = "default";  // a server started without --weight-version: no number
    w = co_await a->weights();
    EXPECT_TRUE(w && !w->version) << (w ? "" : w.error().what());
  }());
  EXPECT_EQ(current.count("GET /model_info"), 2);
  EXPECT_EQ(current.count("GET /get_weight_version"), 0);
  EXPECT_EQ(legacy.requests, (std::vector<std::string>{"GET /model_info", "GET /get_weight_version"}));
}

TEST(AdminSglangCollective, RefusalWithHttp200AbortsTheGroupAndTheNextUpdateJoinsANewOne) {
  Rig rig;
  auto& srv = rig.sglang(1);
  auto admin = rig.admin_for_worker(AdminDialect::kSglang, srv.url());
  run(rig.io, [&]() -> asio::awaitable<void> {
    srv.sglang.refuse_update = true;
    auto r = co_await admin->prepare_weights(collective_update(1, rig.session));
    EXPECT_NE(
        what(r).find(
            "POST " + srv.url() +
            "/update_weights_from_distributed: refused (HTTP 200): Failed to update parameter online: shape mismatch"),
        std::string::npos)
        << what(r);
    srv.sglang.refuse_update = false;
    EXPECT_EQ(what(co_await admin->prepare_weights(collective_update(2, rig.session))), "ok");
  }());
  EXPECT_TRUE(srv.violations.empty());
  EXPECT_EQ(srv.count("POST /update_weights_from_distributed"), 2);
  EXPECT_EQ(srv.body_of("POST /init_weights_update_group", 1)["group_name"], "arlo-g1");
  // The aborted group's communicator is freed on the server before the new one is made.
  EXPECT_EQ(srv.body_of("POST /destroy_weights_update_group"), Json({{"group_name", "arlo-g0"}}));
  EXPECT_EQ(rig.session->log,
            (std::vector<std::string>{"group W 1", "receiving v1 g0", "failed W g0", "receiving aborted", "group W 1",
                                      "receiving v2 g1", "broadcast v2"}));
}

TEST(AdminSglangCollective, ANewerVersionSentIsRelabelled) {
  Rig rig;
  auto& srv = rig.sglang(1);
  rig.session->sent_instead = 5;
  auto admin = make_admin_client(AdminDialect::kSglang, rig.client, srv.url(), fast());
  run(rig.io, [&]() -> asio::awaitable<void> {
    EXPECT_EQ(what(co_await admin->prepare_weights(collective_update(4, rig.session))), "ok");
    auto w = co_await admin->weights();
    EXPECT_TRUE(w && w->version == 5);
  }());
  EXPECT_EQ(srv.body_of("POST /update_weight_version"), Json({{"new_version", "5"}, {"abort_all_requests", false}}));
}

TEST(AdminSglangCollective, DiskUpdateFollowsTheFlushRuleAndReportsTheServersMessage) {
  Rig rig;
  auto& srv = rig.sglang(1);
  auto admin = make_admin_client(AdminDialect::kSglang, rig.client, srv.url(), fast());
  WeightUpdate good;
  good.version = 8;
  good.extra = {{"model_path", "/runs/x/weights/v8"}};
  WeightUpdate missing = good;
  const WeightUpdate neither;  // neither a session nor a path
  missing.extra = {{"model_path", "/runs/x/weights/v9"}};
  run(rig.io, [&]() -> asio::awaitable<void> {
    srv.sglang.running = 1;
    EXPECT_EQ(what(co_await admin->pause(PauseMode::kKeep)), "ok");
    EXPECT_EQ(what(co_await admin->prepare_weights(good)), "ok");
    auto r = co_await admin->prepare_weights(missing);
    EXPECT_NE(what(r).find("/update_weights_from_disk: refused (HTTP 400): model_path does not exist"),
              std::string::npos)
        << what(r);
    EXPECT_FALSE(co_await admin->prepare_weights(neither));
  }());
  EXPECT_TRUE(srv.violations.empty());
  EXPECT_EQ(srv.body_of("POST /update_weights_from_disk"), Json({{"model_path", "/runs/x/weights/v8"},
                                                                 {"load_format", "auto"},
                                                                 {"flush_cache", false},
                                                                 {"weight_version", "8"}}));
  EXPECT_EQ(srv.weight_version, "8");
}

TEST(AdminSglangCollective, DataParallelServerIsRefused) {
  Rig rig;
  auto& srv = rig.sglang(1);
  srv.sglang.dp_size = 2;
  auto admin = make_admin_client(AdminDialect::kSglang, rig.client, srv.url(), fast());
  run(rig.io, [&]() -> asio::awaitable<void> {
    auto r = co_await admin->prepare_weights(collective_update(1, rig.session));
    EXPECT_NE(what(r).find("dp_size 2 without DP attention"), std::string::npos) << what(r);
  }());
  EXPECT_TRUE(rig.session->log.empty());
}

}  // namespace
}  // namespace arlo::rollout
