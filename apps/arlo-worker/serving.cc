// arlo-worker's data plane (worker_server.h): the OpenAI-facing routes (completions, chat
// completions, models) and /health, /metrics.
#include <fmt/format.h>

#include <mutex>
#include <random>

#include "apps/arlo-worker/worker_impl.h"

namespace arlo::worker {

using reference::Generation;

namespace {

std::string random_id(std::string_view prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}", prefix, rng());
}

}  // namespace

asio::awaitable<http::Response> WorkerServer::Impl::completions(http::Request req, bool chat) {
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

http::Response WorkerServer::Impl::health() const {
  if (!version) return http::Response::json(503, {{"status", "no_weights"}, {"version", nullptr}});
  return http::Response::json(200, {{"status", "ok"}, {"version", *version}, {"model", options.model_name}});
}

http::Response WorkerServer::Impl::models() const {
  json data = json::array();
  data.push_back({{"id", options.model_name},
                  {"object", "model"},
                  {"created", started},
                  {"owned_by", "arlo"},
                  {"max_model_len", options.model.context}});
  return http::Response::json(200, {{"object", "list"}, {"data", data}});
}

http::Response WorkerServer::Impl::metrics_text() {
  auto s = engine.stats();
  registry.gauge("worker/version").set(version ? static_cast<double>(*version) : -1.0);
  registry.gauge("worker/engine/active").set(static_cast<double>(s.active));
  registry.gauge("worker/engine/queued").set(static_cast<double>(s.queued));
  registry.gauge("worker/engine/paused").set(s.paused ? 1.0 : 0.0);
  registry.gauge("worker/engine/steps").set(static_cast<double>(s.steps));
  registry.gauge("worker/engine/requests_finished").set(static_cast<double>(s.requests_finished));
  return http::Response::text(200, registry.prometheus(), "text/plain; version=0.0.4; charset=utf-8");
}

}  // namespace arlo::worker
