#pragma once
// Helpers for tests that drive coroutines on an io_context by hand: run one to completion with a
// limit, a one-shot event to synchronise coroutines without sleeping, polling for a condition no
// event announces, and draining what is left on the loop. Shared by the HTTP and rollout tests.
#include <gtest/gtest.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <exception>

namespace arlo::test {

// Awaits without throwing: the error comes back in a tuple (timers cancelled on purpose, reads that
// end at a closed socket).
inline constexpr auto kNoThrow = boost::asio::as_tuple(boost::asio::use_awaitable);

// Runs `body` on `io` (on this thread) until it completes. A body still running after `limit` is a
// test failure, not a hang; an exception it throws fails the test with its message.
inline void run(boost::asio::io_context& io, boost::asio::awaitable<void> body,
                std::chrono::steady_clock::duration limit = std::chrono::seconds(60)) {
  bool done = false;
  std::exception_ptr error;
  boost::asio::co_spawn(io, std::move(body), [&](std::exception_ptr e) {
    error = e;
    done = true;
  });
  const auto deadline = std::chrono::steady_clock::now() + limit;
  io.restart();
  while (!done && std::chrono::steady_clock::now() < deadline) {
    io.run_one_for(std::chrono::milliseconds(100));
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

// Runs the handlers still queued on `io` (server shutdowns, abandoned timers) without blocking.
inline void drain(boost::asio::io_context& io) {
  io.restart();
  for (int i = 0; i < 200 && io.poll() > 0; ++i) {
  }
}

// A one-shot event: wait() completes once set() has been called (before or after the wait began).
class Event {
 public:
  explicit Event(boost::asio::io_context& io) : timer_(io, std::chrono::steady_clock::time_point::max()) {}
  void set() {
    set_ = true;
    timer_.cancel();
  }
  bool is_set() const { return set_; }
  boost::asio::awaitable<void> wait() {
    while (!set_) co_await timer_.async_wait(kNoThrow);
  }

 private:
  boost::asio::steady_timer timer_;
  bool set_ = false;
};

inline boost::asio::awaitable<void> sleep_for(std::chrono::steady_clock::duration d) {
  boost::asio::steady_timer t(co_await boost::asio::this_coro::executor, d);
  co_await t.async_wait(kNoThrow);
}

// Polls `condition` every 5 ms until it holds or `limit` passes; returns whether it held. For state
// changes no event announces (inside the code under test, or a peer's socket being closed), with a
// generous limit.
template <typename Condition>
boost::asio::awaitable<bool> eventually(Condition condition,
                                        std::chrono::steady_clock::duration limit = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= deadline) co_return false;
    co_await sleep_for(std::chrono::milliseconds(5));
  }
  co_return true;
}

}  // namespace arlo::test
