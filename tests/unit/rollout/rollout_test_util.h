#pragma once
// Helpers for rollout tests: sample tasks and groups, and a small OpenAI-compatible server on a real
// loopback socket (common/http.h Server); the coroutine helpers are tests/coro_test_util.h's.
#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/http.h"
#include "rollout/types.h"
#include "tests/coro_test_util.h"

namespace arlo::rollout::test {

namespace asio = boost::asio;
using namespace std::chrono_literals;

using arlo::test::drain;
using arlo::test::Event;
using arlo::test::eventually;
using arlo::test::run;
using arlo::test::sleep_for;

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
    r.text = t;
    out.push_back(r);
  }
  return out;
}

// A task of each form, every field set, for tests of what carries a task whole (checkpoints, the
// task sources, the JSON reward modules see): a completion task with info and token ids, and a
// chat task (messages, no prompt).
inline Task sample_completion_task() {
  Task t;
  t.id = "arithmetic-7";
  t.env = "arithmetic";
  t.prompt = "2+3=";
  t.answer = "5";
  t.info = {{"level", 1}};
  t.prompt_tokens = {1, 50, 43, 51, 61};
  t.answer_tokens = {53, 0};
  return t;
}

inline Task sample_chat_task() {
  Task t;
  t.id = "q-8";
  t.env = "gsm8k";
  t.messages = {{"system", "Answer briefly."}, {"user", "2+2?"}};
  t.answer = "4";
  return t;
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
        co_await sleep_for(health_delay);
      }
      if (health_status != 200)
        co_return http::Response::error(health_status, "injected health failure", "server_error");
      co_return http::Response::json(200, {{"status", "ok"}, {"version", version}});
    });
    auto completions = [this](http::Request req) -> asio::awaitable<http::Response> {
      ++received;
      auto body = req.json();
      if (!body) co_return http::Response::error(400, body.error().what());
      bodies.push_back(*body);
      if (fail_with_status) co_return http::Response::error(fail_with_status, "injected failure", "server_error");
      if (answer_delay.count() > 0) {  // a slow server: every completion takes this long
        co_await sleep_for(answer_delay);
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
  std::vector<Json> bodies;  // every completion request, in arrival order
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
  Event release_;  // set once: parked handlers go on
};

}  // namespace arlo::rollout::test
