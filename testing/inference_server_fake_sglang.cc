// InferenceServerFake's kSglang personality: SGLang's weight-update routes, a group per group_name,
// updates that assert (here: a violation) when the cache is flushed with requests running, and
// {"success": false} answers on refusal.
#include <string>
#include <utility>

#include <fmt/format.h>

#include "testing/inference_server_fake.h"

namespace arlo::testing {

namespace asio = boost::asio;

namespace {

std::string field(const Json& b, const char* key) { return b.is_object() ? b.value(key, "") : ""; }

bool flushes(const Json& b) { return !b.is_object() || b.value("flush_cache", true); }

}  // namespace

// The routes with rules; `s` is the server whose state they read and change.
class InferenceServerFake::SglangRoutes {
 public:
  static void serve_state(InferenceServerFake& s);
  static void serve_version(InferenceServerFake& s);
  static http::Response init_group(InferenceServerFake& s, const Json& b);
  static asio::awaitable<http::Response> update_from_group(InferenceServerFake& s, Json b);
  static http::Response update_from_disk(InferenceServerFake& s, const Json& b);
};

void InferenceServerFake::serve_sglang() {
  using R = SglangRoutes;
  R::serve_state(*this);
  on(http::Verb::post, "/destroy_weights_update_group",
     [this](Json b, http::Request) -> asio::awaitable<http::Response> {
       if (!groups_.erase(field(b, "group_name"))) co_return violation("destroy of an unknown group " + b.dump());
       co_return http::Response::json(200, Json{{"success", true}, {"message", "destroyed"}});
     });
  on(http::Verb::post, "/init_weights_update_group",
     [this](Json b, http::Request) -> asio::awaitable<http::Response> { co_return R::init_group(*this, b); });
  on(http::Verb::post, "/update_weights_from_distributed",
     [this](Json b, http::Request) { return R::update_from_group(*this, std::move(b)); });
  on(http::Verb::post, "/update_weights_from_disk",
     [this](Json b, http::Request) -> asio::awaitable<http::Response> { co_return R::update_from_disk(*this, b); });
  R::serve_version(*this);
}

// Server info, pause and continue.
void InferenceServerFake::SglangRoutes::serve_state(InferenceServerFake& s) {
  s.on(http::Verb::get, "/get_server_info", [&s](Json, http::Request) -> asio::awaitable<http::Response> {
    co_return http::Response::json(
        200,
        Json{{"tp_size", s.options_.world_size}, {"dp_size", s.sglang.dp_size}, {"pp_size", 1}, {"version", "0.5.9"}});
  });
  s.on(http::Verb::post, "/pause_generation", [&s](Json b, http::Request) -> asio::awaitable<http::Response> {
    const std::string mode = field(b, "mode");
    if (mode == "abort")
      s.sglang.running = 0;
    else if (mode != "in_place")
      co_return s.violation("pause mode " + b.dump());
    s.paused = true;
    co_return http::Response::json(200, Json{{"message", "paused"}});
  });
  s.on(http::Verb::post, "/continue_generation", [&s](Json, http::Request) -> asio::awaitable<http::Response> {
    s.paused = false;
    co_return http::Response::json(200, Json{{"message", "continued"}});
  });
}

// Current SGLang: the version is in /model_info; the old routes answer 404 (FastAPI's HTTPException
// body). A legacy server has no /model_info.
void InferenceServerFake::SglangRoutes::serve_version(InferenceServerFake& s) {
  s.on(http::Verb::post, "/update_weight_version", [&s](Json b, http::Request) -> asio::awaitable<http::Response> {
    s.weight_version = field(b, "new_version");
    co_return http::Response::json(200, Json{{"success", true}, {"new_version", s.weight_version}});
  });
  s.on(http::Verb::get, "/model_info", [&s](Json, http::Request) -> asio::awaitable<http::Response> {
    if (s.sglang.legacy) co_return http::Response::json(404, Json{{"detail", "Not Found"}});
    co_return http::Response::json(
        200, Json{{"model_path", "Qwen/Qwen3-1.7B"}, {"is_generation", true}, {"weight_version", s.weight_version}});
  });
  for (const char* route : {"/get_weight_version", "/weight_version"})
    s.on(http::Verb::get, route, [&s, route](Json, http::Request) -> asio::awaitable<http::Response> {
      if (s.sglang.legacy) co_return http::Response::json(200, Json{{"weight_version", s.weight_version}});
      co_return http::Response::json(
          404, Json{{"detail", fmt::format("Endpoint '{}' is deprecated. Please use '/model_info' instead.", route)}});
    });
}

http::Response InferenceServerFake::SglangRoutes::init_group(InferenceServerFake& s, const Json& b) {
  const std::set<std::string> want = {"master_address", "master_port", "rank_offset",
                                      "world_size",     "group_name",  "backend"};
  if (json_keys(b) != want || field(b, "backend") != "nccl")
    return s.violation("init_weights_update_group body " + b.dump());
  const std::string name = field(b, "group_name");
  if (s.groups_.count(name)) return s.violation("a second init of group " + b["group_name"].dump());
  if (auto refused = s.group_init(b)) return *refused;
  s.groups_.insert(name);
  return http::Response::json(200,
                              Json{{"success", true}, {"message", "Succeeded to initialize custom process group."}});
}

asio::awaitable<http::Response> InferenceServerFake::SglangRoutes::update_from_group(InferenceServerFake& s, Json b) {
  if (!s.groups_.count(field(b, "group_name")))
    co_return s.violation("update for an unknown group " + field(b, "group_name"));
  if (b["names"] != Json::array({"model.embed_tokens.weight", "lm_head.weight"}) ||
      b["dtypes"] != Json::array({"bfloat16", "float32"}))
    co_return s.violation("update lists other tensors: " + b.dump());
  if (flushes(b) && s.sglang.running > 0) co_return s.violation("flush_cache with running requests (SGLang asserts)");
  if (s.sglang.refuse_update)
    co_return http::Response::json(
        200, Json{{"success", false}, {"message", "Failed to update parameter online: shape mismatch"}});
  const std::string version = field(b, "weight_version");
  auto answer = co_await s.weights_request(std::move(b));
  if (answer) co_return *answer;
  s.weight_version = version;
  co_return http::Response::json(200, Json{{"success", true}, {"message", "Succeeded to update parameter online."}});
}

http::Response InferenceServerFake::SglangRoutes::update_from_disk(InferenceServerFake& s, const Json& b) {
  if (flushes(b) && s.sglang.running > 0) return s.violation("flush_cache with running requests (SGLang asserts)");
  if (field(b, "model_path") != "/runs/x/weights/v8")
    return http::Response::json(
        400, Json{{"success", false}, {"message", "model_path does not exist"}, {"num_paused_requests", 0}});
  s.weight_version = field(b, "weight_version");
  return http::Response::json(
      200, Json{{"success", true}, {"message", "Succeeded to update model weights."}, {"num_paused_requests", 0}});
}

}  // namespace arlo::testing
