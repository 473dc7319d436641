#pragma once
// arlo-worker's server inside (worker_server.h is its face): the state both planes share and the
// helpers of their handlers. serving.cc is the data plane (OpenAI-facing routes), admin_plane.cc the
// admin plane (pause, resume, weight updates), weight_sources.cc which update sources a worker
// takes, worker_server.cc the route table. Internal to arlo-worker.
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <expected>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "apps/arlo-worker/openai_api.h"
#include "apps/arlo-worker/worker_server.h"
#include "weight_sync/subscriber.h"

namespace arlo::worker {

namespace asio = boost::asio;
using nlohmann::json;

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

inline http::Response api_error(const ApiError& e) { return http::Response::json(e.status, error_body(e)); }
inline http::Response api_error(int status, std::string message, std::string type = "invalid_request_error",
                                std::optional<std::string> param = std::nullopt) {
  return api_error(ApiError{status, std::move(message), std::move(param), std::move(type)});
}

inline std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

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

  // The data plane, OpenAI-facing (serving.cc).
  asio::awaitable<http::Response> completions(http::Request req, bool chat);
  http::Response health() const;
  http::Response models() const;
  http::Response metrics_text();

  // The admin plane: pause, resume and weight updates (admin_plane.cc).
  asio::awaitable<http::Response> pause(http::Request req);
  http::Response resume();
  http::Response weights_info() const;
  // The weight_sync options of one update: the body's "weight_sync" block (wire.h: the trainer's
  // announcement turned into a receiver block) over this worker's own block (--weight-sync).
  std::expected<weight_sync::Options, ApiError> transfer_options(const json& body) const;
  asio::awaitable<http::Response> prepare(http::Request req);
  // The answer to a commit of a transfer that failed: the pull's own reason (what the orchestrator
  // logs and records for this worker).
  http::Response transfer_failed(const Transfer& t) const;
  asio::awaitable<http::Response> commit(http::Request req);

  // The route table of both planes (worker_server.cc).
  void routes();
};

}  // namespace arlo::worker
