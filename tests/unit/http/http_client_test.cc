// Client behaviour over real loopback sockets: deadlines, retries, pooling, limits and errors.
#include <gtest/gtest.h>

#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <fmt/format.h>

#include <memory>
#include <optional>

#include "common/async/fake_clock.h"
#include "common/http.h"
#include "tests/unit/http/http_test_util.h"

namespace arlo::http::test {
namespace {

using arlo::FakeClock;

RetryPolicy fast_retry(int attempts) {
  return RetryPolicy{.max_attempts = attempts,
                     .initial_backoff = std::chrono::milliseconds(1),
                     .max_backoff = std::chrono::milliseconds(10)};
}

// Lets the loop run the handlers already queued (a socket closed by a deadline posts its
// completion at once), without waiting on time.
asio::awaitable<void> settle_loop() {
  auto ex = co_await asio::this_coro::executor;
  for (int i = 0; i < 50; ++i) co_await asio::post(ex, asio::use_awaitable);
}

// Plays the role of time for a client on a FakeClock: each time the client begins a retry backoff,
// the clock jumps to its end (the backoff is the only timer then: no attempt is in flight). Returns
// when `done` is set.
asio::awaitable<void> run_backoffs(FakeClock& clock, const Client& client, const bool& done) {
  for (std::uint64_t seen = 0;;) {
    EXPECT_TRUE(co_await eventually([&] { return done || client.stats().backoffs > seen; }));
    if (done || client.stats().backoffs == seen) co_return;
    ++seen;
    EXPECT_EQ(clock.pending(), 1u);
    clock.fire_next();
  }
}

class HttpClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.bind = "127.0.0.1";
    server = std::make_unique<Server>(io, options);
    server->route(Verb::get, "/ok", [](Request) -> asio::awaitable<Response> {
      co_return Response::json(200, {{"ok", true}});
    });
    // 503 for the first `failures_left` calls, then 200. Counts every call.
    auto flaky = [this](Request) -> asio::awaitable<Response> {
      ++flaky_calls;
      if (failures_left > 0) {
        --failures_left;
        co_return Response::error(503, "warming up", "unavailable");
      }
      co_return Response::json(200, {{"calls", flaky_calls}});
    };
    server->route(Verb::get, "/flaky", flaky);
    server->route(Verb::post, "/flaky", flaky);
    server->route(Verb::get, "/never", [this](Request) -> asio::awaitable<Response> {
      never_entered.set();
      co_await never.wait();  // released only by the server's close() cancelling the wait
      co_return Response::json(200, {});
    });
    server->route(Verb::get, "/big",
                  [](Request) -> asio::awaitable<Response> { co_return Response::text(200, std::string(5000, 'b')); });
    auto port = server->start();
    ASSERT_TRUE(port) << port.error().what();
    base = fmt::format("http://127.0.0.1:{}", *port);
    ClientOptions client_options;
    client_options.retry = fast_retry(3);
    client = std::make_unique<Client>(io, client_options);
  }
  void TearDown() override {
    client->close_idle();
    server->close();
  }

  // GETs /flaky once with the test's client; the status it ends with (the call itself must succeed).
  int get_flaky() {
    int status = 0;
    run(io, [&]() -> asio::awaitable<void> {
      auto r = co_await client->get(base + "/flaky");
      EXPECT_TRUE(r) << (r ? "" : r.error().what());
      if (r) status = r->status;
    }());
    return status;
  }

  asio::io_context io;
  std::unique_ptr<Server> server;
  std::unique_ptr<Client> client;
  std::string base;
  int flaky_calls = 0;
  int failures_left = 0;
  Event never_entered{io};
  Event never{io};
};

// The handler never answers, so only the deadline can end the call: on a FakeClock it expires when
// (and only when) the test moves time past it.
TEST_F(HttpClientTest, DeadlineExpiresAgainstHandlerThatNeverAnswers) {
  FakeClock clock;
  ClientOptions options;
  options.retry = fast_retry(3);
  options.clock = &clock;
  Client timed(io, options);
  std::optional<Result<Response>> r;
  run(io, [&]() -> asio::awaitable<void> {
    asio::co_spawn(
        io, [&]() -> asio::awaitable<void> { r = co_await timed.get(base + "/never", 300ms); }, asio::detached);
    co_await never_entered.wait();  // the request was written and reached the handler
    clock.advance(299ms);
    co_await settle_loop();
    EXPECT_FALSE(r.has_value()) << "the call ended before its deadline";
    clock.advance(1ms);
    EXPECT_TRUE(co_await eventually([&] { return r.has_value(); }));
  }());
  ASSERT_TRUE(r.has_value());
  ASSERT_FALSE(*r);
  EXPECT_EQ(r->error().code(), ErrorCode::kTimeout) << r->error().what();
  EXPECT_EQ(timed.stats().attempts, 1u);  // a timeout is final: the deadline covers retries
}

TEST_F(HttpClientTest, RetriesOn503ThenSucceeds) {
  failures_left = 2;
  EXPECT_EQ(get_flaky(), 200);
  EXPECT_EQ(flaky_calls, 3);
  EXPECT_EQ(client->stats().attempts, 3u);
}

TEST_F(HttpClientTest, Returns5xxWhenAttemptsAreSpent) {
  failures_left = 100;
  EXPECT_EQ(get_flaky(), 503);
  EXPECT_EQ(flaky_calls, 3);
}

TEST_F(HttpClientTest, NoRetryOnPostUnlessMarkedIdempotent) {
  failures_left = 2;
  run(io, [&]() -> asio::awaitable<void> {
    ClientRequest post;
    post.method = Verb::post;
    post.url = base + "/flaky";
    post.body = "{}";
    auto once = co_await client->request(post);
    EXPECT_TRUE(once);
    if (once) {
      EXPECT_EQ(once->status, 503);
    }
    EXPECT_EQ(flaky_calls, 1);

    failures_left = 2;
    flaky_calls = 0;
    post.idempotent = true;
    auto retried = co_await client->request(post);
    EXPECT_TRUE(retried);
    if (retried) {
      EXPECT_EQ(retried->status, 200);
    }
    EXPECT_EQ(flaky_calls, 3);
  }());
}

TEST_F(HttpClientTest, ConnectionRefusedIsUnavailableAfterRetries) {
  // A port that was just free: bind, read the port, close.
  std::uint16_t port = 0;
  {
    tcp::acceptor probe(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    port = probe.local_endpoint().port();
  }
  run(io, [&]() -> asio::awaitable<void> {
    const std::string url = fmt::format("http://127.0.0.1:{}/ok", port);
    auto r = co_await client->get(url, 20s);
    EXPECT_FALSE(r);
    if (!r) {
      EXPECT_EQ(r.error().code(), ErrorCode::kUnavailable) << r.error().what();
      EXPECT_NE(r.error().what().find("3 attempt"), std::string::npos) << r.error().what();
    }
  }());
  EXPECT_EQ(client->stats().attempts, 3u);
  EXPECT_EQ(client->stats().connections_opened, 0u);
}

// Backoffs of 25-50, 50-100, 100-200 ms... against a 200 ms deadline: the client retries while the
// next backoff ends before the deadline, then returns the last 503 at once rather than sleep past
// it. On a FakeClock no time passes during the attempts themselves, so the outcome is exact: three
// or four attempts (by the jitter), never a timeout.
TEST_F(HttpClientTest, RetryNeverRunsPastTheDeadline) {
  FakeClock clock;
  ClientOptions options;
  options.clock = &clock;
  Client timed(io, options);
  failures_left = 1000;
  ClientRequest r;
  r.url = base + "/flaky";
  r.timeout = 200ms;
  r.retry = RetryPolicy{.max_attempts = 1000, .initial_backoff = 50ms, .max_backoff = 10s};
  const auto start = clock.now();
  std::optional<Result<Response>> out;
  bool done = false;
  run(io, [&]() -> asio::awaitable<void> {
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          out = co_await timed.request(r);
          done = true;
        },
        asio::detached);
    co_await run_backoffs(clock, timed, done);
  }());
  ASSERT_TRUE(out.has_value());
  ASSERT_TRUE(*out) << out->error().what();
  EXPECT_EQ((*out)->status, 503);
  EXPECT_GE(flaky_calls, 3);
  EXPECT_LE(flaky_calls, 4);
  EXPECT_EQ(timed.stats().backoffs, static_cast<std::uint64_t>(flaky_calls - 1));
  EXPECT_LT(clock.now() - start, 200ms);
  EXPECT_EQ(clock.pending(), 0u);  // no timer outlives the call
}

TEST_F(HttpClientTest, ReplacesPooledConnectionClosedByServer) {
  // A second server with a short idle timeout closes the pooled connection behind our back.
  ServerOptions options;
  options.bind = "127.0.0.1";
  options.idle_timeout = 100ms;
  Server quick(io, options);
  quick.route(Verb::get, "/ok", [](Request) -> asio::awaitable<Response> { co_return Response::json(200, {}); });
  quick.route(Verb::post, "/ok", [](Request) -> asio::awaitable<Response> { co_return Response::json(200, {}); });
  auto port = quick.start();
  ASSERT_TRUE(port);
  const std::string url = fmt::format("http://127.0.0.1:{}/ok", *port);
  run(io, [&]() -> asio::awaitable<void> {
    auto first = co_await client->get(url);
    EXPECT_TRUE(first && first->status == 200);
    {
      const bool ok_ = co_await eventually([&] { return quick.stats().connections_open == 0; });
      EXPECT_TRUE(ok_);
    }
    // Non-idempotent POST: the dead pooled connection must be noticed before anything is sent.
    nlohmann::json payload = {{"x", 1}};
    auto second = co_await client->post_json(url, payload);
    EXPECT_TRUE(second) << second.error().what();
    if (second) {
      EXPECT_EQ(second->status, 200);
    }
    {
      const bool ok_ = co_await eventually([&] { return quick.stats().connections_open == 0; });
      EXPECT_TRUE(ok_);
    }
    auto third = co_await client->get(url);
    EXPECT_TRUE(third) << third.error().what();
  }());
  EXPECT_EQ(client->stats().connections_opened, 3u);
  EXPECT_EQ(quick.stats().requests, 3u);
  quick.close();
}

TEST_F(HttpClientTest, ResponseOverLimitIsResourceExhausted) {
  ClientOptions options;
  options.max_response_bytes = 1000;
  Client small(io, options);
  run(io, [&]() -> asio::awaitable<void> {
    auto r = co_await small.get(base + "/big");
    EXPECT_FALSE(r);
    if (!r) {
      EXPECT_EQ(r.error().code(), ErrorCode::kResourceExhausted) << r.error().what();
    }
    auto ok = co_await small.get(base + "/ok");  // the client stays usable
    EXPECT_TRUE(ok);
  }());
}

TEST_F(HttpClientTest, MalformedResponseIsParseError) {
  tcp::acceptor liar(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  const std::uint16_t port = liar.local_endpoint().port();
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        auto [ec, socket] = co_await liar.async_accept(kNoThrow);
        if (ec) co_return;
        beast::tcp_stream stream(std::move(socket));
        co_await read_until(stream, "\r\n\r\n");
        co_await write_raw(stream, "HTTP/1.1 abc this is not a status line\r\n\r\n");
      },
      asio::detached);
  run(io, [&]() -> asio::awaitable<void> {
    ClientRequest r;
    r.url = fmt::format("http://127.0.0.1:{}/x", port);
    r.retry = RetryPolicy{.max_attempts = 1};
    auto out = co_await client->request(r);
    EXPECT_FALSE(out);
    if (!out) {
      EXPECT_EQ(out.error().code(), ErrorCode::kParse) << out.error().what();
    }
  }());
}

TEST_F(HttpClientTest, BadUrlsAreInvalidArgument) {
  run(io, [&]() -> asio::awaitable<void> {
    for (const char* url : {"https://127.0.0.1/x", "127.0.0.1:80/x", "http:///x", "http://h:99999/x", "http://h:x/"}) {
      auto r = co_await client->get(url);
      EXPECT_FALSE(r) << url;
      if (!r) {
        EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument) << url;
      }
    }
  }());
}

TEST_F(HttpClientTest, HeaderInjectionIsRefused) {
  run(io, [&]() -> asio::awaitable<void> {
    ClientRequest r;
    r.url = base + "/ok";
    r.headers["X-Evil"] = "a\r\nX-Injected: 1";
    auto out = co_await client->request(r);
    EXPECT_FALSE(out);
    if (!out) {
      EXPECT_EQ(out.error().code(), ErrorCode::kInvalidArgument);
    }
    ClientRequest bad_name;
    bad_name.url = base + "/ok";
    bad_name.headers["Bad Name"] = "x";
    auto out2 = co_await client->request(bad_name);
    EXPECT_FALSE(out2);
  }());
  EXPECT_EQ(client->stats().attempts, 0u);
}

TEST_F(HttpClientTest, ResolvesHostNamesAndIpv6Literals) {
  run(io, [&]() -> asio::awaitable<void> {
    const std::string url = fmt::format("http://localhost:{}/ok", server->port());
    auto by_name = co_await client->get(url, 20s);
    // "localhost" may resolve to ::1 first; the server listens on 127.0.0.1 and the client tries
    // every address in turn.
    EXPECT_TRUE(by_name) << by_name.error().what();
    if (by_name) {
      EXPECT_EQ(by_name->status, 200);
    }
  }());
}

}  // namespace
}  // namespace arlo::http::test
