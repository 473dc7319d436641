#include "apps/arlo-worker/worker_server.h"

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <future>
#include <mutex>
#include <random>

#include "apps/arlo-worker/openai_api.h"
#include "common/auth.h"
#include "common/log.h"
#include "reference/model_weights.h"
#include "weight_sync/subscriber.h"
#include "weight_sync/transport.h"
#include "weight_sync/wire.h"

namespace arlo::worker {

namespace asio = boost::asio;
using nlohmann::json;
using reference::Generation;

namespace {

// Suspends the calling coroutine until `start(resume)` calls resume(value) from any thread; the
// coroutine continues on `io`. A timer that never expires is the event: resume() posts the value
// to `io` and cancels the timer.
// GCC 12: callers create this awaitable in a statement of its own and co_await the named object,
// so no temporary (the lambda) lives across the suspension.
template <typename T, typename Start>
asio::awaitable<T> wait_for(asio::io_context& io, Start start) {
  struct Event {
    explicit Event(asio::io_context& io) : timer(io, asio::steady_timer::time_point::max()) {}
    asio::steady_timer timer;
    std::optional<T> value;
  };
  auto event = std::make_shared<Event>(io);
  start([&io, event](T value) {
    asio::post(io, [event, value = std::move(value)]() mutable {
      event->value = std::move(value);
      event->timer.cancel();
    });
  });
  while (!event->value) {
    boost::system::error_code ec;
    auto wake = event->timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    co_await std::move(wake);
  }
  co_return std::move(*event->value);
}

http::Response api_error(const ApiError& e) { return http::Response::json(e.status, error_body(e)); }
http::Response api_error(int status, std::string message, std::string type = "invalid_request_error",
                         std::optional<std::string> param = std::nullopt) {
  return api_error(ApiError{status, std::move(message), std::move(param), std::move(type)});
}

std::string random_id(std::string_view prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}", prefix, rng());
}

// Response builders live outside coroutines: GCC 12 mishandles braced initializer lists (as
// nlohmann::json literals use) inside coroutine bodies.
http::Response ready_json(int status, json body) { return http::Response::json(status, body); }
asio::awaitable<http::Response> ready(http::Response r) { co_return r; }
http::Response paused_response(const std::string& mode) { return ready_json(200, {{"paused", true}, {"mode", mode}}); }
http::Response preparing_response(std::int64_t version, bool held) {
  json j = {{"preparing", version}};
  if (held) j["held"] = true;
  return ready_json(200, j);
}
http::Response version_response(std::int64_t version, const std::string& checksum) {
  return ready_json(200, {{"version", version}, {"checksum", checksum}});
}

bool is_address_key(std::string_view key) { return key == "address" || key.ends_with("_address"); }

// The network addresses an endpoint object names ("10.0.0.2:29500"), comma-separated; "" when none.
std::string addresses_of(const json& endpoint) {
  std::string out;
  if (!endpoint.is_object()) return out;
  for (const auto& [key, value] : endpoint.items())
    if (is_address_key(key) && value.is_string() && !value.get_ref<const std::string&>().empty())
      out += (out.empty() ? "" : ", ") + value.get<std::string>();
  return out;
}

// `path` made absolute, with symlinks of its existing part resolved, so ".." and links cannot
// leave an allowed directory.
std::filesystem::path resolved(const std::filesystem::path& path) {
  std::error_code ec;
  auto p = std::filesystem::weakly_canonical(std::filesystem::absolute(path, ec), ec);
  return ec ? std::filesystem::absolute(path).lexically_normal() : p;
}

bool inside(const std::filesystem::path& path, const std::filesystem::path& dir) {
  auto rel = path.lexically_relative(dir);
  return !rel.empty() && *rel.begin() != "..";
}

// Whether the update block `block` (resolved into `o`) names only sources this worker allows (see
// WorkerOptions); the error is the 403 to answer.
std::optional<std::string> refused_source(const json& block, const weight_sync::Options& o, const WorkerOptions& w) {
  const json& own = w.own_block;
  if (own.contains("transport") && own["transport"] != o.transport)
    return fmt::format("this worker takes weights over {} only (its --weight-sync block), not {}",
                       own["transport"].get<std::string>(), o.transport);
  auto d = weight_sync::find_transport(o.transport);
  if (!d) return d.error().message();
  for (const auto& [key, value] : block.items()) {
    if ((*d)->option(key) && own.contains(key) && own[key] != value)
      return fmt::format("'{}' is pinned to {} by this worker's --weight-sync block; the update names {}", key,
                         own[key].dump(), value.dump());
  }
  std::vector<std::filesystem::path> dirs;
  std::vector<std::string> dir_names, hosts;
  for (const auto& entry : w.allow_weights_from) {
    if (entry.starts_with('/')) {
      dirs.push_back(resolved(entry));
      dir_names.push_back(dirs.back().string());
    } else {
      hosts.push_back(entry);
    }
  }
  for (const auto& spec : (*d)->options) {
    // What the request names (defaults are this worker's own).
    if (spec.type != OptionSpec::Type::kString || !block.contains(spec.key) || !o.params.contains(spec.key)) continue;
    const auto& v = o.params[spec.key];
    if (!v.is_string() || v.get_ref<const std::string&>().empty()) continue;
    const std::string value = v.get<std::string>();
    if (own.contains(spec.key) && own[spec.key] == v) continue;  // what the worker was started with
    if (spec.path || value.find('/') != std::string::npos) {     // a file or directory (a library to load, too)
      const auto p = resolved(value);
      if (std::none_of(dirs.begin(), dirs.end(), [&](const auto& dir) { return p == dir || inside(p, dir); }))
        return fmt::format(
            "'{}' {} is outside the directories this worker loads weights from ({}); start it with "
            "--allow-weights-from DIR to allow one",
            spec.key, value,
            dirs.empty() ? std::string("none allowed") : fmt::format("{}", fmt::join(dir_names, ", ")));
    } else if (is_address_key(spec.key)) {
      const std::string host = auth::host_of(value);
      const bool listed = std::any_of(hosts.begin(), hosts.end(), [&](const std::string& h) {
        return h == value || (auth::host_of(h) == h && h == host);
      });
      if (!listed && !(hosts.empty() && auth::is_loopback(host)))
        return fmt::format(
            "'{}' {} is not a host this worker loads weights from ({}); start it with "
            "--allow-weights-from HOST[:PORT] to allow one",
            spec.key, value, hosts.empty() ? std::string("loopback only") : fmt::format("{}", fmt::join(hosts, ", ")));
    }
  }
  return std::nullopt;
}

std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

struct WorkerServer::Impl : std::enable_shared_from_this<Impl> {
  asio::io_context& io;
  WorkerOptions options;
  http::Server server;
  reference::Engine engine;
  metrics::Registry registry;
  std::int64_t started = unix_now();

  // The version served and its checksum (io thread).
  std::optional<std::int64_t> version;
  std::string checksum;

  // One weight transfer at a time (io thread), run on `transfer_thread`.
  struct Transfer {
    std::int64_t requested = 0;
    std::string source;  // "tcp from 10.0.0.2:29500": named with a failure
    bool done = false;
    std::optional<Error> error;
    std::shared_ptr<reference::Model> staged;
    std::int64_t received = 0;
    std::string checksum;
    std::vector<std::function<void()>> waiters;
  };
  std::shared_ptr<Transfer> transfer;
  // The last transfer that failed, until the next prepare: a retried commit (the admin client
  // retries a 5xx) gets the same answer, with the pull's reason, not "nothing was prepared".
  std::shared_ptr<Transfer> failed;
  std::thread transfer_thread;
  // Pulls each version; used on transfer_thread only, one transfer at a time (the io thread touches
  // it only once the previous transfer thread was joined).
  weight_sync::StagingSubscriber subscriber;

  Impl(asio::io_context& io_, http::ServerOptions http_options, WorkerOptions options_)
      : io(io_),
        options(std::move(options_)),
        server(io_, std::move(http_options)),
        engine(options.model, options.engine),
        subscriber(options.weight_sync) {}

  ~Impl() {
    if (transfer_thread.joinable()) transfer_thread.join();
  }

  // ------------------------------------------------------------------ data plane

  asio::awaitable<http::Response> completions(http::Request req, bool chat) {
    auto self = shared_from_this();
    registry.counter(chat ? "worker/requests/chat" : "worker/requests/completions").inc();
    auto body = req.json();
    if (!body) co_return api_error(400, "the request body is not valid JSON: " + body.error().message());
    auto job = parse_completion_request(*body, chat, engine.tokenizer(), options.model.context);
    if (!job) {
      registry.counter("worker/requests/rejected").inc();
      co_return api_error(job.error());
    }
    if (!version)
      co_return api_error(503, "this worker holds no weights yet; it serves after its first weight update",
                          "server_error");
    using Results = std::vector<std::optional<Result<Generation>>>;
    struct Gather {
      std::mutex mu;
      Results results;
      int remaining = 0;
    };
    const int k_total = job->choices();
    auto generate = wait_for<std::shared_ptr<Results>>(io, [this, &job, k_total](auto resume) {
      auto g = std::make_shared<Gather>();
      g->results.resize(static_cast<std::size_t>(k_total));
      g->remaining = k_total;
      auto finish_one = [g, resume](int k, Result<Generation> r) {
        bool last = false;
        {
          std::lock_guard lk(g->mu);
          g->results[static_cast<std::size_t>(k)] = std::move(r);
          last = --g->remaining == 0;
        }
        if (last) resume(std::shared_ptr<Results>(g, &g->results));
      };
      for (int k = 0; k < k_total; ++k) {
        const auto& prompt = job->prompts[static_cast<std::size_t>(k / job->n)];
        auto id = engine.submit(prompt, job->choice_params(k),
                                [finish_one, k](Result<Generation> r) { finish_one(k, std::move(r)); });
        if (!id) finish_one(k, std::unexpected(id.error()));
      }
    });
    std::shared_ptr<Results> results = co_await std::move(generate);
    std::vector<Generation> gens;
    for (auto& r : *results) {
      if (!*r) {
        const Error& e = r->error();
        if (e.code() == ErrorCode::kInvalidArgument) co_return api_error(400, e.message());
        co_return api_error(e.code() == ErrorCode::kCancelled ? 503 : 500, e.what(), "server_error");
      }
      gens.push_back(std::move(**r));
    }
    for (const auto& g : gens) registry.counter("worker/tokens/generated").inc(static_cast<double>(g.tokens.size()));
    co_return http::Response::json(200, completion_response(*job, gens, options.model_name, engine.tokenizer(),
                                                            random_id(chat ? "chatcmpl-" : "cmpl-"), unix_now()));
  }

  http::Response health() const {
    if (!version) return http::Response::json(503, {{"status", "no_weights"}, {"version", nullptr}});
    return http::Response::json(200, {{"status", "ok"}, {"version", *version}, {"model", options.model_name}});
  }

  http::Response models() const {
    json data = json::array();
    data.push_back({{"id", options.model_name},
                    {"object", "model"},
                    {"created", started},
                    {"owned_by", "arlo"},
                    {"max_model_len", options.model.context}});
    return http::Response::json(200, {{"object", "list"}, {"data", data}});
  }

  http::Response metrics_text() {
    auto s = engine.stats();
    registry.gauge("worker/version").set(version ? static_cast<double>(*version) : -1.0);
    registry.gauge("worker/engine/active").set(static_cast<double>(s.active));
    registry.gauge("worker/engine/queued").set(static_cast<double>(s.queued));
    registry.gauge("worker/engine/paused").set(s.paused ? 1.0 : 0.0);
    registry.gauge("worker/engine/steps").set(static_cast<double>(s.steps));
    registry.gauge("worker/engine/requests_finished").set(static_cast<double>(s.requests_finished));
    return http::Response::text(200, registry.prometheus(), "text/plain; version=0.0.4; charset=utf-8");
  }

  // ------------------------------------------------------------------ admin plane

  asio::awaitable<http::Response> pause(http::Request req) {
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

  http::Response resume() {
    engine.resume();
    ARLO_INFO("resumed at version {}", version ? std::to_string(*version) : "none");
    return http::Response::json(200, {{"paused", false}, {"version", version ? json(*version) : json(nullptr)}});
  }

  http::Response weights_info() const {
    return http::Response::json(200, {{"version", version ? json(*version) : json(nullptr)},
                                      {"checksum", version ? json(checksum) : json(nullptr)},
                                      {"preparing", transfer ? json(transfer->requested) : json(nullptr)},
                                      {"paused", engine.paused()}});
  }

  // The weight_sync options of one update: the body's "weight_sync" block (wire.h: the trainer's
  // announcement turned into a receiver block) over this worker's own block (--weight-sync).
  std::expected<weight_sync::Options, ApiError> transfer_options(const json& body) const {
    if (!body.contains("weight_sync") || !body["weight_sync"].is_object())
      return std::unexpected(ApiError{
          400, "'weight_sync' (an object: the weight-sync block, docs/weight-sync.md) is required", "weight_sync"});
    auto o = subscriber.options_for(body["weight_sync"]);
    if (!o) return std::unexpected(ApiError{400, o.error().message(), "weight_sync"});
    o->apply_mode = weight_sync::ApplyMode::kStaging;
    return *o;
  }

  asio::awaitable<http::Response> prepare(http::Request req) {
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

  // The answer to a commit of a transfer that failed: the pull's own reason (what the orchestrator
  // logs and records for this worker).
  http::Response transfer_failed(const Transfer& t) const {
    return api_error(
        500,
        fmt::format("weight update to v{} failed: receiving over {}: {}; still serving {}", t.requested, t.source,
                    t.error->what(), version ? fmt::format("v{}", *version) : std::string("nothing")),
        "server_error");
  }

  asio::awaitable<http::Response> commit(http::Request req) {
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

  // Handlers hold a plain pointer: the server (and its route table) is a member, so a route never
  // outlives this object, and no reference cycle keeps it (and its engine thread) alive forever.
  void routes() {
    Impl* self = this;
    using http::Verb;
    server.route(Verb::post, "/v1/completions",
                 [self](http::Request r) { return self->completions(std::move(r), false); });
    server.route(Verb::post, "/v1/chat/completions",
                 [self](http::Request r) { return self->completions(std::move(r), true); });
    // Handlers that answer at once: computed eagerly, handed back as a ready awaitable.
    auto sync = [self](auto fn) { return [self, fn](http::Request r) { return ready(fn(*self, r)); }; };
    server.route(Verb::get, "/health", sync([](Impl& s, const http::Request&) { return s.health(); }));
    server.route(Verb::get, "/v1/models", sync([](Impl& s, const http::Request&) { return s.models(); }));
    server.route(Verb::get, "/metrics", sync([](Impl& s, const http::Request&) { return s.metrics_text(); }));
    server.route(Verb::post, "/resume", sync([](Impl& s, const http::Request&) { return s.resume(); }));
    server.route(Verb::get, "/weights", sync([](Impl& s, const http::Request&) { return s.weights_info(); }));
    server.route(Verb::post, "/pause", [self](http::Request r) { return self->pause(std::move(r)); });
    server.route(Verb::post, "/weights/prepare", [self](http::Request r) { return self->prepare(std::move(r)); });
    server.route(Verb::post, "/weights/commit", [self](http::Request r) { return self->commit(std::move(r)); });
  }
};

WorkerServer::WorkerServer(asio::io_context& io, http::ServerOptions http_options, WorkerOptions options)
    : impl_(std::make_shared<Impl>(io, std::move(http_options), std::move(options))) {
  impl_->routes();
}

WorkerServer::~WorkerServer() { close(); }

Status WorkerServer::install(std::shared_ptr<reference::Model> model, std::int64_t version) {
  ARLO_ASSIGN_OR_RETURN(auto sum, reference::weights_checksum_hex(*model));
  std::promise<void> applied;
  ARLO_TRY(impl_->engine.set_model(std::move(model), version, [&] { applied.set_value(); }));
  applied.get_future().wait();
  impl_->version = version;
  impl_->checksum = sum;
  return ok();
}

Result<std::uint16_t> WorkerServer::start() { return impl_->server.start(); }

void WorkerServer::close() {
  if (impl_) impl_->server.close();
}

}  // namespace arlo::worker
