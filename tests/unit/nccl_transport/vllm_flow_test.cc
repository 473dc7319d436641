// The whole collective update as `arlo run` drives it, without a GPU: the vLLM and SGLang admin
// adapters (rollout/admin.h) and the run's TrainerCollective session against test servers on
// loopback, and the trainer's real nccl StagingPublisher (control and rendezvous stores) with the
// communicator's double in place of libnccl. The servers read the unique id from the rendezvous
// store as their workers do, and the double holds every broadcast until the server holds the
// metadata request, so a broadcast that came first would hang the test into its deadline.
#include <gtest/gtest.h>

#include <boost/asio/steady_timer.hpp>

#include "common/http.h"
#include "session/adapters/collective_session.h"
#include "rollout/admin.h"
#include "tests/unit/nccl_transport/nccl_trainer.h"
#include "tests/unit/rollout/rollout_test_util.h"
#include "weight_sync/staging.h"
#include "weight_sync/transports/nccl/rendezvous.h"
#include "weight_sync/transports/nccl/store.h"
#include "testing/nccl_fake_backend.h"
#include "weight_sync/wire.h"

namespace arlo {
namespace {

namespace asio = boost::asio;
namespace ws = weight_sync;
using namespace std::chrono_literals;
using nlohmann::json;
using ws::nccl::testing::Call;

std::vector<ws::TensorSpec> specs() {
  return {{"model.embed_tokens.weight", ws::DType::BF16, {32, 8}}, {"lm_head.weight", ws::DType::F32, {32, 8}}};
}

// Ran broadcasts the double recorded.
std::size_t broadcasts_ran(const ws::nccl::testing::FakeBackend& fake) {
  std::size_t n = 0;
  for (const auto& c : fake.calls(Call::Kind::kBroadcast)) n += c.ran ? 1 : 0;
  return n;
}

// A server's side of the test: routes, the order they came in, and the rendezvous as its workers
// do it (the id read from the store named in the group init).
class Server {
 public:
  Server(asio::io_context& io, ws::nccl::testing::FakeBackend& fake) : io_(io), fake_(fake), server_(io, options()) {}
  ~Server() { server_.close(); }
  std::string url() const { return fmt::format("http://127.0.0.1:{}", port_); }
  std::vector<std::string> log;
  std::vector<std::string> violations;

 protected:
  static http::ServerOptions options() {
    http::ServerOptions o;
    o.stop_grace = 100ms;
    return o;
  }
  using Handler = std::function<asio::awaitable<http::Response>(const json&)>;
  void on(http::Verb verb, std::string path, Handler h) {
    server_.route(verb, path, [this, path, h = std::move(h)](http::Request req) -> asio::awaitable<http::Response> {
      log.push_back(path);
      json body = req.body.empty() ? json() : json::parse(req.body, nullptr, false);
      co_return co_await h(body);
    });
  }
  void start() { port_ = *server_.start(); }
  http::Response violation(const std::string& what) {
    ADD_FAILURE() << what;
    violations.push_back(what);
    return http::Response::json(400, json{{"error", what}});
  }
  // What a worker reads from the group's rendezvous store (a real TCPStore client's keys).
  std::string read_id(const json& info, const std::string& key) {
    auto store = ws::nccl::StoreClient::connect(info.at("master_address").get<std::string>(),
                                                info.at("master_port").get<std::uint16_t>(), ws::deadline_in(5s));
    if (!store) return "";
    auto v = (*store)->get(key, ws::deadline_in(5s));
    return v ? *v : "";
  }
  // The metadata request is here: let the broadcasts run, answer once they did (as a real server
  // answers once the tensors arrived).
  asio::awaitable<bool> receive(std::size_t broadcasts) {
    if (broadcasts_ran(fake_) != ran_before_) {
      violation("a broadcast ran before the server held the metadata request");
      co_return false;
    }
    fake_.release_collectives();
    asio::steady_timer t(io_);
    const auto end = std::chrono::steady_clock::now() + 10s;
    while (broadcasts_ran(fake_) < ran_before_ + broadcasts && std::chrono::steady_clock::now() < end) {
      t.expires_after(5ms);
      co_await t.async_wait(asio::use_awaitable);
    }
    ran_before_ = broadcasts_ran(fake_);
    fake_.hold_collectives_from(fake_.calls().size());  // the next version's wait for their request too
    co_return broadcasts_ran(fake_) == ran_before_&& ran_before_ > 0;
  }

  asio::io_context& io_;
  ws::nccl::testing::FakeBackend& fake_;
  http::Server server_;
  std::uint16_t port_ = 0;
  std::size_t ran_before_ = 0;
};

class Vllm final : public Server {
 public:
  Vllm(asio::io_context& io, ws::nccl::testing::FakeBackend& fake) : Server(io, fake) {
    on(http::Verb::get, "/version", [](const json&) -> asio::awaitable<http::Response> {
      co_return http::Response::json(200, json{{"version", "0.28.0"}});
    });
    on(http::Verb::get, "/get_world_size", [](const json&) -> asio::awaitable<http::Response> {
      co_return http::Response::json(200, json{{"world_size", 2}});
    });
    on(http::Verb::post, "/pause",
       [](const json&) -> asio::awaitable<http::Response> { co_return http::Response::json(200, json{}); });
    on(http::Verb::post, "/resume",
       [](const json&) -> asio::awaitable<http::Response> { co_return http::Response::json(200, json{}); });
    on(http::Verb::post, "/init_weight_transfer_engine", [this](const json& b) -> asio::awaitable<http::Response> {
      const auto& info = b.at("init_info");
      if (info.at("rank_offset") != 1 || info.at("world_size") != 3)
        co_return violation("init_info ranks: " + info.dump());
      // vLLM's StatelessProcessGroup reads the pickled id; the warm-up all-reduce already ran on rank 0's side.
      const auto pickled = read_id(info, std::string(ws::nccl::kVllmUniqueIdKey));
      if (pickled.size() < 200 || static_cast<unsigned char>(pickled[0]) != 0x80)
        co_return violation("no pickled id in the store");
      co_return http::Response::json(200, json{{"message", "Weight transfer initialized"}});
    });
    on(http::Verb::post, "/start_weight_update",
       [](const json&) -> asio::awaitable<http::Response> { co_return http::Response::json(200, json{}); });
    on(http::Verb::post, "/update_weights", [this](const json& b) -> asio::awaitable<http::Response> {
      const auto& info = b.at("update_info");
      if (info.at("names") != json::array({"model.embed_tokens.weight", "lm_head.weight"}) ||
          info.at("dtype_names") != json::array({"bfloat16", "float32"}))
        co_return violation("update_info: " + info.dump());
      const bool ok = co_await receive(1);  // both tensors fit one packed bucket
      co_return ok ? http::Response::json(200, json{}) : http::Response::json(500, json{{"error", "no broadcast"}});
    });
    on(http::Verb::post, "/finish_weight_update", [this](const json& b) -> asio::awaitable<http::Response> {
      finished = b.at("weight_version").get<std::string>();
      co_return http::Response::json(200, json{});
    });
    start();
  }
  std::string finished;
};

class Sglang final : public Server {
 public:
  Sglang(asio::io_context& io, ws::nccl::testing::FakeBackend& fake) : Server(io, fake) {
    on(http::Verb::get, "/get_server_info", [](const json&) -> asio::awaitable<http::Response> {
      co_return http::Response::json(200, json{{"tp_size", 1}, {"dp_size", 1}, {"pp_size", 1}});
    });
    on(http::Verb::post, "/pause_generation",
       [](const json&) -> asio::awaitable<http::Response> { co_return http::Response::json(200, json{}); });
    on(http::Verb::post, "/continue_generation",
       [](const json&) -> asio::awaitable<http::Response> { co_return http::Response::json(200, json{}); });
    on(http::Verb::post, "/init_weights_update_group", [this](const json& b) -> asio::awaitable<http::Response> {
      // torch's ProcessGroupNCCL reads the raw id under its PrefixStore key.
      const auto raw = read_id(b, ws::nccl::sglang_unique_id_key(b.at("group_name").get<std::string>()));
      if (raw.size() != 128) co_return violation("no raw id under SGLang's key");
      co_return http::Response::json(200, json{{"success", true}, {"message", "ok"}});
    });
    on(http::Verb::post, "/update_weights_from_distributed", [this](const json& b) -> asio::awaitable<http::Response> {
      if (b.at("names").size() != 2) co_return violation("names: " + b.dump());
      const bool ok = co_await receive(2);  // one broadcast per tensor
      co_return http::Response::json(200, json{{"success", ok}, {"message", ok ? "ok" : "no broadcast"}});
    });
    start();
  }
};

std::string what(const Status& s) { return s ? std::string("ok") : s.error().what(); }

template <typename Srv>
void one_update(rollout::AdminDialect dialect, const char* flavor, std::size_t collectives_before_update) {
  ws::nccl::testing::ScopedBackend fake;
  fake->hold_collectives_from(collectives_before_update);  // vLLM's warm-up may run; broadcasts wait
  ws::testing::NcclTrainer trainer(10s);                   // stages v1
  trainer.start();
  ws::HostWeights w(specs());
  ASSERT_TRUE(trainer.pub->stage(1, w));
  asio::io_context io;
  Srv server(io, *fake);
  auto session =
      session::adapters::TrainerCollective::create({.expected = 1, .flavor = flavor, .gather = 2s, .timeout = 10s});
  session->announce({{"weight_sync", ws::to_json(trainer.announcement(1))}});
  http::Client client(io);
  rollout::AdminOptions o;
  o.call_timeout = 10s;
  o.transfer_timeout = 10s;
  auto admin = rollout::make_admin_client(dialect, client, server.url(), o);
  rollout::test::run(io, [&]() -> asio::awaitable<void> {
    EXPECT_EQ(what(co_await admin->pause(arlo::PauseMode::kAbort)), "ok");
    rollout::WeightUpdate u;
    u.version = 1;
    u.collective = session;
    EXPECT_EQ(what(co_await admin->prepare_weights(u)), "ok");
    EXPECT_EQ(what(co_await admin->commit_weights(1)), "ok");
    EXPECT_EQ(what(co_await admin->resume()), "ok");
  }());
  EXPECT_TRUE(server.violations.empty());
  EXPECT_TRUE(fake->misuse().empty());
  const auto inits = fake->calls(Call::Kind::kInit);
  ASSERT_EQ(inits.size(), 1u);
  EXPECT_EQ(inits[0].rank, 0);
}

TEST(CollectiveFlow, VllmServerGetsTheGroupWarmUpAndPackedBroadcastBehindItsMetadataRequest) {
  one_update<Vllm>(rollout::AdminDialect::kVllm, "vllm", /*warm-up=*/1);
}

TEST(CollectiveFlow, SglangServerGetsItsKeyAndOneBroadcastPerTensorBehindItsMetadataRequest) {
  one_update<Sglang>(rollout::AdminDialect::kSglang, "sglang", 0);
}

}  // namespace
}  // namespace arlo
