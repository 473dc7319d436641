// InferenceServerFake's kVllm personality: vLLM's dev-mode RL routes, with the per-release
// validation its dataclasses do (unknown keys refused) and the layerwise-reload session rules
// (init, then start, update..., finish).
#include <algorithm>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "testing/inference_server_fake.h"

namespace arlo::testing {

namespace asio = boost::asio;

namespace {

http::Response ok(std::string message) { return http::Response::json(200, Json{{"message", std::move(message)}}); }

}  // namespace

// The weight-transfer routes' rules; `s` is the server whose state they read and change.
class InferenceServerFake::VllmRoutes {
 public:
  static http::Response init(InferenceServerFake& s, const Json& b);
  static http::Response start_update(InferenceServerFake& s, const Json& b);
  static asio::awaitable<http::Response> update(InferenceServerFake& s, Json b);
  static http::Response finish(InferenceServerFake& s, const Json& b);
  static http::Response collective_rpc(InferenceServerFake& s, const Json& b);
  static http::Response weight_checker(InferenceServerFake& s, const Json& b);

 private:
  static http::Response init_arlo_backend(InferenceServerFake& s);
  static std::optional<http::Response> check_update(InferenceServerFake& s, const Json& b);
};

void InferenceServerFake::serve_vllm() {
  const std::string& v = options_.vllm_version;
  vllm_minor_ = std::stoi(v.substr(v.find('.') + 1));
  on(http::Verb::get, "/version", [this](Json, http::Request) -> asio::awaitable<http::Response> {
    co_return http::Response::json(200, Json{{"version", options_.vllm_version}});
  });
  on(http::Verb::get, "/get_world_size", [this](Json, http::Request) -> asio::awaitable<http::Response> {
    co_return http::Response::json(200, Json{{"world_size", options_.world_size}});
  });
  on(http::Verb::post, "/pause", [this](Json, http::Request r) -> asio::awaitable<http::Response> {
    paused = true;
    vllm.pause_targets.push_back(r.target);
    co_return http::Response::json(200, Json{{"status", "paused"}});
  });
  on(http::Verb::post, "/resume", [this](Json, http::Request) -> asio::awaitable<http::Response> {
    paused = false;
    co_return http::Response::json(200, Json{{"status", "resumed"}});
  });
  using R = VllmRoutes;
  on(http::Verb::post, "/init_weight_transfer_engine",
     [this](Json b, http::Request) -> asio::awaitable<http::Response> { co_return R::init(*this, b); });
  on(http::Verb::post, "/start_weight_update",
     [this](Json b, http::Request) -> asio::awaitable<http::Response> { co_return R::start_update(*this, b); });
  on(http::Verb::post, "/update_weights", [this](Json b, http::Request) { return R::update(*this, std::move(b)); });
  on(http::Verb::post, "/finish_weight_update",
     [this](Json b, http::Request) -> asio::awaitable<http::Response> { co_return R::finish(*this, b); });
  if (options_.weight_info)
    on(http::Verb::get, "/weight_info", [this](Json, http::Request) -> asio::awaitable<http::Response> {
      co_return http::Response::json(200,
                                     Json{{"weight_version", weight_version.empty() ? Json() : Json(weight_version)}});
    });
  on(http::Verb::post, "/collective_rpc",
     [this](Json b, http::Request) -> asio::awaitable<http::Response> { co_return R::collective_rpc(*this, b); });
  on(http::Verb::post, "/weight_checker",
     [this](Json b, http::Request) -> asio::awaitable<http::Response> { co_return R::weight_checker(*this, b); });
}

http::Response InferenceServerFake::VllmRoutes::init(InferenceServerFake& s, const Json& b) {
  if (!b.is_object() || !b.contains("init_info")) return s.violation("/init_weight_transfer_engine without init_info");
  if (s.vllm.fail_init)
    return http::Response::json(500, Json{{"detail", "NCCL error: unhandled system error (run with NCCL_DEBUG=INFO)"}});
  const Json& info = b["init_info"];
  if (info == Json::object()) return init_arlo_backend(s);
  const std::string& version = s.options_.vllm_version;
  std::set<std::string> want = {"rank_offset", "world_size"};
  if (info.contains("nccl_unique_id_b64")) {
    if (s.vllm_minor_ < 29) return s.violation("nccl_unique_id_b64 sent to vLLM " + version);
    if (s.vllm.refuse_unique_id)  // a release without vllm PR #53784: its dataclass has no such field
      return http::Response::json(
          400, Json{{"detail",
                     "Invalid init_info for NCCLWeightTransferEngine: NCCLWeightTransferInitInfo.__init__() "
                     "got an unexpected keyword argument 'nccl_unique_id_b64'"}});
    if (info.contains("master_address") || info.contains("master_port"))
      return s.violation("both rendezvous modes in init_info");
    want.insert("nccl_unique_id_b64");
  } else {
    want.insert({"master_address", "master_port"});
  }
  if (s.vllm_minor_ >= 28) want.insert({"packed", "packed_buffer_size_bytes", "packed_num_buffers"});
  if (json_keys(info) != want) return s.violation("Invalid init_info for vLLM " + version + ": " + info.dump());
  const int port = info.value("master_port", 0);
  auto& ports = s.vllm.init_ports;
  if (port != 0 && std::find(ports.begin(), ports.end(), port) != ports.end())
    return s.violation("a second init for the group on port " + std::to_string(port));
  if (auto refused = s.group_init(info)) return *refused;
  ports.push_back(port);
  s.engine_ready_ = true;
  s.in_update_ = false;
  return ok("Weight transfer initialized");
}

// arlo's backend takes nothing up front; vLLM's NCCL engine refuses that.
http::Response InferenceServerFake::VllmRoutes::init_arlo_backend(InferenceServerFake& s) {
  if (!s.vllm.arlo_backend)
    return http::Response::json(500, Json{{"error",
                                           {{"message",
                                             "Call to collective_rpc method failed: Worker failed with error "
                                             "'Invalid init_info for NCCLWeightTransferEngine: __init__() missing 4 "
                                             "required positional arguments'"}}}});
  s.engine_ready_ = true;
  return ok("Weight transfer initialized");
}

http::Response InferenceServerFake::VllmRoutes::start_update(InferenceServerFake& s, const Json& b) {
  if (!s.engine_ready_) return s.violation("/start_weight_update before /init_weight_transfer_engine");
  if (s.in_update_) return s.violation("/start_weight_update while an update is open");
  // Handlers that read `await raw_request.json()` answer an empty body with 400.
  if (!b.is_object()) return http::Response::json(400, Json{{"detail", "There was an error parsing the body"}});
  const std::string& version = s.options_.vllm_version;
  if (s.vllm_minor_ >= 28 && !b.empty())
    return s.violation("is_checkpoint_format (removed in 0.28) sent to vLLM " + version + ": " + b.dump());
  if (s.vllm_minor_ < 28 && b != Json{{"is_checkpoint_format", true}})
    return s.violation("/start_weight_update body " + b.dump());
  s.in_update_ = true;
  s.updated_since_start_ = false;
  return ok("Weight update started");
}

asio::awaitable<http::Response> InferenceServerFake::VllmRoutes::update(InferenceServerFake& s, Json b) {
  if (auto refused = check_update(s, b)) co_return *refused;
  if (s.vllm.fail_update)
    co_return http::Response::json(500, Json{{"error", "CUDA out of memory while allocating the receive buffer"}});
  if (!s.vllm.arlo_backend) {  // arlo's backend pulls over its own transport: no broadcast to join
    auto answer = co_await s.weights_request(std::move(b));
    if (answer) co_return *answer;
  }
  s.updated_since_start_ = true;
  co_return ok("Weights updated");
}

std::optional<http::Response> InferenceServerFake::VllmRoutes::check_update(InferenceServerFake& s, const Json& b) {
  if (!s.in_update_) return s.violation("/update_weights without /start_weight_update");
  if (!b.is_object() || !b.contains("update_info")) return s.violation("/update_weights without update_info");
  const Json& info = b["update_info"];
  if (s.vllm.arlo_backend) {
    if (json_keys(info) != std::set<std::string>{"version", "weight_sync"} || !info["version"].is_number_integer() ||
        !info["weight_sync"].is_object())
      return s.violation("Invalid update_info for ArloWeightTransferEngine: " + info.dump());
    s.vllm.streamed.push_back(info);
    return std::nullopt;
  }
  std::set<std::string> want = {"names", "dtype_names", "shapes"};
  if (s.vllm_minor_ < 28) want.insert({"packed", "packed_buffer_size_bytes", "packed_num_buffers"});
  if (json_keys(info) != want)
    return s.violation("Invalid update_info for vLLM " + s.options_.vllm_version + ": " + info.dump());
  if (info["names"] != Json::array({"model.embed_tokens.weight", "lm_head.weight"}) ||
      info["dtype_names"] != Json::array({"bfloat16", "float32"}) || info["shapes"][1] != Json::array({32, 8}))
    return s.violation("update_info lists other tensors: " + info.dump());
  return std::nullopt;
}

http::Response InferenceServerFake::VllmRoutes::finish(InferenceServerFake& s, const Json& b) {
  if (!s.in_update_) return s.violation("/finish_weight_update without /start_weight_update");
  if (!s.updated_since_start_) return s.violation("/finish_weight_update before /update_weights returned");
  s.in_update_ = false;
  if (!b.is_object() || !b.contains("weight_version") || !b["weight_version"].is_string())
    return s.violation("/finish_weight_update without a string weight_version: " + b.dump());
  s.weight_version = b["weight_version"].get<std::string>();
  return ok("Weight update finished");
}

// arlo's backend's report of what each worker loaded.
http::Response InferenceServerFake::VllmRoutes::collective_rpc(InferenceServerFake& s, const Json& b) {
  if (!s.vllm.arlo_backend || b != Json{{"method", "arlo_weights"}}) return s.violation("/collective_rpc " + b.dump());
  const auto& streamed = s.vllm.streamed;
  Json report = streamed.empty() ? Json::object()
                                 : Json{{"version", streamed.back()["version"].get<std::int64_t>() + s.vllm.ahead},
                                        {"checksum", s.vllm.loaded_checksum}};
  return http::Response::json(200, Json{{"results", Json::array({report, report})}});
}

http::Response InferenceServerFake::VllmRoutes::weight_checker(InferenceServerFake& s, const Json& b) {
  if (s.paused) return http::Response::json(409, Json{{"detail", "weight_checker requires an awake, unpaused engine"}});
  const Json& checksums = s.vllm.checksums;
  const std::string action = b.is_object() ? b.value("action", "") : "";
  const Json baseline = b.is_object() ? b.value("baseline", Json::object()) : Json::object();
  if (action == "checksum") return http::Response::json(200, Json{{"checksums", checksums}});
  if (action == "compare") {
    Json mismatches = Json::array();
    for (const auto& [name, hex] : checksums.items())
      if (baseline.value(name, "") != hex) mismatches.push_back(name);
    return http::Response::json(200, Json{{"match", mismatches.empty()}, {"mismatches", mismatches}});
  }
  return s.violation("/weight_checker action " + b.dump());
}

}  // namespace arlo::testing
