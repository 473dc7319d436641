// InferenceServerFake's kArlo personality: arlo-worker's admin plane (apps/arlo-worker/admin_plane.cc)
// with its bodies and refusals. A pause takes a mode (keep, wait, abort); a prepare checks the
// version and the weight-sync block and stages the version, a commit installs what was prepared, and
// the completions then carry it. The transfer itself is not modelled: a prepared version has arrived
// by its commit, unless arlo.fail_transfer says the transfer failed.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "testing/inference_server_fake.h"

namespace arlo::testing {

namespace asio = boost::asio;

namespace {

http::Response refused(int status, std::string message, const char* type = "invalid_request_error") {
  return http::Response::error(status, std::move(message), type);
}

}  // namespace

// The weight routes' rules; `s` is the server whose state they read and change.
class InferenceServerFake::ArloRoutes {
 public:
  static http::Response pause(InferenceServerFake& s, const http::Request& r);
  static http::Response prepare(InferenceServerFake& s, const Json& b);
  static http::Response commit(InferenceServerFake& s, const Json& b);
  static http::Response held(const InferenceServerFake& s) {
    return http::Response::json(200, Json{{"version", s.version}, {"checksum", s.arlo.checksum}});
  }
};

void InferenceServerFake::serve_arlo() {
  using R = ArloRoutes;
  on(http::Verb::post, "/pause",
     [this](Json, http::Request r) -> asio::awaitable<http::Response> { co_return R::pause(*this, r); });
  on(http::Verb::post, "/resume", [this](Json, http::Request) -> asio::awaitable<http::Response> {
    paused = false;
    co_return http::Response::json(200, Json{{"paused", false}, {"version", version}});
  });
  on(http::Verb::get, "/weights", [this](Json, http::Request) -> asio::awaitable<http::Response> {
    co_return http::Response::json(200, Json{{"version", version},
                                             {"checksum", arlo.checksum},
                                             {"preparing", arlo.preparing ? Json(*arlo.preparing) : Json()},
                                             {"paused", paused}});
  });
  on(http::Verb::post, "/weights/prepare",
     [this](Json b, http::Request) -> asio::awaitable<http::Response> { co_return R::prepare(*this, b); });
  on(http::Verb::post, "/weights/commit",
     [this](Json b, http::Request) -> asio::awaitable<http::Response> { co_return R::commit(*this, b); });
}

http::Response InferenceServerFake::ArloRoutes::pause(InferenceServerFake& s, const http::Request& r) {
  const std::string mode = r.query_param("mode").value_or("keep");
  if (mode != "keep" && mode != "wait" && mode != "abort")
    return refused(400, fmt::format("unknown pause mode '{}': use keep, wait or abort", mode));
  s.paused = true;
  return http::Response::json(200, Json{{"paused", true}, {"mode", mode}});
}

http::Response InferenceServerFake::ArloRoutes::prepare(InferenceServerFake& s, const Json& b) {
  if (!b.is_object() || !b.contains("version") || !b["version"].is_number_integer() ||
      b["version"].get<std::int64_t>() < 0)
    return refused(400, "'version' (a non-negative integer) is required");
  const std::int64_t requested = b["version"].get<std::int64_t>();
  if (s.arlo.preparing) {
    if (*s.arlo.preparing == requested) return http::Response::json(200, Json{{"preparing", requested}});
    return refused(409, fmt::format("a transfer of version {} is in progress", *s.arlo.preparing), "conflict_error");
  }
  if (s.version >= requested) return http::Response::json(200, Json{{"preparing", s.version}, {"held", true}});
  if (!b.contains("weight_sync") || !b["weight_sync"].is_object())
    return refused(400, "'weight_sync' (an object: the weight-sync block, docs/weight-sync.md) is required");
  s.arlo.preparing = requested;
  return http::Response::json(200, Json{{"preparing", requested}});
}

http::Response InferenceServerFake::ArloRoutes::commit(InferenceServerFake& s, const Json& b) {
  std::optional<std::int64_t> requested;
  if (b.is_object() && b.contains("version") && b["version"].is_number_integer())
    requested = b["version"].get<std::int64_t>();
  if (!s.arlo.preparing) {
    if (!requested || *requested <= s.version) return held(s);  // a retried commit that already applied
    return refused(409, "no weight transfer was prepared: POST /weights/prepare first", "conflict_error");
  }
  const std::int64_t prepared = *s.arlo.preparing;
  if (requested && *requested != prepared)
    return refused(409, fmt::format("version {} was prepared, not {}", prepared, *requested), "conflict_error");
  s.arlo.preparing.reset();
  if (s.arlo.fail_transfer)
    return refused(
        500,
        fmt::format("weight update to v{} failed: receiving: injected failure; still serving v{}", prepared, s.version),
        "server_error");
  s.version = prepared;
  return held(s);
}

}  // namespace arlo::testing
