// Server behaviour over real loopback sockets: routing, errors, limits, timeouts, keep-alive and
// graceful stop. Clients are arlo::http::Client or raw sockets where a misbehaving peer is needed.
#include <gtest/gtest.h>

#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <fmt/format.h>

#include <memory>
#include <stdexcept>

#include "common/http.h"
#include "tests/unit/http/http_test_util.h"

namespace arlo::http::test {
namespace {

class HttpServerTest : public ::testing::Test {
 protected:
  // Creates the server; register routes on *server, then call start().
  void make_server(ServerOptions options = {}) {
    options.bind = "127.0.0.1";
    options.port = 0;
    server = std::make_unique<Server>(io, options);
    server->route(Verb::get, "/ok", [](Request) -> asio::awaitable<Response> {
      co_return Response::json(200, {{"ok", true}});
    });
  }
  void start() {
    auto port = server->start();
    ASSERT_TRUE(port) << port.error().what();
    base = fmt::format("http://127.0.0.1:{}", *port);
  }
  // Creates and starts a server whose stop() waits up to `grace` for requests in flight, with a GET
  // `path` that is entered (sets `entered`) and answers 200 only once `release` is set.
  void start_with_a_parked_route(Duration grace, const std::string& path, Event& entered, Event& release) {
    ServerOptions options;
    options.stop_grace = grace;
    make_server(options);
    server->route(Verb::get, path, [&](Request) -> asio::awaitable<Response> {
      entered.set();
      co_await release.wait();
      co_return Response::json(200, {{"parked", "done"}});
    });
    start();
  }
  void TearDown() override {
    if (client) client->close_idle();
    if (server) server->close();
  }

  asio::io_context io;
  std::unique_ptr<Server> server;
  std::unique_ptr<Client> client = std::make_unique<Client>(io);
  std::string base;
};

TEST_F(HttpServerTest, RoutesByMethodAndExactPath) {
  make_server();
  server->route(Verb::get, "/echo", [](Request r) -> asio::awaitable<Response> {
    nlohmann::json query = r.query;
    co_return Response::json(200, {{"handler", "get"},
                                   {"path", r.path},
                                   {"target", r.target},
                                   {"query", query},
                                   {"x-test", r.headers.count("x-test") ? r.headers.at("x-test") : ""},
                                   {"mode", r.query_param("mode").value_or("none")}});
  });
  server->route(Verb::post, "/echo", [](Request r) -> asio::awaitable<Response> {
    co_return Response::json(201, {{"handler", "post"}, {"body", r.body}});
  });
  start();
  run(io, [&]() -> asio::awaitable<void> {
    ClientRequest get;
    get.url = base + "/echo?mode=keep&name=a%20b+c";
    get.headers["X-Test"] = "yes";
    auto r = co_await client->request(get);
    EXPECT_TRUE(r) << r.error().what();
    if (!r) co_return;
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->content_type, "application/json");
    auto j = r->parse_json();
    EXPECT_TRUE(j);
    EXPECT_EQ((*j)["handler"], "get");
    EXPECT_EQ((*j)["path"], "/echo");
    EXPECT_EQ((*j)["target"], "/echo?mode=keep&name=a%20b+c");
    EXPECT_EQ((*j)["query"]["name"], "a b c");
    EXPECT_EQ((*j)["mode"], "keep");
    EXPECT_EQ((*j)["x-test"], "yes");

    nlohmann::json payload = {{"k", 1}};
    auto p = co_await client->post_json(base + "/echo", payload);
    EXPECT_TRUE(p);
    if (!p) co_return;
    EXPECT_EQ(p->status, 201);
    EXPECT_EQ(p->parse_json().value()["handler"], "post");
    EXPECT_EQ(p->parse_json().value()["body"], R"({"k":1})");
  }());
}

TEST_F(HttpServerTest, UnknownPathIs404AndWrongMethodIs405WithAllow) {
  make_server();
  server->route(Verb::post, "/ok", [](Request) -> asio::awaitable<Response> { co_return Response::json(200, {}); });
  start();
  run(io, [&]() -> asio::awaitable<void> {
    auto missing = co_await client->get(base + "/ok/");  // exact paths only
    EXPECT_TRUE(missing);
    if (!missing) co_return;
    EXPECT_EQ(missing->status, 404);
    EXPECT_EQ(missing->parse_json().value()["error"]["type"], "not_found_error");

    ClientRequest del;
    del.method = Verb::delete_;
    del.url = base + "/ok";
    auto wrong = co_await client->request(del);
    EXPECT_TRUE(wrong);
    if (!wrong) co_return;
    EXPECT_EQ(wrong->status, 405);
    EXPECT_TRUE(wrong->headers.count("allow"));
    EXPECT_EQ(wrong->headers.at("allow"), "GET, POST");
    EXPECT_EQ(wrong->parse_json().value()["error"]["code"], 405);
  }());
}

TEST_F(HttpServerTest, JsonBodiesAndMalformedJson) {
  make_server();
  server->route(Verb::post, "/sum", [](Request r) -> asio::awaitable<Response> {
    auto body = r.json();
    if (!body) co_return Response::error(400, body.error().message(), "invalid_request_error", "body");
    co_return Response::json(200, {{"sum", body->value("a", 0) + body->value("b", 0)}});
  });
  start();
  run(io, [&]() -> asio::awaitable<void> {
    nlohmann::json payload = {{"a", 2}, {"b", 40}};
    auto good = co_await client->post_json(base + "/sum", payload);
    EXPECT_TRUE(good);
    if (!good) co_return;
    EXPECT_EQ(good->status, 200);
    EXPECT_EQ(good->parse_json().value()["sum"], 42);

    ClientRequest bad;
    bad.method = Verb::post;
    bad.url = base + "/sum";
    bad.body = R"({"a": 1,)";
    auto r = co_await client->request(bad);
    EXPECT_TRUE(r);
    if (!r) co_return;
    EXPECT_EQ(r->status, 400);
    auto j = r->parse_json().value();
    EXPECT_EQ(j["error"]["param"], "body");
    EXPECT_NE(j["error"]["message"].get<std::string>().find("not valid JSON"), std::string::npos);
  }());
}

TEST_F(HttpServerTest, BodyOverLimitGets413AndServerKeepsServing) {
  ServerOptions options;
  options.max_body_bytes = 1024;
  make_server(options);
  server->route(Verb::post, "/upload", [](Request r) -> asio::awaitable<Response> {
    co_return Response::json(200, {{"bytes", r.body.size()}});
  });
  start();
  run(io, [&]() -> asio::awaitable<void> {
    ClientRequest fits;
    fits.method = Verb::post;
    fits.url = base + "/upload";
    fits.body.assign(1024, 'x');
    auto ok = co_await client->request(fits);
    EXPECT_TRUE(ok);
    if (ok) {
      EXPECT_EQ(ok->status, 200);
    }

    ClientRequest big = fits;
    big.body.assign(8192, 'x');
    auto r = co_await client->request(big);
    EXPECT_TRUE(r) << r.error().what();
    if (!r) co_return;
    EXPECT_EQ(r->status, 413);
    EXPECT_EQ(r->parse_json().value()["error"]["type"], "request_too_large");

    // A declared length over the limit is refused from the head alone.
    auto raw = co_await connect_raw(server->port());
    co_await write_raw(raw, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n");
    bool closed = false;
    std::string answer = co_await read_until_closed(raw, closed);
    EXPECT_TRUE(closed);
    EXPECT_EQ(answer.rfind("HTTP/1.1 413", 0), 0u) << answer;

    auto after = co_await client->get(base + "/ok");
    EXPECT_TRUE(after);
    if (after) {
      EXPECT_EQ(after->status, 200);
    }
  }());
}

TEST_F(HttpServerTest, SlowClientIsCutOffByHeaderTimeout) {
  ServerOptions options;
  options.header_timeout = 300ms;  // total for the head: dripping bytes does not extend it
  options.idle_timeout = 60s;
  make_server(options);
  start();
  run(io, [&]() -> asio::awaitable<void> {
    auto raw = co_await connect_raw(server->port());
    const std::string request = "GET /ok HTTP/1.1\r\nHost: x\r\nX-Padding: " + std::string(200, 'p') + "\r\n\r\n";
    // One byte every 20 ms would take over 4 s; the server must cut us off long before the end.
    std::size_t sent = 0;
    bool cut = false;
    asio::steady_timer pace(io);
    for (; sent < request.size(); ++sent) {
      if (!co_await write_raw(raw, std::string_view(request).substr(sent, 1))) {
        cut = true;
        break;
      }
      pace.expires_after(20ms);
      co_await pace.async_wait(kNoThrow);
    }
    bool closed = false;
    std::string answer = co_await read_until_closed(raw, closed);
    EXPECT_TRUE(cut || closed);
    EXPECT_LT(sent, request.size()) << "the whole head got through";
    EXPECT_EQ(answer.find("200 OK"), std::string::npos);
    EXPECT_GE(server->stats().timeouts, 1u);
  }());
}

TEST_F(HttpServerTest, IdleKeepAliveConnectionIsClosed) {
  ServerOptions options;
  options.idle_timeout = 200ms;
  options.header_timeout = 60s;
  make_server(options);
  start();
  run(io, [&]() -> asio::awaitable<void> {
    // A connection that answers one request and then goes quiet.
    auto raw = co_await connect_raw(server->port());
    co_await write_raw(raw, "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n");
    std::string first = co_await read_until(raw, "{\"ok\":true}");
    EXPECT_EQ(first.rfind("HTTP/1.1 200", 0), 0u) << first;
    bool closed = false;
    std::string rest = co_await read_until_closed(raw, closed);
    EXPECT_TRUE(closed) << "keep-alive connection was not closed after idle_timeout";
    EXPECT_TRUE(rest.empty());

    // A connection that never sends a byte.
    auto silent = co_await connect_raw(server->port());
    co_await read_until_closed(silent, closed);
    EXPECT_TRUE(closed);
    EXPECT_GE(server->stats().timeouts, 2u);
  }());
}

TEST_F(HttpServerTest, HandlerExceptionIs500AndServerKeepsServing) {
  make_server();
  server->route(Verb::get, "/boom", [](Request) -> asio::awaitable<Response> {
    throw std::runtime_error("boom at the handler");
    co_return Response::json(200, {});
  });
  start();
  run(io, [&]() -> asio::awaitable<void> {
    for (int i = 0; i < 3; ++i) {
      auto r = co_await client->get(base + "/boom");
      EXPECT_TRUE(r);
      if (!r) co_return;
      EXPECT_EQ(r->status, 500);
      auto j = r->parse_json();
      EXPECT_TRUE(j);
      if (j) {
        EXPECT_NE((*j)["error"]["message"].get<std::string>().find("boom at the handler"), std::string::npos);
      }
      auto ok = co_await client->get(base + "/ok");
      EXPECT_TRUE(ok);
      if (ok) {
        EXPECT_EQ(ok->status, 200);
      }
    }
  }());
  EXPECT_EQ(server->stats().connections_accepted, 1u);  // 500 does not cost the connection
}

TEST_F(HttpServerTest, InvalidHandlerHeaderIs500AndHeadHasNoBody) {
  make_server();
  server->route(Verb::get, "/inject", [](Request) -> asio::awaitable<Response> {
    Response r = Response::text(200, "fine");
    r.headers["X-Evil"] = "a\r\nX-Injected: 1";
    co_return r;
  });
  server->route(Verb::head, "/thing", [](Request) -> asio::awaitable<Response> {
    Response r = Response::text(200, "abcdef");
    r.headers["X-Thing"] = "yes";
    co_return r;
  });
  start();
  run(io, [&]() -> asio::awaitable<void> {
    auto r = co_await client->get(base + "/inject");
    EXPECT_TRUE(r);
    if (r) {
      EXPECT_EQ(r->status, 500);
      EXPECT_EQ(r->headers.count("x-injected"), 0u);
    }
    ClientRequest head;
    head.method = Verb::head;
    head.url = base + "/thing";
    auto h = co_await client->request(head);
    EXPECT_TRUE(h);
    if (h) {
      EXPECT_EQ(h->status, 200);
      EXPECT_EQ(h->body, "");
      EXPECT_EQ(h->headers["content-length"], "6");
      EXPECT_EQ(h->headers["x-thing"], "yes");
    }
    auto after = co_await client->get(base + "/ok");  // the connection is still in step
    EXPECT_TRUE(after && after->status == 200);
  }());
  EXPECT_EQ(server->stats().connections_accepted, 1u);
}

TEST_F(HttpServerTest, KeepAliveReusesOneConnection) {
  make_server();
  start();
  run(io, [&]() -> asio::awaitable<void> {
    for (int i = 0; i < 20; ++i) {
      auto r = co_await client->get(base + "/ok");
      EXPECT_TRUE(r);
      if (r) {
        EXPECT_EQ(r->status, 200);
      }
    }
  }());
  EXPECT_EQ(server->stats().connections_accepted, 1u);
  EXPECT_EQ(server->stats().requests, 20u);
  EXPECT_EQ(client->stats().connections_opened, 1u);
  EXPECT_EQ(client->stats().connections_reused, 19u);
}

TEST_F(HttpServerTest, MalformedRequestGets400AndExpectContinueWorks) {
  make_server();
  server->route(Verb::post, "/echo",
                [](Request r) -> asio::awaitable<Response> { co_return Response::text(200, r.body); });
  start();
  run(io, [&]() -> asio::awaitable<void> {
    auto raw = co_await connect_raw(server->port());
    co_await write_raw(raw, "NOT AN HTTP REQUEST\r\n\r\n");
    bool closed = false;
    std::string answer = co_await read_until_closed(raw, closed);
    EXPECT_EQ(answer.rfind("HTTP/1.1 400", 0), 0u) << answer;

    auto cont = co_await connect_raw(server->port());
    co_await write_raw(cont, "POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n");
    std::string interim = co_await read_until(cont, "\r\n\r\n");
    EXPECT_EQ(interim, "HTTP/1.1 100 Continue\r\n\r\n");
    co_await write_raw(cont, "hello");
    std::string final_answer = co_await read_until(cont, "hello");
    EXPECT_EQ(final_answer.rfind("HTTP/1.1 200", 0), 0u) << final_answer;
  }());
}

TEST_F(HttpServerTest, GracefulStopLetsInFlightRequestFinish) {
  // stop() must still be waiting when checked below: a grace no stall can outlast (the handler is
  // released by an event, so the test never waits for it).
  Event entered(io), release(io);
  start_with_a_parked_route(120s, "/slow", entered, release);
  run(io, [&]() -> asio::awaitable<void> {
    // An idle pooled connection from an earlier request: stop() must close it at once.
    Client other(io);
    auto warm = co_await other.get(base + "/ok");
    EXPECT_TRUE(warm);

    std::optional<Result<Response>> slow;
    Event slow_done(io), stop_done(io);
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          slow = co_await client->get(base + "/slow");
          slow_done.set();
        },
        asio::detached);
    co_await entered.wait();
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          co_await server->stop();
          stop_done.set();
        },
        asio::detached);
    // The listener is closed: new connections are refused.
    ClientRequest fresh;
    fresh.url = base + "/ok";
    fresh.retry = RetryPolicy{.max_attempts = 1};
    Client third(io);
    auto refused = co_await third.request(fresh);
    EXPECT_FALSE(refused);
    if (!refused) {
      EXPECT_EQ(refused.error().code(), ErrorCode::kUnavailable);
    }
    const bool idle_closed = co_await eventually([&] { return server->stats().connections_open == 1; });
    EXPECT_TRUE(idle_closed) << "the idle connection was not closed by stop()";
    EXPECT_FALSE(stop_done.is_set());

    release.set();
    co_await slow_done.wait();
    EXPECT_TRUE(slow && *slow);
    if (slow && *slow) {
      EXPECT_EQ((*slow)->status, 200);
      EXPECT_EQ((*slow)->headers["connection"], "close");
    }
    co_await stop_done.wait();
    EXPECT_EQ(server->stats().connections_open, 0u);
  }());
}

TEST_F(HttpServerTest, StopGraceExpiryClosesStuckRequests) {
  Event entered(io), never(io);
  start_with_a_parked_route(200ms, "/stuck", entered, never);
  run(io, [&]() -> asio::awaitable<void> {
    std::optional<Result<Response>> stuck;
    Event stuck_done(io);
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          ClientRequest r;
          r.url = base + "/stuck";
          r.timeout = 30s;
          r.retry = RetryPolicy{.max_attempts = 1};
          stuck = co_await client->request(r);
          stuck_done.set();
        },
        asio::detached);
    co_await entered.wait();
    co_await server->stop();
    EXPECT_EQ(server->stats().connections_open, 0u);
    co_await stuck_done.wait();
    EXPECT_TRUE(stuck && !*stuck);
    if (stuck && !*stuck) {
      EXPECT_EQ(stuck->error().code(), ErrorCode::kUnavailable) << stuck->error().what();
    }
  }());
}

TEST_F(HttpServerTest, ManyConcurrentRequestsAllComplete) {
  ASSERT_TRUE(raise_open_file_limit());
  make_server();
  server->route(Verb::post, "/work", [](Request r) -> asio::awaitable<Response> {
    // Yield once so requests overlap inside the server, too.
    co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
    co_return Response::json(200, {{"n", r.json().value()["n"]}});
  });
  start();
  ClientOptions client_options;
  client_options.max_idle_per_host = 4096;
  client = std::make_unique<Client>(io, client_options);
  constexpr int kRequests = 2000;
  int completed = 0, good = 0;
  run(io, [&]() -> asio::awaitable<void> {
    Event all_done(io);
    for (int i = 0; i < kRequests; ++i) {
      asio::co_spawn(
          io,
          [&, i]() -> asio::awaitable<void> {
            nlohmann::json payload = {{"n", i}};
            auto r = co_await client->post_json(base + "/work", payload, 60s);
            if (r && r->status == 200 && r->parse_json().value()["n"] == i) ++good;
            if (++completed == kRequests) all_done.set();
          },
          asio::detached);
    }
    co_await all_done.wait();
  }());
  EXPECT_EQ(completed, kRequests);
  EXPECT_EQ(good, kRequests);
  EXPECT_EQ(server->stats().requests, static_cast<std::uint64_t>(kRequests));
  EXPECT_LE(server->stats().connections_accepted, static_cast<std::uint64_t>(kRequests));
}

}  // namespace
}  // namespace arlo::http::test
