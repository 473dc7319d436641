// arlo-worker's server (worker_server.h): the route table of its two planes, serving.cc (data) and
// admin_plane.cc (admin), and its start and stop.
#include "apps/arlo-worker/worker_server.h"

#include <future>

#include "apps/arlo-worker/worker_impl.h"
#include "reference/model_weights.h"

namespace arlo::worker {

namespace {

asio::awaitable<http::Response> ready(http::Response r) { co_return r; }

}  // namespace

// Handlers hold a plain pointer: the server (and its route table) is a member, so a route never
// outlives this object, and no reference cycle keeps it (and its engine thread) alive forever.
void WorkerServer::Impl::routes() {
  Impl* self = this;
  using http::Verb;
  server.route(Verb::post, "/v1/completions",
               [self](http::Request r) { return self->completions(std::move(r), false); });
  server.route(Verb::post, "/v1/chat/completions",
               [self](http::Request r) { return self->completions(std::move(r), true); });
  // Handlers that answer at once: computed eagerly, handed back as a ready awaitable.
  auto sync = [self](auto fn) { return [self, fn](http::Request r) { return ready(fn(*self, r)); }; };
  server.route(Verb::get, "/health", sync([](Impl& s, const http::Request&) { return s.health(); }));
  server.route(Verb::post, "/tokenize", sync([](Impl& s, const http::Request& r) {
                 auto body = r.json();
                 if (!body) return api_error(400, "the request body is not valid JSON: " + body.error().message());
                 auto out = tokenize_request(*body, s.engine.tokenizer(), s.options.model.context);
                 return out ? http::Response::json(200, *out) : api_error(out.error());
               }));
  server.route(Verb::get, "/v1/models", sync([](Impl& s, const http::Request&) { return s.models(); }));
  server.route(Verb::get, "/metrics", sync([](Impl& s, const http::Request&) { return s.metrics_text(); }));
  server.route(Verb::post, "/resume", sync([](Impl& s, const http::Request&) { return s.resume(); }));
  server.route(Verb::get, "/weights", sync([](Impl& s, const http::Request&) { return s.weights_info(); }));
  server.route(Verb::post, "/pause", [self](http::Request r) { return self->pause(std::move(r)); });
  server.route(Verb::post, "/weights/prepare", [self](http::Request r) { return self->prepare(std::move(r)); });
  server.route(Verb::post, "/weights/commit", [self](http::Request r) { return self->commit(std::move(r)); });
}

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
