#pragma once
// Helpers for the HTTP tests: raw-socket helpers for misbehaving clients/servers, beside the
// coroutine helpers every such test uses (tests/coro_test_util.h).
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
#include <string>

#include "common/http.h"
#include "tests/coro_test_util.h"

namespace arlo::http::test {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;

using arlo::test::Event;
using arlo::test::eventually;
using arlo::test::kNoThrow;
using arlo::test::run;

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
