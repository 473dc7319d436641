// arlo::http::Server: HTTP/1.1 server on Beast with one coroutine per connection.
//
// Structure
//   accept_loop   one coroutine; accepts, sets TCP_NODELAY and spawns a session per connection.
//   session       one coroutine per connection; reads a request under the timeouts, dispatches it
//                 to the route's handler, writes the answer, loops while keep-alive.
//   stop/close    graceful and immediate shutdown over the registry of live connections.
//
// Timeouts (beast::tcp_stream closes the socket when its expiry passes):
//   idle_timeout    while a keep-alive connection waits for the first byte of its next request;
//   header_timeout  from that first byte until the head and body are complete (a total deadline,
//                   so a client dripping one byte at a time is still cut off);
//   idle_timeout    again for writing the answer (a client that never reads is cut off too).
//   No deadline runs while the handler works: handlers own their own deadlines.
//
// Everything runs on the io_context's single thread, so the registry and counters need no locks.
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <array>
#include <iterator>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/auth.h"
#include "common/http.h"
#include "common/http_util.h"
#include "common/log.h"

namespace arlo::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;

namespace {

constexpr auto kNoThrow = asio::as_tuple(asio::use_awaitable);
constexpr std::uint32_t kHeaderLimit = 64 * 1024;  // request line + headers
constexpr std::size_t kFirstReadBytes = 4096;      // initial read for the next request's head
// The kernel caps this at net.core.somaxconn; ask for plenty so bursts of thousands of connects
// (the orchestrator keeps thousands of requests in flight) are queued rather than refused.
constexpr int kListenBacklog = 65535;

// One accepted connection. Owned by its session coroutine (shared_ptr); the server's registry
// holds a raw pointer that the session removes before it ends.
struct Connection : std::enable_shared_from_this<Connection> {
  explicit Connection(tcp::socket socket) : stream(std::move(socket)) {}
  beast::tcp_stream stream;
  // Emitted by Server::close() so a handler awaiting something cancellable is woken.
  asio::cancellation_signal cancel;
  // True from the first byte of a request until its answer is written. stop() closes connections
  // that are not busy at once and lets busy ones finish.
  bool busy = false;
};

bool is_empty_body_status(unsigned status) { return (status >= 100 && status < 200) || status == 204 || status == 304; }

std::string allow_header(const std::vector<std::pair<Verb, Handler>>& methods) {
  std::string allow;
  for (const auto& [verb, handler] : methods) {
    if (!allow.empty()) allow += ", ";
    allow += std::string_view(bhttp::to_string(verb));
  }
  return allow;
}

Request to_request(bhttp::request<bhttp::string_body>&& in) {
  Request out;
  out.method = in.method();
  out.target = std::string(in.target());
  const std::size_t q = out.target.find('?');
  if (q == std::string::npos) {
    out.path = detail::percent_decode(out.target, false);
  } else {
    out.path = detail::percent_decode(std::string_view(out.target).substr(0, q), false);
    out.query = detail::parse_query(std::string_view(out.target).substr(q + 1));
  }
  for (const auto& field : in) {
    std::string name = detail::to_lower(field.name_string());
    auto [it, inserted] = out.headers.try_emplace(std::move(name), field.value());
    if (!inserted) {  // repeated header: combine as RFC 9110 section 5.3 allows
      it->second += ", ";
      it->second += std::string_view(field.value());
    }
  }
  out.body = std::move(in.body());
  return out;
}

}  // namespace

struct Server::Impl : std::enable_shared_from_this<Impl> {
  Impl(asio::io_context& io_in, ServerOptions options_in) : io(io_in), options(std::move(options_in)) {}

  asio::io_context& io;
  ServerOptions options;
  std::unordered_map<std::string, std::vector<std::pair<Verb, Handler>>> routes;  // path -> methods
  std::optional<tcp::acceptor> acceptor;
  std::uint16_t port = 0;
  bool stopping = false;  // no new requests: set by stop() and close()
  bool closed = false;    // close() ran: every socket is closed
  std::unordered_set<Connection*> connections;
  std::vector<asio::steady_timer*> drain_waiters;  // stop() calls waiting for connections to end
  ServerStats stats;

  void remove(Connection* conn) {
    connections.erase(conn);
    if (stopping && connections.empty()) {
      for (auto* waiter : drain_waiters) waiter->cancel();
    }
  }

  static void close_connection(Connection& conn) {
    beast::error_code ignored;
    conn.stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    conn.stream.socket().close(ignored);
  }

  void close_listener() {
    if (acceptor && acceptor->is_open()) {
      beast::error_code ignored;
      acceptor->close(ignored);
    }
  }

  void close_all() {
    stopping = true;
    closed = true;
    close_listener();
    // Copy first: waking a session never removes it synchronously, but keep the loop obviously safe.
    std::vector<Connection*> all(connections.begin(), connections.end());
    for (Connection* conn : all) {
      close_connection(*conn);
      conn->cancel.emit(asio::cancellation_type::terminal);
      // co_spawn forwards the cancellation to the coroutine through a handler it dispatches to the
      // executor, which refers to state stored in `conn->cancel`. Keep the connection alive until
      // after that handler has run, or a session that ends first frees the state under it.
      asio::post(io, [keep = conn->shared_from_this()] {});
    }
    // Every socket is closed now. A session still inside its handler leaves when the handler
    // returns (remove() then finds nothing); it no longer counts as an open connection.
    connections.clear();
  }

  asio::awaitable<void> accept_loop(std::shared_ptr<Impl> self);
  asio::awaitable<void> session(std::shared_ptr<Impl> self, std::shared_ptr<Connection> conn);
  asio::awaitable<Response> dispatch(Request request);
  // A route registered as "<prefix>*" serves every path that starts with <prefix> and has no exact
  // route of its own (the longest such prefix wins): per-resource paths such as /t/<id>/v1/...
  using Routes = std::unordered_map<std::string, std::vector<std::pair<Verb, Handler>>>;
  Routes::iterator prefix_route(const std::string& path) {
    auto best = routes.end();
    for (auto it = routes.begin(); it != routes.end(); ++it) {
      const auto& key = it->first;
      if (key.empty() || key.back() != '*' || path.compare(0, key.size() - 1, key, 0, key.size() - 1) != 0) continue;
      if (best == routes.end() || key.size() > best->first.size()) best = it;
    }
    return best;
  }
  // Writes `response` for a request of HTTP version `version`; returns false when the write failed.
  asio::awaitable<bool> write(Connection& conn, Response response, unsigned version, bool keep_alive,
                              bool head_only = false);
  bool serialize_head(std::string& head, const Response& response, unsigned status, unsigned version, bool keep_alive,
                      bool no_body) const;
  // Answers a request the server rejects before any handler runs (413, 400, 431), then closes the
  // connection after a short drain so the client can read the answer instead of a reset.
  asio::awaitable<void> reject(Connection& conn, Response response);
};

asio::awaitable<void> Server::Impl::accept_loop(std::shared_ptr<Impl> self) {
  while (!stopping) {
    auto [ec, socket] = co_await acceptor->async_accept(kNoThrow);
    if (stopping) break;
    if (ec) {
      if (ec == asio::error::operation_aborted) break;
      // Out of descriptors or a connection reset before accept: keep serving. A short pause keeps
      // an exhausted process from spinning on EMFILE.
      ARLO_WARN_EVERY(5.0, "http server on port {}: accept failed: {}", port, ec.message());
      asio::steady_timer pause(io, std::chrono::milliseconds(10));
      co_await pause.async_wait(kNoThrow);
      continue;
    }
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    auto conn = std::make_shared<Connection>(std::move(socket));
    connections.insert(conn.get());
    ++stats.connections_accepted;
    asio::co_spawn(io, session(self, conn), asio::bind_cancellation_slot(conn->cancel.slot(), asio::detached));
  }
}

asio::awaitable<void> Server::Impl::session(std::shared_ptr<Impl> self, std::shared_ptr<Connection> conn) {
  (void)self;  // held so the Impl outlives this session even if the Server is destroyed
  beast::flat_buffer buffer;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser;
  try {
    for (;;) {
      // 1. Wait for the first byte of the next request (idle_timeout).
      conn->busy = false;
      if (stopping) break;
      if (buffer.size() == 0) {
        conn->stream.expires_after(options.idle_timeout);
        auto [ec, n] = co_await conn->stream.async_read_some(buffer.prepare(kFirstReadBytes), kNoThrow);
        if (ec) {
          if (ec == beast::error::timeout) ++stats.timeouts;
          break;
        }
        buffer.commit(n);
      }
      conn->busy = true;

      // 2. Head and body (header_timeout, counted from the first byte).
      parser.emplace();
      parser->header_limit(kHeaderLimit);
      parser->body_limit(options.max_body_bytes);
      conn->stream.expires_after(options.header_timeout);
      beast::error_code ec;
      std::tie(ec, std::ignore) = co_await bhttp::async_read_header(conn->stream, buffer, *parser, kNoThrow);
      if (!ec && !parser->is_done()) {
        // Clients such as curl wait for "100 Continue" before sending a large body.
        const auto expect = parser->get()[bhttp::field::expect];
        if (beast::iequals(expect, "100-continue")) {
          static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
          auto [wec, wn] = co_await asio::async_write(conn->stream, asio::buffer(kContinue), kNoThrow);
          ec = wec;
        }
        if (!ec) std::tie(ec, std::ignore) = co_await bhttp::async_read(conn->stream, buffer, *parser, kNoThrow);
      }
      if (ec) {
        if (ec == bhttp::error::body_limit) {
          ++stats.requests;
          co_await reject(
              *conn,
              Response::error(413, fmt::format("request body exceeds the limit of {} bytes", options.max_body_bytes),
                              "request_too_large"));
        } else if (ec == bhttp::error::header_limit) {
          ++stats.requests;
          co_await reject(*conn, Response::error(431, "request header fields too large"));
        } else if (ec == beast::error::timeout) {
          ++stats.timeouts;
        } else if (ec != bhttp::error::end_of_stream && ec != asio::error::eof && ec != asio::error::connection_reset &&
                   ec != asio::error::operation_aborted && ec != bhttp::error::partial_message) {
          ++stats.requests;
          co_await reject(*conn, Response::error(400, fmt::format("malformed HTTP request: {}", ec.message())));
        }
        break;
      }
      ++stats.requests;

      // 3. Handler (no deadline: handlers own theirs).
      conn->stream.expires_never();
      auto message = parser->release();
      const unsigned version = message.version();
      const bool keep_alive = message.keep_alive();
      const bool head_only = message.method() == Verb::head;
      Response response = co_await dispatch(to_request(std::move(message)));

      // 4. Answer. A stopping server says "Connection: close" and ends the session.
      const bool keep = keep_alive && !stopping;
      if (!co_await write(*conn, std::move(response), version, keep, head_only) || !keep) break;
    }
  } catch (const std::exception& e) {
    // Reached only through cancellation by close() (asio throws when a cancelled coroutine awaits
    // again) or a bug; either way the connection ends.
    ARLO_DEBUG("http server session ended: {}", e.what());
  }
  if (!closed) close_connection(*conn);
  remove(conn.get());
}

asio::awaitable<Response> Server::Impl::dispatch(Request request) {
  if (!options.token.empty() &&
      std::find(options.open_paths.begin(), options.open_paths.end(), request.path) == options.open_paths.end()) {
    const auto given = request.headers.find("authorization");
    if (given == request.headers.end() || !auth::bearer_matches(given->second, options.token)) {
      Response r =
          Response::error(401,
                          given == request.headers.end()
                              ? fmt::format("{} needs a token: send 'Authorization: Bearer <token>'", request.path)
                              : fmt::format("{}: the bearer token is wrong", request.path),
                          "authentication_error");
      r.headers.emplace("WWW-Authenticate", "Bearer");
      co_return r;
    }
  }
  auto route = routes.find(request.path);
  if (route == routes.end()) route = prefix_route(request.path);
  if (route == routes.end()) {
    co_return Response::error(404, fmt::format("no route for {}", request.path), "not_found_error");
  }
  const auto method = std::find_if(route->second.begin(), route->second.end(),
                                   [&](const auto& entry) { return entry.first == request.method; });
  if (method == route->second.end()) {
    Response r = Response::error(
        405,
        fmt::format("method {} not allowed on {}", std::string_view(bhttp::to_string(request.method)), request.path),
        "method_not_allowed");
    r.headers.emplace("Allow", allow_header(route->second));
    co_return r;
  }
  // Handlers are not supposed to throw; when one does, the client gets a 500 and the server lives.
  std::string what;
  const std::string path = request.path;
  const Verb verb = request.method;
  try {
    co_return co_await method->second(std::move(request));
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "unknown exception";
  }
  ARLO_ERROR_EVERY(1.0, "http handler for {} {} threw: {}", std::string_view(bhttp::to_string(verb)), path, what);
  co_return Response::error(500, fmt::format("internal error in handler: {}", what), "server_error");
}

// Status line and headers, serialised directly (cheaper than Beast's serializer on the hot path).
// Returns false when the handler supplied a header name or value that would break the message.
bool Server::Impl::serialize_head(std::string& head, const Response& response, unsigned status, unsigned version,
                                  bool keep_alive, bool no_body) const {
  const std::string_view reason = bhttp::obsolete_reason(bhttp::int_to_status(status));
  fmt::format_to(std::back_inserter(head), "HTTP/1.{} {} {}\r\n", version == 10 ? 0 : 1, status,
                 reason.empty() ? std::string_view("Unknown") : reason);
  if (!options.server_name.empty()) detail::append_header(head, "Server", options.server_name);
  for (const auto& [name, value] : response.headers) {
    if (!detail::valid_header_name(name) || !detail::valid_header_value(value)) return false;
    // Framing is ours: a handler cannot set the length, the transfer coding or the connection.
    if (beast::iequals(name, "content-length") || beast::iequals(name, "transfer-encoding") ||
        beast::iequals(name, "connection")) {
      continue;
    }
    detail::append_header(head, name, value);
  }
  if (!no_body) {
    if (!response.content_type.empty()) {
      if (!detail::valid_header_value(response.content_type)) return false;
      detail::append_header(head, "Content-Type", response.content_type);
    }
    fmt::format_to(std::back_inserter(head), "Content-Length: {}\r\n", response.body.size());
  }
  if (!keep_alive) {
    head.append("Connection: close\r\n");
  } else if (version == 10) {
    head.append("Connection: keep-alive\r\n");
  }
  head.append("\r\n");
  return true;
}

asio::awaitable<bool> Server::Impl::write(Connection& conn, Response response, unsigned version, bool keep_alive,
                                          bool head_only) {
  unsigned status = response.status >= 100 && response.status <= 599 ? static_cast<unsigned>(response.status) : 500u;
  bool no_body = is_empty_body_status(status);
  std::string head;
  head.reserve(128 + response.content_type.size() + options.server_name.size() + 64 * response.headers.size());
  if (!serialize_head(head, response, status, version, keep_alive, no_body)) {
    ARLO_ERROR_EVERY(1.0, "http server: handler returned an invalid header; answering 500 instead");
    response = Response::error(500, "handler produced an invalid response header", "server_error");
    status = 500;
    no_body = false;
    head.clear();
    serialize_head(head, response, status, version, keep_alive, no_body);
  }
  const std::array<asio::const_buffer, 2> buffers{
      asio::buffer(head), no_body || head_only ? asio::const_buffer() : asio::buffer(response.body)};
  conn.stream.expires_after(options.idle_timeout);
  auto [ec, n] = co_await asio::async_write(conn.stream, buffers, kNoThrow);
  if (ec == beast::error::timeout) ++stats.timeouts;
  co_return !ec;
}

asio::awaitable<void> Server::Impl::reject(Connection& conn, Response response) {
  if (!co_await write(conn, std::move(response), 11, false)) co_return;
  // Lingering close: stop sending, then read and discard what the client is still sending for a
  // moment. Closing with unread data would reset the connection and the client might lose the answer.
  beast::error_code ignored;
  conn.stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
  conn.stream.expires_after(std::min<Duration>(options.header_timeout, std::chrono::seconds(1)));
  std::array<char, 16384> sink;
  std::size_t drained = 0;
  while (drained < (8u << 20)) {
    auto [ec, n] = co_await conn.stream.async_read_some(asio::buffer(sink), kNoThrow);
    if (ec) break;
    drained += n;
  }
}

Server::Server(asio::io_context& io, ServerOptions options) : impl_(std::make_shared<Impl>(io, std::move(options))) {}

Server::~Server() { close(); }

void Server::route(Verb method, std::string path, Handler handler) {
  auto& methods = impl_->routes[std::move(path)];
  for (auto& entry : methods) {
    if (entry.first == method) {
      entry.second = std::move(handler);
      return;
    }
  }
  methods.emplace_back(method, std::move(handler));
}

Result<std::uint16_t> Server::start() {
  Impl& s = *impl_;
  if (s.acceptor) return make_error(ErrorCode::kInternal, "http server: start() called twice");
  ARLO_TRY(auth::require_token_off_loopback(fmt::format("http server {}", s.options.server_name), s.options.bind,
                                            s.options.token));
  beast::error_code ec;
  const auto address = asio::ip::make_address(s.options.bind, ec);
  if (ec) {
    return make_error(
        ErrorCode::kInvalidArgument,
        fmt::format("http server: bind address '{}' is not an IP address: {}", s.options.bind, ec.message()));
  }
  const tcp::endpoint endpoint(address, s.options.port);
  tcp::acceptor acceptor(s.io);
  auto fail = [&](std::string_view step) {
    return make_error(ErrorCode::kIo,
                      fmt::format("http server: {} {}:{}: {}", step, s.options.bind, s.options.port, ec.message()));
  };
  acceptor.open(endpoint.protocol(), ec);
  if (ec) return fail("open");
  acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (ec) return fail("set SO_REUSEADDR on");
  acceptor.bind(endpoint, ec);
  if (ec) return fail("bind");
  acceptor.listen(kListenBacklog, ec);
  if (ec) return fail("listen on");
  s.port = acceptor.local_endpoint(ec).port();
  if (ec) return fail("query port of");
  s.acceptor.emplace(std::move(acceptor));
  asio::co_spawn(s.io, s.accept_loop(impl_), asio::detached);
  ARLO_DEBUG("http server listening on {}:{}", s.options.bind, s.port);
  return s.port;
}

std::uint16_t Server::port() const { return impl_->port; }

asio::awaitable<void> Server::stop() {
  auto self = impl_;  // the Server may be destroyed while we wait; the Impl may not
  if (!self->stopping) {
    self->stopping = true;
    self->close_listener();
    // Connections between requests have nothing in flight: close them now.
    std::vector<Connection*> idle;
    for (Connection* conn : self->connections) {
      if (!conn->busy) idle.push_back(conn);
    }
    for (Connection* conn : idle) Impl::close_connection(*conn);
  }
  const auto deadline = std::chrono::steady_clock::now() + self->options.stop_grace;
  asio::steady_timer timer(self->io);
  self->drain_waiters.push_back(&timer);
  while (!self->connections.empty() && !self->closed && std::chrono::steady_clock::now() < deadline) {
    timer.expires_at(deadline);
    co_await timer.async_wait(kNoThrow);
  }
  std::erase(self->drain_waiters, &timer);
  if (!self->connections.empty() && !self->closed) {
    ARLO_WARN("http server on port {}: {} connection(s) still busy after the stop grace period; closing them",
              self->port, self->connections.size());
  }
  if (!self->closed) self->close_all();
}

void Server::close() {
  if (!impl_) return;
  impl_->close_all();
  for (auto* waiter : impl_->drain_waiters) waiter->cancel();
}

ServerStats Server::stats() const {
  ServerStats s = impl_->stats;
  s.connections_open = impl_->connections.size();
  return s;
}

}  // namespace arlo::http
