// A fake inference server on a real loopback socket (common/http.h Server) for the tests: it serves
// the OpenAI-compatible completion routes, answering "echo:<prompt>" with token
// ids = the text's bytes, logprobs -0.5 per token and version spans [[version, 0]], records what it
// was asked, and has the failure knobs the rollout tests turn (an injected status, a slow or parked
// answer, a failing or slow health check, a crash).
//
// It plays a generic OpenAI-compatible server (GET /health, POST /v1/completions). The admin planes
// of vLLM and SGLang (pause, resume, weight updates) are still fakes of their own in
// tests/unit/rollout/admin_collective_test.cc; they join this one as dialect personalities.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/http.h"

namespace arlo::testing {

using Json = nlohmann::json;

class InferenceServerFake {
 public:
  // Listens on 127.0.0.1:`port` (0: any free port); throws when it cannot.
  explicit InferenceServerFake(boost::asio::io_context& io, std::uint16_t port = 0);
  ~InferenceServerFake();
  InferenceServerFake(const InferenceServerFake&) = delete;
  InferenceServerFake& operator=(const InferenceServerFake&) = delete;

  // Listens again (after close()), on `port`.
  void start(std::uint16_t port);
  // Simulates a crash: listener and every connection closed at once; parked requests are dropped.
  void close();
  // Parked completion requests go on (and later ones are not parked).
  void release_all();

  // The completion response to `body` (what an unparked, unfailed request gets).
  Json answer(const Json& body) const;

  std::uint16_t port() const { return port_; }
  std::string url() const;

  // What it was asked.
  int received = 0;          // completion requests
  std::vector<Json> bodies;  // every completion request's body, in arrival order
  int answered = 0;
  int held = 0;
  int health_calls = 0;

  // Failure knobs.
  bool hold = false;                          // park completion requests until release_all() or close()
  int fail_with_status = 0;                   // completions answer this error status (0: none)
  int health_status = 200;                    // what GET /health answers
  std::chrono::milliseconds health_delay{0};  // GET /health answers after this long
  std::chrono::milliseconds answer_delay{0};  // completions answer after this long
  std::int64_t version = 0;                   // the weights version the answers carry
  std::function<void()> on_held;              // called as each request is parked

 private:
  boost::asio::awaitable<http::Response> health(http::Request req);
  boost::asio::awaitable<http::Response> complete(http::Request req);
  boost::asio::awaitable<void> wait_released();

  boost::asio::io_context& io_;
  std::unique_ptr<http::Server> server_;
  // Closed servers are kept until this fake goes away: their connection coroutines may still be
  // queued on the io_context.
  std::vector<std::unique_ptr<http::Server>> graveyard_;
  std::uint16_t port_ = 0;
  bool closed_ = false;
  bool released_ = false;
  boost::asio::steady_timer release_;  // cancelled once released: parked handlers go on
};

}  // namespace arlo::testing
