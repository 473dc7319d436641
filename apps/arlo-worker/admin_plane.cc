// arlo-worker's admin plane (worker_server.h): pause, resume and weight updates (prepare pulls a
// version through the worker's weight_sync::StagingSubscriber on a thread of its own, commit installs
// it at the next token boundary), GET /weights.
#include <fmt/format.h>

#include "apps/arlo-worker/weight_sources.h"
#include "apps/arlo-worker/worker_impl.h"
#include "common/log.h"
#include "reference/model_weights.h"
#include "weight_sync/wire.h"

namespace arlo::worker {

namespace {

// Response builders live outside coroutines: GCC 12 mishandles braced initializer lists (as
// nlohmann::json literals use) inside coroutine bodies.
http::Response ready_json(int status, json body) { return http::Response::json(status, body); }
http::Response paused_response(const std::string& mode) { return ready_json(200, {{"paused", true}, {"mode", mode}}); }
http::Response preparing_response(std::int64_t version, bool held) {
  json j = {{"preparing", version}};
  if (held) j["held"] = true;
  return ready_json(200, j);
}
http::Response version_response(std::int64_t version, const std::string& checksum) {
  return ready_json(200, {{"version", version}, {"checksum", checksum}});
}

}  // namespace

asio::awaitable<http::Response> WorkerServer::Impl::pause(http::Request req) {
  auto self = shared_from_this();
  const std::string mode_text = req.query_param("mode").value_or("keep");
  auto mode = arlo::parse_pause_mode(mode_text);
  if (!mode)
    co_return api_error(400, fmt::format("unknown pause mode '{}': use keep, wait or abort", mode_text),
                        "invalid_request_error", "mode");
  auto paused = wait_for<bool>(io, [this, m = *mode](auto resume) { engine.pause(m, [resume] { resume(true); }); });
  co_await std::move(paused);
  ARLO_INFO("paused (mode {})", mode_text);
  co_return paused_response(mode_text);
}

http::Response WorkerServer::Impl::resume() {
  engine.resume();
  ARLO_INFO("resumed at version {}", version ? std::to_string(*version) : "none");
  return http::Response::json(200, {{"paused", false}, {"version", version ? json(*version) : json(nullptr)}});
}

http::Response WorkerServer::Impl::weights_info() const {
  return http::Response::json(200, {{"version", version ? json(*version) : json(nullptr)},
                                    {"checksum", version ? json(checksum) : json(nullptr)},
                                    {"preparing", transfer ? json(transfer->requested) : json(nullptr)},
                                    {"paused", engine.paused()}});
}

std::expected<weight_sync::Options, ApiError> WorkerServer::Impl::transfer_options(const json& body) const {
  if (!body.contains("weight_sync") || !body["weight_sync"].is_object())
    return std::unexpected(ApiError{
        400, "'weight_sync' (an object: the weight-sync block, docs/weight-sync.md) is required", "weight_sync"});
  auto o = subscriber.options_for(body["weight_sync"]);
  if (!o) return std::unexpected(ApiError{400, o.error().message(), "weight_sync"});
  o->apply_mode = weight_sync::ApplyMode::kStaging;
  return *o;
}

asio::awaitable<http::Response> WorkerServer::Impl::prepare(http::Request req) {
  auto self = shared_from_this();
  auto body = req.json();
  if (!body) co_return api_error(400, "the request body is not valid JSON: " + body.error().message());
  if (!body->is_object() || !body->contains("version") || !(*body)["version"].is_number_integer() ||
      (*body)["version"].get<std::int64_t>() < 0)
    co_return api_error(400, "'version' (a non-negative integer) is required", "invalid_request_error", "version");
  const std::int64_t requested = (*body)["version"].get<std::int64_t>();
  if (transfer && !transfer->done) {
    if (transfer->requested == requested) co_return preparing_response(requested, false);
    co_return api_error(409, fmt::format("a transfer of version {} is in progress", transfer->requested),
                        "conflict_error");
  }
  // Already there, or past it (a durable transport hands out the newest version, so an update
  // asked for v may have brought v+1): nothing to move; the commit reports what is held.
  if (version && *version >= requested && !transfer) co_return preparing_response(*version, true);
  auto opts = transfer_options(*body);
  if (!opts) co_return api_error(opts.error());
  if (auto why = refused_source((*body)["weight_sync"], *opts, options)) {
    registry.counter("worker/weights/refused").inc();
    ARLO_WARN("refused a weight update to v{}: {}", requested, *why);
    co_return api_error(403, "weight source refused: " + *why, "permission_error", "weight_sync");
  }
  opts->peer_name = opts->peer_name.empty() ? "arlo-worker" : opts->peer_name;

  // Staging copy of what is served now: the base for delta payloads, discarded on failure.
  std::shared_ptr<reference::Model> staged;
  if (auto current = engine.model()) {
    staged = current->clone();
  } else {
    auto fresh = reference::Model::init(options.model, 0);
    if (!fresh) co_return api_error(500, fresh.error().what(), "server_error");
    staged = *fresh;
  }
  if (transfer_thread.joinable()) transfer_thread.join();  // the previous transfer finished
  failed.reset();
  auto t = std::make_shared<Transfer>();
  t->requested = requested;
  transfer = t;
  subscriber.assume_version(version);  // what a subscriber for a new block starts from
  const std::string from = addresses_of(opts->params);
  t->source = opts->transport + (from.empty() ? "" : " from " + from);
  transfer_thread = std::thread([self, t, staged, o = *opts, requested, from] {
    Result<weight_sync::Pulled> got = make_error(ErrorCode::kInternal, "not run");
    auto& sub = self->subscriber;
    if (auto st = sub.use(o); !st) {
      got = std::unexpected(st.error());
    } else {
      // Where it comes from and, in a chain, where this worker serves the next one.
      const std::string relay = o.relay ? addresses_of(sub.relay_endpoint()) : std::string();
      ARLO_INFO("receiving weights v{} over {}{}{}", requested, o.transport, from.empty() ? "" : " from " + from,
                relay.empty() ? "" : ", relaying at " + relay);
      reference::ModelWeights sink(*staged);
      got = sub.pull(sink, weight_sync::deadline_in(o.timeout));
    }
    asio::post(self->io, [self, t, staged, got = std::move(got)] {
      t->done = true;
      if (got) {
        const auto& r = got->report;
        t->received = r.version;
        t->staged = staged;
        t->checksum = weight_sync::checksum_hex(got->checksum);
        ARLO_INFO("received weights v{} ({} buckets, {} wire bytes, {:.3f}s)", r.version, r.buckets, r.wire_bytes,
                  r.seconds);
      } else {
        t->error = got.error();
        ARLO_WARN("weight transfer of v{} over {} failed: {}", t->requested, t->source, got.error().what());
      }
      for (auto& w : t->waiters) w();
      t->waiters.clear();
    });
  });
  co_return preparing_response(requested, false);
}

http::Response WorkerServer::Impl::transfer_failed(const Transfer& t) const {
  return api_error(
      500,
      fmt::format("weight update to v{} failed: receiving over {}: {}; still serving {}", t.requested, t.source,
                  t.error->what(), version ? fmt::format("v{}", *version) : std::string("nothing")),
      "server_error");
}

asio::awaitable<http::Response> WorkerServer::Impl::commit(http::Request req) {
  auto self = shared_from_this();
  std::optional<std::int64_t> requested;
  if (!req.body.empty()) {
    auto body = req.json();
    if (!body) co_return api_error(400, "the request body is not valid JSON: " + body.error().message());
    if (body->is_object() && body->contains("version") && (*body)["version"].is_number_integer())
      requested = (*body)["version"].get<std::int64_t>();
  }
  if (!transfer) {
    if (version && (!requested || *requested <= *version))  // a retried commit that already applied
      co_return version_response(*version, checksum);
    if (failed && (!requested || *requested == failed->requested))  // a retried commit of a failed transfer
      co_return transfer_failed(*failed);
    co_return api_error(409, "no weight transfer was prepared: POST /weights/prepare first", "conflict_error");
  }
  auto t = transfer;
  if (requested && *requested != t->requested)
    co_return api_error(409, fmt::format("version {} was prepared, not {}", t->requested, *requested),
                        "conflict_error");
  if (!t->done) {
    auto received = wait_for<bool>(io, [t](auto resume) { t->waiters.push_back([resume] { resume(true); }); });
    co_await std::move(received);
  }
  if (transfer == t) transfer.reset();
  if (t->error) {
    if (failed != t) registry.counter("worker/weights/failed").inc();
    failed = t;
    co_return transfer_failed(*t);
  }
  if (t->received < t->requested)
    co_return api_error(500, fmt::format("received v{} but v{} was prepared", t->received, t->requested),
                        "server_error");
  Status st = ok();
  auto applied = wait_for<bool>(io, [this, t, &st](auto resume) {
    st = engine.set_model(t->staged, t->received, [resume] { resume(true); });
    if (!st) resume(false);
  });
  co_await std::move(applied);
  if (!st) co_return api_error(500, st.error().what(), "server_error");
  version = t->received;
  checksum = t->checksum;
  registry.counter("worker/weights/updates").inc();
  ARLO_INFO("serving weights v{} (checksum {})", *version, checksum);
  co_return version_response(*version, checksum);
}

}  // namespace arlo::worker
