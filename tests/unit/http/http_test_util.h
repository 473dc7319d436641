#pragma once
// Helpers for the HTTP tests: run a coroutine on an io_context to completion, a one-shot event to
// synchronise coroutines without sleeping, and raw-socket helpers for misbehaving clients/servers.
#include <gtest/gtest.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/tcp_stream.hpp>

#include <chrono>
#include <exception>
#include <string>

#include "common/http.h"

namespace arlo::http::test {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;

inline constexpr auto kNoThrow = asio::as_tuple(asio::use_awaitable);

// Runs `body` on `io` (on this thread) until it completes. A body still running after `limit` is a
// test failure, not a hang.
inline void run(asio::io_context& io, asio::awaitable<void> body, Duration limit = std::chrono::seconds(60)) {
  bool done = false;
  std::exception_ptr error;
  asio::co_spawn(io, std::move(body), [&](std::exception_ptr e) {
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

// A one-shot event: wait() completes once set() has been called (before or after the wait began).
class Event {
 public:
  explicit Event(asio::io_context& io) : timer_(io, std::chrono::steady_clock::time_point::max()) {}
  void set() {
    set_ = true;
    timer_.cancel();
  }
  bool is_set() const { return set_; }
  asio::awaitable<void> wait() {
    while (!set_) co_await timer_.async_wait(kNoThrow);
  }

 private:
  asio::steady_timer timer_;
  bool set_ = false;
};

// Polls `condition` every few milliseconds until true or `limit` passes; returns the final value.
// For conditions no event announces (a peer's socket being closed), with a generous limit.
template <typename Condition>
asio::awaitable<bool> eventually(Condition condition, Duration limit = std::chrono::seconds(20)) {
  auto executor = co_await asio::this_coro::executor;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  asio::steady_timer timer(executor);
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= deadline) co_return false;
    timer.expires_after(std::chrono::milliseconds(5));
    co_await timer.async_wait(kNoThrow);
  }
  co_return true;
}

inline asio::awaitable<beast::tcp_stream> connect_raw(std::uint16_t port) {
  auto executor = co_await asio::this_coro::executor;
  beast::tcp_stream stream(executor);
  stream.expires_after(std::chrono::seconds(20));
  co_await stream.async_connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port), asio::use_awaitable);
  stream.expires_never();
  co_return stream;
}

// Reads until the peer closes (or errors, or `limit` passes). `closed` tells whether the peer closed
// the connection within the limit.
inline asio::awaitable<std::string> read_until_closed(beast::tcp_stream& stream, bool& closed,
                                                      Duration limit = std::chrono::seconds(20)) {
  std::string data;
  char chunk[4096];
  stream.expires_after(limit);
  closed = false;
  for (;;) {
    auto [ec, n] = co_await stream.async_read_some(asio::buffer(chunk), kNoThrow);
    data.append(chunk, n);
    if (ec) {
      closed = ec != beast::error::timeout;
      break;
    }
  }
  co_return data;
}

// Reads until `data` contains `marker` (or the peer closes, or `limit` passes).
inline asio::awaitable<std::string> read_until(beast::tcp_stream& stream, std::string_view marker,
                                               Duration limit = std::chrono::seconds(20)) {
  std::string data;
  char chunk[4096];
  stream.expires_after(limit);
  while (data.find(marker) == std::string::npos) {
    auto [ec, n] = co_await stream.async_read_some(asio::buffer(chunk), kNoThrow);
    data.append(chunk, n);
    if (ec) break;
  }
  stream.expires_never();
  co_return data;
}

inline asio::awaitable<bool> write_raw(beast::tcp_stream& stream, std::string_view data) {
  stream.expires_after(std::chrono::seconds(20));
  auto [ec, n] = co_await asio::async_write(stream, asio::buffer(data), kNoThrow);
  stream.expires_never();
  co_return !ec;
}

}  // namespace arlo::http::test
