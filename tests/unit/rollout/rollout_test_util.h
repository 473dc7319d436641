#pragma once
// Helpers for rollout tests: run a coroutine to completion on an io_context, a one-shot event, and
// a small OpenAI-compatible server on a real loopback socket (common/http.h Server).
#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/http.h"
#include "rollout/types.h"

namespace arlo::rollout::test {

namespace asio = boost::asio;
using namespace std::chrono_literals;

// Runs `body` on `io` on this thread until it completes; a body still running after `limit` fails the
// test instead of hanging it.
inline void run(asio::io_context& io, asio::awaitable<void> body,
                std::chrono::seconds limit = std::chrono::seconds(60)) {
  bool done = false;
  std::exception_ptr error;
  asio::co_spawn(io, std::move(body), [&](std::exception_ptr e) {
    error = e;
    done = true;
  });
  const auto deadline = std::chrono::steady_clock::now() + limit;
  io.restart();
  while (!done && std::chrono::steady_clock::now() < deadline) {
    io.run_one_for(std::chrono::milliseconds(50));
    if (io.stopped()) io.restart();
  }
  ASSERT_TRUE(done) << "test coroutine did not finish within the limit";
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      FAIL() << "test coroutine threw: " << e.what();
    }
  }
}

// Drains remaining handlers (server shutdowns, abandoned timers) without blocking forever.
// The arithmetic task the reward-plugin tests score ("23+45=", answer "68") and a group of
// completions of it, one per text.
inline Task task() {
  Task t;
  t.id = "t-7";
  t.prompt = "23+45=";
  t.answer = "68";
  return t;
}

inline std::vector<Rollout> group(std::initializer_list<const char*> texts) {
  std::vector<Rollout> out;
  int i = 0;
  for (const char* t : texts) {
    Rollout r;
    r.task_id = "t-7";
    r.sample_index = i++;
    r.completion_text = t;
    out.push_back(r);
  }
  return out;
}

inline void drain(asio::io_context& io) {
  io.restart();
  for (int i = 0; i < 200 && io.poll() > 0; ++i) {
  }
}

// One-shot event: wait() completes once set() was called (before or after the wait started).
class Event {
 public:
  explicit Event(asio::io_context& io) : timer_(io, std::chrono::steady_clock::time_point::max()) {}
  void set() {
    set_ = true;
    timer_.cancel();
  }
  bool is_set() const { return set_; }
  asio::awaitable<void> wait() {
    while (!set_) {
      boost::system::error_code ec;
      co_await timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
  }

 private:
  asio::steady_timer timer_;
  bool set_ = false;
};

inline asio::awaitable<void> sleep_for(std::chrono::steady_clock::duration d) {
  asio::steady_timer t(co_await asio::this_coro::executor, d);
  boost::system::error_code ec;
  co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
}

// Polls `cond` on the loop every 5 ms until it holds or `limit` passes; returns whether it held.
// Used where the awaited state change happens inside the code under test (e.g. a health probe).
inline asio::awaitable<bool> eventually(std::function<bool()> cond,
                                        std::chrono::seconds limit = std::chrono::seconds(20)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!cond()) {
    if (std::chrono::steady_clock::now() >= end) co_return false;
    co_await sleep_for(5ms);
  }
  co_return true;
}

// An OpenAI-compatible completions server answering "echo:<prompt>" with token ids = the prompt's
// bytes, logprobs -0.5 per token, and version spans [[version, 0]]. When `hold` is set, completion
// requests are parked (counted in `held`) until release_all() or close().
class FakeOpenAIServer {
 public:
  explicit FakeOpenAIServer(asio::io_context& io, std::uint16_t port = 0) : io_(io), release_(io) { start(port); }
  ~FakeOpenAIServer() { close(); }

  void start(std::uint16_t port) {
    http::ServerOptions o;
    o.port = port;
    o.stop_grace = 100ms;
    server_ = std::make_unique<http::Server>(io_, o);
    server_->route(http::Verb::get, "/health", [this](http::Request) -> asio::awaitable<http::Response> {
      ++health_calls;
      if (health_delay.count() > 0) {  // a slow (or, past the client's timeout, silent) health check
        asio::steady_timer t(io_, health_delay);
        boost::system::error_code ec;
        co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      }
      if (health_status != 200)
        co_return http::Response::error(health_status, "injected health failure", "server_error");
      co_return http::Response::json(200, {{"status", "ok"}, {"version", version}});
    });
    auto completions = [this](http::Request req) -> asio::awaitable<http::Response> {
      ++received;
      auto body = req.json();
      if (!body) co_return http::Response::error(400, body.error().what());
      if (fail_with_status) co_return http::Response::error(fail_with_status, "injected failure", "server_error");
      if (answer_delay.count() > 0) {  // a slow server: every completion takes this long
        asio::steady_timer t(io_, answer_delay);
        boost::system::error_code ec;
        co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      }
      if (hold) {
        ++held;
        if (on_held) on_held();
        co_await release_.wait();
        if (closed_) co_return http::Response::error(503, "closed");
      }
      ++answered;
      co_return http::Response::json(200, answer(*body));
    };
    server_->route(http::Verb::post, "/v1/completions", completions);
    auto port_or = server_->start();
    if (!port_or) throw std::runtime_error(port_or.error().what());
    port_ = *port_or;
    closed_ = false;
  }

  Json answer(const Json& body) const {
    std::string prompt =
        body.value("prompt", Json("")).is_string() ? body["prompt"].get<std::string>() : body["prompt"].dump();
    const int n = body.value("n", 1);
    Json choices = Json::array();
    for (int i = 0; i < n; ++i) {
      std::string text = "echo:" + prompt;
      Json ids = Json::array(), lps = Json::array();
      for (unsigned char c : text) {
        ids.push_back(static_cast<int>(c));
        lps.push_back(-0.5);
      }
      choices.push_back({{"index", i},
                         {"text", text},
                         {"token_ids", ids},
                         {"logprobs", {{"token_logprobs", lps}}},
                         {"finish_reason", "stop"},
                         {"version_spans", Json::array({Json::array({version, 0})})}});
    }
    return {{"id", "cmpl-test"}, {"model", "fake"}, {"prompt_token_ids", Json::array({1, 2, 3})}, {"choices", choices}};
  }

  // Simulates a crash: listener and every connection closed at once; parked requests are dropped.
  void close() {
    if (!server_) return;
    closed_ = true;
    server_->close();
    release_.set();
    // Keep the closed server object until this fake goes away: its connection coroutines may still
    // be queued on the io_context.
    graveyard_.push_back(std::move(server_));
  }
  void release_all() { release_.set(); }

  std::uint16_t port() const { return port_; }
  std::string url() const { return fmt::format("http://127.0.0.1:{}", port_); }

  int received = 0;
  int answered = 0;
  int held = 0;
  int health_calls = 0;
  bool hold = false;
  int fail_with_status = 0;
  int health_status = 200;                    // what GET /health answers
  std::chrono::milliseconds health_delay{0};  // GET /health answers after this long
  std::chrono::milliseconds answer_delay{0};  // completions answer after this long
  std::int64_t version = 0;
  std::function<void()> on_held;

 private:
  asio::io_context& io_;
  std::unique_ptr<http::Server> server_;
  std::vector<std::unique_ptr<http::Server>> graveyard_;
  std::uint16_t port_ = 0;
  bool closed_ = false;
  // Simple latch shared by parked handlers.
  class Latch {
   public:
    explicit Latch(asio::io_context& io) : timer_(io, std::chrono::steady_clock::time_point::max()) {}
    void set() {
      set_ = true;
      timer_.cancel();
    }
    asio::awaitable<void> wait() {
      while (!set_) {
        boost::system::error_code ec;
        co_await timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      }
    }

   private:
    asio::steady_timer timer_;
    bool set_ = false;
  } release_;
};

}  // namespace arlo::rollout::test
