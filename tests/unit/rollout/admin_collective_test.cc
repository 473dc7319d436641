// The vllm and sglang admin dialects driving a collective weight update, against test servers on
// real loopback sockets that model the servers' ordering rules and refuse (failing the test) any
// request out of order, and a CollectiveSession double that completes a broadcast only once the
// server holds the metadata request (as NCCL does: the receivers allocate from it), while the
// server answers that request only once the broadcast ended or was aborted.
#include <gtest/gtest.h>

#include <set>

#include "rollout/admin.h"
#include "tests/unit/rollout/rollout_test_util.h"

namespace arlo::rollout {
namespace {

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

// Shared plumbing of the two test servers: a route table on a loopback http::Server, a log of
// requests, and a violation list (each also fails the test where it is found).
class TestServer {
 public:
  explicit TestServer(asio::io_context& io, std::shared_ptr<Rendezvous> rv) : rv_(std::move(rv)) {
    http::ServerOptions o;
    o.stop_grace = 100ms;
    server_ = std::make_unique<http::Server>(io, o);
  }
  virtual ~TestServer() { server_->close(); }
  std::string url() const { return fmt::format("http://127.0.0.1:{}", port_); }
  std::vector<std::string> requests;  // "POST /path" in arrival order
  std::vector<Json> bodies;           // parallel to requests (null when empty)
  std::vector<std::string> violations;

  Json body_of(const std::string& request, int nth = 0) const {
    for (std::size_t i = 0; i < requests.size(); ++i)
      if (requests[i] == request && nth-- == 0) return bodies[i];
    return Json();
  }
  int count(const std::string& request) const {
    return static_cast<int>(std::count(requests.begin(), requests.end(), request));
  }

 protected:
  using Handler = std::function<asio::awaitable<http::Response>(const Json&, const http::Request&)>;
  void on(http::Verb verb, std::string path, Handler h) {
    const std::string name = fmt::format("{} {}", verb == http::Verb::get ? "GET" : "POST", path);
    server_->route(verb, path, [this, name, h = std::move(h)](http::Request req) -> asio::awaitable<http::Response> {
      requests.push_back(name);
      Json body = req.body.empty() ? Json() : Json::parse(req.body, nullptr, false);
      bodies.push_back(body);
      co_return co_await h(body, req);
    });
  }
  void start() { port_ = *server_->start(); }
  http::Response violation(std::string what) {
    ADD_FAILURE() << "server saw a violation: " << what;
    violations.push_back(what);
    return http::Response::json(400, Json{{"error", what}});
  }
  // Answers a metadata request the way both servers do: after the broadcast into it ended (or the
  // group was aborted, which a real server reports as a failed update).
  asio::awaitable<std::optional<http::Response>> hold_for_broadcast() {
    auto b = rv_->get();
    if (b->arrived.is_set()) co_return violation("a second metadata request while one is in flight");
    b->arrived.set();
    while (!b->ended.is_set() && !b->aborted.is_set()) {
      auto w = b->ended.wait(50ms);
      co_await std::move(w);
    }
    rv_->current.reset();
    if (!b->ended.is_set())
      co_return http::Response::json(500, Json{{"error", "NCCL error: the communicator was aborted"}});
    co_return std::nullopt;
  }

  std::shared_ptr<Rendezvous> rv_;
  std::unique_ptr<http::Server> server_;
  std::uint16_t port_ = 0;
};

std::set<std::string> keys(const Json& j) {
  std::set<std::string> out;
  if (j.is_object())
    for (const auto& [k, v] : j.items()) out.insert(k);
  return out;
}

struct VllmShape {
  int minor = 26;
};

// vLLM's dev-mode RL routes, with the per-version validation its dataclasses do (unknown keys
// refused) and the layerwise-reload session rules (start, update..., finish).
class FakeVllm final : public TestServer {
 public:
  FakeVllm(asio::io_context& io, std::shared_ptr<Rendezvous> rv, std::string version, int world_size,
           bool weight_info = true)
      : TestServer(io, std::move(rv)), version_(std::move(version)), world_size_(world_size) {
    minor_ = std::stoi(version_.substr(version_.find('.') + 1));
    on(http::Verb::get, "/version", [this](const Json&, const http::Request&) -> asio::awaitable<http::Response> {
      co_return http::Response::json(200, Json{{"version", version_}});
    });
    on(http::Verb::get, "/get_world_size",
       [this](const Json&, const http::Request&) -> asio::awaitable<http::Response> {
         co_return http::Response::json(200, Json{{"world_size", world_size_}});
       });
    on(http::Verb::post, "/pause", [this](const Json&, const http::Request& r) -> asio::awaitable<http::Response> {
      paused = true;
      pause_targets.push_back(r.target);
      co_return http::Response::json(200, Json{{"status", "paused"}});
    });
    on(http::Verb::post, "/resume", [this](const Json&, const http::Request&) -> asio::awaitable<http::Response> {
      paused = false;
      co_return http::Response::json(200, Json{{"status", "resumed"}});
    });
    on(http::Verb::post, "/init_weight_transfer_engine",
       [this](const Json& b, const http::Request&) -> asio::awaitable<http::Response> { co_return init(b); });
    on(http::Verb::post, "/start_weight_update",
       [this](const Json& b, const http::Request&) -> asio::awaitable<http::Response> { co_return start_update(b); });
    on(http::Verb::post, "/update_weights",
       [this](const Json& b, const http::Request&) -> asio::awaitable<http::Response> {
         if (auto refused = check_update(b)) co_return *refused;
         if (fail_update)
           co_return http::Response::json(500,
                                          Json{{"error", "CUDA out of memory while allocating the receive buffer"}});
         if (!arlo_backend) {  // arlo's backend pulls over its own transport: no broadcast to join
           auto held = co_await hold_for_broadcast();
           if (held) co_return *held;
         }
         updated_since_start_ = true;
         co_return http::Response::json(200, Json{{"message", "Weights updated"}});
       });
    on(http::Verb::post, "/finish_weight_update",
       [this](const Json& b, const http::Request&) -> asio::awaitable<http::Response> {
         if (!in_update_) co_return violation("/finish_weight_update without /start_weight_update");
         if (!updated_since_start_) co_return violation("/finish_weight_update before /update_weights returned");
         in_update_ = false;
         if (!b.is_object() || !b.contains("weight_version") || !b["weight_version"].is_string())
           co_return violation("/finish_weight_update without a string weight_version: " + b.dump());
         weight_version = b["weight_version"].get<std::string>();
         co_return http::Response::json(200, Json{{"message", "Weight update finished"}});
       });
    if (weight_info)
      on(http::Verb::get, "/weight_info", [this](const Json&, const http::Request&) -> asio::awaitable<http::Response> {
        co_return http::Response::json(
            200, Json{{"weight_version", weight_version.empty() ? Json() : Json(weight_version)}});
      });
    on(http::Verb::post, "/collective_rpc",
       [this](const Json& b, const http::Request&) -> asio::awaitable<http::Response> {
         if (!arlo_backend || b != Json{{"method", "arlo_weights"}}) co_return violation("/collective_rpc " + b.dump());
         Json report = streamed.empty() ? Json::object()
                                        : Json{{"version", streamed.back()["version"].get<std::int64_t>() + ahead},
                                               {"checksum", loaded_checksum}};
         co_return http::Response::json(200, Json{{"results", Json::array({report, report})}});
       });
    on(http::Verb::post, "/weight_checker",
       [this](const Json& b, const http::Request&) -> asio::awaitable<http::Response> {
         if (paused)
           co_return http::Response::json(409, Json{{"detail", "weight_checker requires an awake, unpaused engine"}});
         if (b.value("action", "") == "checksum") co_return http::Response::json(200, Json{{"checksums", checksums}});
         if (b.value("action", "") == "compare") {
           Json mismatches = Json::array();
           for (const auto& [name, hex] : checksums.items())
             if (b["baseline"].value(name, "") != hex) mismatches.push_back(name);
           co_return http::Response::json(200, Json{{"match", mismatches.empty()}, {"mismatches", mismatches}});
         }
         co_return violation("/weight_checker action " + b.dump());
       });
    start();
  }

  bool paused = false;
  bool fail_update = false;
  bool refuse_unique_id = false;
  bool fail_init = false;
  std::vector<std::string> pause_targets;
  bool arlo_backend = false;   // --weight-transfer-config '{"backend": "arlo"}' (python/arlo_vllm)
  std::vector<Json> streamed;  // the update_info of each arlo-backend update
  std::string loaded_checksum = "9cb6f9b675c9fd58";  // what its two workers' arlo_weights() report
  std::int64_t ahead = 0;                            // the publisher held this many versions past the one asked for
  std::string weight_version;
  Json checksums = {{"model.embed_tokens.weight", "aa11"}, {"lm_head.weight", "bb22"}};
  std::vector<int> init_ports;

 private:
  http::Response init(const Json& b) {
    if (!b.is_object() || !b.contains("init_info")) return violation("/init_weight_transfer_engine without init_info");
    if (fail_init)
      return http::Response::json(500,
                                  Json{{"detail", "NCCL error: unhandled system error (run with NCCL_DEBUG=INFO)"}});
    const Json& info = b["init_info"];
    if (info == Json::object()) {  // arlo's backend takes nothing up front; vLLM's NCCL engine refuses that
      if (!arlo_backend)
        return http::Response::json(500,
                                    Json{{"error",
                                          {{"message",
                                            "Call to collective_rpc method failed: Worker failed with error "
                                            "'Invalid init_info for NCCLWeightTransferEngine: __init__() missing 4 "
                                            "required positional arguments'"}}}});
      engine_ready_ = true;
      return http::Response::json(200, Json{{"message", "Weight transfer initialized"}});
    }
    std::set<std::string> want = {"rank_offset", "world_size"};
    if (info.contains("nccl_unique_id_b64")) {
      if (minor_ < 29) return violation("nccl_unique_id_b64 sent to vLLM " + version_);
      if (refuse_unique_id)  // a release without vllm PR #53784: its dataclass has no such field
        return http::Response::json(
            400, Json{{"detail",
                       "Invalid init_info for NCCLWeightTransferEngine: NCCLWeightTransferInitInfo.__init__() "
                       "got an unexpected keyword argument 'nccl_unique_id_b64'"}});
      if (info.contains("master_address") || info.contains("master_port"))
        return violation("both rendezvous modes in init_info");
      want.insert("nccl_unique_id_b64");
    } else {
      want.insert({"master_address", "master_port"});
    }
    if (minor_ >= 28) want.insert({"packed", "packed_buffer_size_bytes", "packed_num_buffers"});
    if (keys(info) != want) return violation("Invalid init_info for vLLM " + version_ + ": " + info.dump());
    const int port = info.value("master_port", 0);
    if (port != 0 && std::find(init_ports.begin(), init_ports.end(), port) != init_ports.end())
      return violation("a second init for the group on port " + std::to_string(port));
    init_ports.push_back(port);
    engine_ready_ = true;
    in_update_ = false;
    return http::Response::json(200, Json{{"message", "Weight transfer initialized"}});
  }
  http::Response start_update(const Json& b) {
    if (!engine_ready_) return violation("/start_weight_update before /init_weight_transfer_engine");
    if (in_update_) return violation("/start_weight_update while an update is open");
    // Handlers that read `await raw_request.json()` answer an empty body with 400.
    if (!b.is_object()) return http::Response::json(400, Json{{"detail", "There was an error parsing the body"}});
    if (minor_ >= 28 && !b.empty())
      return violation("is_checkpoint_format (removed in 0.28) sent to vLLM " + version_ + ": " + b.dump());
    if (minor_ < 28 && b != Json{{"is_checkpoint_format", true}})
      return violation("/start_weight_update body " + b.dump());
    in_update_ = true;
    updated_since_start_ = false;
    return http::Response::json(200, Json{{"message", "Weight update started"}});
  }
  std::optional<http::Response> check_update(const Json& b) {
    if (!in_update_) return violation("/update_weights without /start_weight_update");
    if (!b.is_object() || !b.contains("update_info")) return violation("/update_weights without update_info");
    const Json& info = b["update_info"];
    if (arlo_backend) {
      if (keys(info) != std::set<std::string>{"version", "weight_sync"} || !info["version"].is_number_integer() ||
          !info["weight_sync"].is_object())
        return violation("Invalid update_info for ArloWeightTransferEngine: " + info.dump());
      streamed.push_back(info);
      return std::nullopt;
    }
    std::set<std::string> want = {"names", "dtype_names", "shapes"};
    if (minor_ < 28) want.insert({"packed", "packed_buffer_size_bytes", "packed_num_buffers"});
    if (keys(info) != want) return violation("Invalid update_info for vLLM " + version_ + ": " + info.dump());
    if (info["names"] != Json::array({"model.embed_tokens.weight", "lm_head.weight"}) ||
        info["dtype_names"] != Json::array({"bfloat16", "float32"}) || info["shapes"][1] != Json::array({32, 8}))
      return violation("update_info lists other tensors: " + info.dump());
    return std::nullopt;
  }

  std::string version_;
  int minor_ = 0;
  int world_size_ = 1;
  bool engine_ready_ = false;
  bool in_update_ = false;
  bool updated_since_start_ = false;
};

// SGLang's weight-update routes: a group per group_name, updates that assert (here: a violation)
// when the cache is flushed with requests running, {"success": false} answers on refusal.
class FakeSglang final : public TestServer {
 public:
  FakeSglang(asio::io_context& io, std::shared_ptr<Rendezvous> rv, int tp_size)
      : TestServer(io, std::move(rv)), tp_size_(tp_size) {
    on(http::Verb::get, "/get_server_info",
       [this](const Json&, const http::Request&) -> asio::awaitable<http::Response> {
         co_return http::Response::json(
             200, Json{{"tp_size", tp_size_}, {"dp_size", dp_size}, {"pp_size", 1}, {"version", "0.5.9"}});
       });
    on(http::Verb::post, "/pause_generation",
       [this](const Json& b, const http::Request&) -> asio::awaitable<http::Response> {
         const std::string mode = b.value("mode", "");
         if (mode == "abort")
           running = 0;
         else if (mode != "in_place")
           co_return violation("pause mode " + b.dump());
         paused = true;
         co_return http::Response::json(200, Json{{"message", "paused"}});
       });
    on(http::Verb::post, "/continue_generation",
       [this](const Json&, const http::Request&) -> asio::awaitable<http::Response> {
         paused = false;
         co_return http::Response::json(200, Json{{"message", "continued"}});
       });
    on(http::Verb::post, "/destroy_weights_update_group",
       [this](const Json& b, const http::Request&) -> asio::awaitable<http::Response> {
         if (!groups_.erase(b.value("group_name", ""))) co_return violation("destroy of an unknown group " + b.dump());
         co_return http::Response::json(200, Json{{"success", true}, {"message", "destroyed"}});
       });
    on(http::Verb::post, "/init_weights_update_group",
       [this](const Json& b, const http::Request&) -> asio::awaitable<http::Response> {
         const std::set<std::string> want = {"master_address", "master_port", "rank_offset",
                                             "world_size",     "group_name",  "backend"};
         if (keys(b) != want || b.value("backend", "") != "nccl")
           co_return violation("init_weights_update_group body " + b.dump());
         if (groups_.count(b["group_name"].get<std::string>()))
           co_return violation("a second init of group " + b["group_name"].dump());
         groups_.insert(b["group_name"].get<std::string>());
         co_return http::Response::json(
             200, Json{{"success", true}, {"message", "Succeeded to initialize custom process group."}});
       });
    on(http::Verb::post, "/update_weights_from_distributed",
       [this](const Json& b, const http::Request&) -> asio::awaitable<http::Response> {
         if (!groups_.count(b.value("group_name", "")))
           co_return violation("update for an unknown group " + b.value("group_name", ""));
         if (b["names"] != Json::array({"model.embed_tokens.weight", "lm_head.weight"}) ||
             b["dtypes"] != Json::array({"bfloat16", "float32"}))
           co_return violation("update lists other tensors: " + b.dump());
         if (b.value("flush_cache", true) && running > 0)
           co_return violation("flush_cache with running requests (SGLang asserts)");
         if (refuse_update)
           co_return http::Response::json(
               200, Json{{"success", false}, {"message", "Failed to update parameter online: shape mismatch"}});
         auto held = co_await hold_for_broadcast();
         if (held) co_return *held;
         weight_version = b.value("weight_version", "");
         co_return http::Response::json(200,
                                        Json{{"success", true}, {"message", "Succeeded to update parameter online."}});
       });
    on(http::Verb::post, "/update_weights_from_disk",
       [this](const Json& b, const http::Request&) -> asio::awaitable<http::Response> {
         if (b.value("flush_cache", true) && running > 0)
           co_return violation("flush_cache with running requests (SGLang asserts)");
         if (b.value("model_path", "") != "/runs/x/weights/v8")
           co_return http::Response::json(
               400, Json{{"success", false}, {"message", "model_path does not exist"}, {"num_paused_requests", 0}});
         weight_version = b.value("weight_version", "");
         co_return http::Response::json(
             200,
             Json{{"success", true}, {"message", "Succeeded to update model weights."}, {"num_paused_requests", 0}});
       });
    on(http::Verb::post, "/update_weight_version",
       [this](const Json& b, const http::Request&) -> asio::awaitable<http::Response> {
         weight_version = b.value("new_version", "");
         co_return http::Response::json(200, Json{{"success", true}, {"new_version", weight_version}});
       });
    // Current SGLang: the version is in /model_info; the old routes answer 404 (FastAPI's
    // HTTPException body). `legacy` is a server from before that: no /model_info.
    on(http::Verb::get, "/model_info", [this](const Json&, const http::Request&) -> asio::awaitable<http::Response> {
      if (legacy) co_return http::Response::json(404, Json{{"detail", "Not Found"}});
      co_return http::Response::json(
          200, Json{{"model_path", "Qwen/Qwen3-1.7B"}, {"is_generation", true}, {"weight_version", weight_version}});
    });
    for (const char* route : {"/get_weight_version", "/weight_version"})
      on(http::Verb::get, route, [this, route](const Json&, const http::Request&) -> asio::awaitable<http::Response> {
        if (legacy) co_return http::Response::json(200, Json{{"weight_version", weight_version}});
        co_return http::Response::json(
            404,
            Json{{"detail", fmt::format("Endpoint '{}' is deprecated. Please use '/model_info' instead.", route)}});
      });
    start();
  }

  bool legacy = false;  // a server from before /model_info carried the version

  int running = 0;  // requests in the server's batch
  int dp_size = 1;
  bool paused = false;
  bool refuse_update = false;
  std::string weight_version;

 private:
  int tp_size_;
  std::set<std::string> groups_;
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
  // An admin client of `dialect` for the server at `url`, the worker the session names "W".
  std::unique_ptr<AdminClient> admin_for_worker(AdminDialect dialect, const std::string& url) {
    session->worker_url = url;
    return make_admin_client(dialect, client, url, fast());
  }
};

std::string what(const Status& s) { return s ? std::string("ok") : s.error().what(); }

// ---- vLLM ----

// One full cycle per version, twice, for a server of the given version.
void vllm_two_updates(Rig& rig, FakeVllm& srv, int world_size) {
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
  FakeVllm srv(rig.io, rig.rv, "0.26.0", 2);
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
  FakeVllm srv(rig.io, rig.rv, "0.28.0", 2);
  vllm_two_updates(rig, srv, 2);  // the session offers a unique id too: 0.28 has no such field
  const Json init = srv.body_of("POST /init_weight_transfer_engine")["init_info"];
  EXPECT_FALSE(init.contains("nccl_unique_id_b64"));
  EXPECT_EQ(init["master_port"], 29500);
  EXPECT_EQ(init["packed_num_buffers"], 2);
  EXPECT_EQ(srv.body_of("POST /start_weight_update", 0), Json::object());
  EXPECT_EQ(srv.body_of("POST /start_weight_update", 1), Json::object());
  EXPECT_EQ(keys(srv.body_of("POST /update_weights")["update_info"]),
            (std::set<std::string>{"names", "dtype_names", "shapes"}));
}

TEST(AdminVllmCollective, MainBuildTakesTheUniqueIdInsteadOfTheStore) {
  Rig rig;
  FakeVllm srv(rig.io, rig.rv, "0.30.0rc1.dev42+g0123abc", 1);
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
  FakeVllm srv(rig.io, rig.rv, "0.29.0", 1);
  srv.refuse_unique_id = true;
  auto admin = rig.admin_for_worker(AdminDialect::kVllm, srv.url());
  run(rig.io, [&]() -> asio::awaitable<void> {
    EXPECT_EQ(what(co_await admin->prepare_weights(collective_update(1, rig.session))), "ok");
    EXPECT_EQ(what(co_await admin->commit_weights(1)), "ok");
    srv.fail_update = true;  // the group fails: the next update joins a new generation
    EXPECT_FALSE(co_await admin->prepare_weights(collective_update(2, rig.session)));
    srv.fail_update = false;
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
  FakeVllm srv(rig.io, rig.rv, "0.29.0", 1);
  auto admin = rig.admin_for_worker(AdminDialect::kVllm, srv.url());
  srv.fail_init = true;
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
  FakeVllm srv(rig.io, rig.rv, "0.30.0", 1);
  vllm_two_updates(rig, srv, 1);
  EXPECT_EQ(srv.body_of("POST /init_weight_transfer_engine")["init_info"]["master_address"], "127.0.0.1");
}

TEST(AdminVllmCollective, ServerWithoutStartAndFinishIsRefusedBeforeAnyTransferCall) {
  Rig rig;
  FakeVllm srv(rig.io, rig.rv, "0.19.1", 1);
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
  FakeVllm srv(rig.io, rig.rv, "0.26.0", 1);
  auto admin = rig.admin_for_worker(AdminDialect::kVllm, srv.url());
  run(rig.io, [&]() -> asio::awaitable<void> {
    srv.fail_update = true;
    auto r = co_await admin->prepare_weights(collective_update(1, rig.session));
    EXPECT_FALSE(r);
    EXPECT_NE(what(r).find("POST " + srv.url() + "/update_weights: HTTP 500"), std::string::npos) << what(r);
    EXPECT_NE(what(r).find("CUDA out of memory"), std::string::npos) << what(r);
    EXPECT_FALSE(co_await admin->commit_weights(1));  // nothing prepared
    srv.fail_update = false;
    // The open layerwise session ends with the failed server's engine re-initialised.
    EXPECT_EQ(what(co_await admin->prepare_weights(collective_update(2, rig.session))), "ok");
    EXPECT_EQ(what(co_await admin->commit_weights(2)), "ok");
  }());
  EXPECT_TRUE(srv.violations.empty());
  EXPECT_EQ(srv.count("POST /update_weights"), 2);  // not retried
  EXPECT_EQ(srv.init_ports, (std::vector<int>{29500, 29501}));
  EXPECT_EQ(rig.session->log,
            (std::vector<std::string>{"group W 1", "receiving v1 g0", "failed W g0", "receiving aborted", "group W 1",
                                      "receiving v2 g1", "broadcast v2"}));
  EXPECT_NE(rig.session->last_failure.find("HTTP 500"), std::string::npos);
  EXPECT_EQ(srv.weight_version, "2");
}

TEST(AdminVllmCollective, FailedBroadcastFailsThePrepareAndTheServerAnswersOnlyAfterIt) {
  Rig rig;
  FakeVllm srv(rig.io, rig.rv, "0.28.0", 1);
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
  FakeVllm srv(rig.io, rig.rv, "0.28.0", 1, /*weight_info=*/false);
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
  FakeVllm srv(rig.io, rig.rv, "0.28.0", 1);
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
  FakeVllm srv(rig.io, rig.rv, "0.32.0", 1);
  srv.arlo_backend = true;
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
  ASSERT_EQ(srv.streamed.size(), 2u);
  EXPECT_EQ(srv.streamed[1], Json({{"version", 4}, {"weight_sync", block}}));
  EXPECT_EQ(srv.weight_version, "4");
}

// The trainer's publisher serves its newest version: an update asked for v3 that brought v4 is
// finished as v4.
// keep must not clear the KV of the requests it keeps (vLLM clears caches unless told not to).
TEST(AdminVllmStreamed, KeepPausesWithoutClearingTheCache) {
  Rig rig;
  FakeVllm srv(rig.io, rig.rv, "0.32.0", 1);
  auto admin = make_admin_client(AdminDialect::kVllm, rig.client, srv.url(), fast());
  run(rig.io, [&]() -> asio::awaitable<void> {
    for (auto mode : {PauseMode::kKeep, PauseMode::kWait, PauseMode::kAbort})
      EXPECT_EQ(what(co_await admin->pause(mode)), "ok");
  }());
  EXPECT_EQ(srv.pause_targets,
            (std::vector<std::string>{"/pause?mode=keep&clear_cache=false", "/pause?mode=wait", "/pause?mode=abort"}));
}

TEST(AdminVllmStreamed, ANewerVersionReceivedIsTheOneFinished) {
  Rig rig;
  FakeVllm srv(rig.io, rig.rv, "0.32.0", 1);
  srv.arlo_backend = true;
  srv.ahead = 1;
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
  FakeVllm srv(rig.io, rig.rv, "0.32.0", 1);  // vLLM's default backend: NCCL
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

// ---- SGLang ----

TEST(AdminSglangCollective, GroupOncePerGenerationAndFlushOnlyWhenNothingRuns) {
  Rig rig;
  FakeSglang srv(rig.io, rig.rv, 2);
  auto admin = rig.admin_for_worker(AdminDialect::kSglang, srv.url());
  run(rig.io, [&]() -> asio::awaitable<void> {
    srv.running = 3;  // keep: the requests stay in the batch
    EXPECT_EQ(what(co_await admin->pause(PauseMode::kKeep)), "ok");
    EXPECT_EQ(what(co_await admin->prepare_weights(collective_update(1, rig.session))), "ok");
    EXPECT_EQ(what(co_await admin->commit_weights(1)), "ok");
    EXPECT_EQ(what(co_await admin->resume()), "ok");
    EXPECT_EQ(what(co_await admin->pause(PauseMode::kAbort)), "ok");  // aborts the 3
    EXPECT_EQ(what(co_await admin->prepare_weights(collective_update(2, rig.session))), "ok");
    EXPECT_EQ(what(co_await admin->resume()), "ok");
    srv.running = 0;  // wait: arlo drained its dispatcher before pausing
    EXPECT_EQ(what(co_await admin->pause(PauseMode::kWait)), "ok");
    EXPECT_EQ(what(co_await admin->prepare_weights(collective_update(3, rig.session))), "ok");
    EXPECT_EQ(what(co_await admin->resume()), "ok");
    srv.running = 2;  // an update without a pause: requests may run
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
  FakeSglang current(rig.io, rig.rv, 1), legacy(rig.io, rig.rv, 1);
  legacy.legacy = true;
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
  FakeSglang srv(rig.io, rig.rv, 1);
  auto admin = rig.admin_for_worker(AdminDialect::kSglang, srv.url());
  run(rig.io, [&]() -> asio::awaitable<void> {
    srv.refuse_update = true;
    auto r = co_await admin->prepare_weights(collective_update(1, rig.session));
    EXPECT_NE(
        what(r).find(
            "POST " + srv.url() +
            "/update_weights_from_distributed: refused (HTTP 200): Failed to update parameter online: shape mismatch"),
        std::string::npos)
        << what(r);
    srv.refuse_update = false;
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
  FakeSglang srv(rig.io, rig.rv, 1);
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
  FakeSglang srv(rig.io, rig.rv, 1);
  auto admin = make_admin_client(AdminDialect::kSglang, rig.client, srv.url(), fast());
  WeightUpdate good;
  good.version = 8;
  good.extra = {{"model_path", "/runs/x/weights/v8"}};
  WeightUpdate missing = good;
  const WeightUpdate neither;  // neither a session nor a path
  missing.extra = {{"model_path", "/runs/x/weights/v9"}};
  run(rig.io, [&]() -> asio::awaitable<void> {
    srv.running = 1;
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
  FakeSglang srv(rig.io, rig.rv, 1);
  srv.dp_size = 2;
  auto admin = make_admin_client(AdminDialect::kSglang, rig.client, srv.url(), fast());
  run(rig.io, [&]() -> asio::awaitable<void> {
    auto r = co_await admin->prepare_weights(collective_update(1, rig.session));
    EXPECT_NE(what(r).find("dp_size 2 without DP attention"), std::string::npos) << what(r);
  }());
  EXPECT_TRUE(rig.session->log.empty());
}

}  // namespace
}  // namespace arlo::rollout
