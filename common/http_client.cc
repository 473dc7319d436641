// arlo::http::Client: pooled keep-alive HTTP/1.1 client on Beast with deadlines and retries.
//
// A request runs as attempts; each attempt takes a pooled connection to host:port (or opens one),
// writes the request and reads the answer. beast::tcp_stream carries the request's deadline on
// every operation (connect, write, read; expires_at(deadline)), so a whole call, retries and
// backoff included, never outlives `ClientRequest::timeout`.
//
// Retry rules (RetryPolicy.max_attempts attempts at most, exponential backoff with jitter):
//   - a failed connect is retried for every request: the request never left this process;
//   - other connection failures and 5xx answers are retried only for idempotent requests;
//   - a pooled connection found dead when reused (the server closed it while idle) is replaced
//     once at no cost in attempts, for idempotent requests;
//   - when the next backoff would end past the deadline, the last outcome is returned at once.
//
// Hot path: the Beast request is built once per call and re-sent on retries (no body copies),
// connections are reused LIFO (warm caches), IP literals skip the resolver, TCP_NODELAY is set.
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <iterator>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <random>
#include <unordered_map>
#include <vector>

#include "common/http.h"
#include "common/http_util.h"
#include "common/log.h"

namespace arlo::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kNoThrow = asio::as_tuple(asio::use_awaitable);
constexpr std::uint32_t kHeaderLimit = 64 * 1024;
constexpr Duration kResolveCacheTtl = std::chrono::seconds(30);

struct Url {
  std::string host;       // without brackets
  std::uint16_t port = 80;
  std::string target;     // "/path?query", never empty
  std::string host_header;  // "host:port" as sent in Host
  std::string pool_key;     // "host:port"
};

Result<Url> parse_url(std::string_view url) {
  constexpr std::string_view kScheme = "http://";
  if (url.size() < kScheme.size() || !beast::iequals(url.substr(0, kScheme.size()), kScheme)) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("url '{}' is not http://host[:port]/path (only plain http is supported)", url));
  }
  std::string_view rest = url.substr(kScheme.size());
  const std::size_t slash = rest.find_first_of("/?");
  std::string_view authority = rest.substr(0, slash);
  Url out;
  out.target = slash == std::string_view::npos ? "/" : std::string(rest.substr(slash));
  if (!out.target.empty() && out.target.front() == '?') out.target.insert(out.target.begin(), '/');
  if (const std::size_t hash = out.target.find('#'); hash != std::string::npos) out.target.resize(hash);
  std::string_view port_text;
  if (!authority.empty() && authority.front() == '[') {  // [::1]:8080
    const std::size_t close = authority.find(']');
    if (close == std::string_view::npos) {
      return make_error(ErrorCode::kInvalidArgument, fmt::format("url '{}': unterminated IPv6 address", url));
    }
    out.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') {
        return make_error(ErrorCode::kInvalidArgument, fmt::format("url '{}': junk after IPv6 address", url));
      }
      port_text = after.substr(1);
    }
  } else {
    const std::size_t colon = authority.rfind(':');
    out.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) port_text = authority.substr(colon + 1);
  }
  if (out.host.empty()) return make_error(ErrorCode::kInvalidArgument, fmt::format("url '{}' has no host", url));
  if (!port_text.empty()) {
    unsigned port = 0;
    const auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (ec != std::errc{} || ptr != port_text.data() + port_text.size() || port == 0 || port > 65535) {
      return make_error(ErrorCode::kInvalidArgument, fmt::format("url '{}': bad port '{}'", url, port_text));
    }
    out.port = static_cast<std::uint16_t>(port);
  }
  const bool v6 = out.host.find(':') != std::string::npos;
  out.pool_key = v6 ? fmt::format("[{}]:{}", out.host, out.port) : fmt::format("{}:{}", out.host, out.port);
  out.host_header = out.pool_key;
  return out;
}

bool idempotent_by_method(Verb v) {
  switch (v) {
    case Verb::get:
    case Verb::head:
    case Verb::put:
    case Verb::delete_:
    case Verb::options:
    case Verb::trace:
      return true;
    default:
      return false;
  }
}

// A pooled connection. The buffer lives with the connection: bytes after one response (there
// should be none) belong to the next.
struct Connection {
  explicit Connection(asio::io_context& io) : stream(io) {}
  beast::tcp_stream stream;
  beast::flat_buffer buffer;
};

// A keep-alive connection can be closed by the server while it sits in the pool. One
// non-blocking peek tells: "would block" means alive and quiet; EOF, an error or unexpected bytes
// mean it must not be reused.
bool looks_alive(Connection& conn) {
  if (!conn.stream.socket().is_open() || conn.buffer.size() != 0) return false;
  char byte;
  const ssize_t n = ::recv(conn.stream.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

// How one attempt failed.
enum class Failure {
  kNone,
  kConnect,    // never connected: the request did not leave
  kTransport,  // write/read failed before a complete answer
  kTimeout,
  kCancelled,
  kParse,
  kTooLarge,
};

struct AttemptResult {
  Failure failure = Failure::kNone;
  bool reused = false;          // the attempt ran on a pooled connection
  bool got_response_bytes = false;
  std::string detail;           // error text when failure != kNone
  Response response;
};

}  // namespace

struct Client::Impl {
  Impl(asio::io_context& io_in, ClientOptions options_in)
      : io(io_in), options(std::move(options_in)), rng(std::random_device{}()) {}

  struct HostPool {
    std::vector<std::unique_ptr<Connection>> idle;  // LIFO: the most recently used is warmest
    std::vector<tcp::endpoint> endpoints;           // resolved (or literal) addresses
    Clock::time_point resolved_at{};
  };

  asio::io_context& io;
  ClientOptions options;
  std::unordered_map<std::string, HostPool> pools;  // "host:port" -> pool
  std::minstd_rand rng;                              // backoff jitter only
  ClientStats stats;

  asio::awaitable<Result<std::vector<tcp::endpoint>>> endpoints_for(const Url& url, Clock::time_point deadline);
  // `message` is the serialised request (head, body); it stays untouched so retries re-send it.
  asio::awaitable<AttemptResult> attempt(const Url& url, const std::array<asio::const_buffer, 2>& message,
                                         bool head_request, Clock::time_point deadline);
  Duration backoff(const RetryPolicy& policy, int attempt);
};

asio::awaitable<Result<std::vector<tcp::endpoint>>> Client::Impl::endpoints_for(const Url& url,
                                                                               Clock::time_point deadline) {
  HostPool& pool = pools[url.pool_key];
  const auto now = Clock::now();
  if (!pool.endpoints.empty() && now - pool.resolved_at < kResolveCacheTtl) co_return pool.endpoints;
  beast::error_code ec;
  const auto literal = asio::ip::make_address(url.host, ec);
  std::vector<tcp::endpoint> endpoints;
  if (!ec) {
    endpoints.emplace_back(literal, url.port);
  } else {
    // The resolver runs getaddrinfo on Asio's helper thread; bound the wait by the deadline.
    tcp::resolver resolver(io);
    asio::steady_timer guard(io, deadline);
    bool timed_out = false;
    guard.async_wait([&](beast::error_code wait_ec) {
      if (!wait_ec) {
        timed_out = true;
        resolver.cancel();
      }
    });
    auto [rec, results] = co_await resolver.async_resolve(url.host, std::to_string(url.port), kNoThrow);
    guard.cancel();
    if (timed_out) co_return make_error(ErrorCode::kTimeout, fmt::format("resolving {}: deadline expired", url.host));
    if (rec) {
      co_return make_error(ErrorCode::kUnavailable, fmt::format("resolving {}: {}", url.host, rec.message()));
    }
    for (const auto& entry : results) endpoints.push_back(entry.endpoint());
    if (endpoints.empty()) co_return make_error(ErrorCode::kUnavailable, fmt::format("resolving {}: no address", url.host));
  }
  HostPool& fresh = pools[url.pool_key];  // re-find: the map may have changed while resolving
  fresh.endpoints = endpoints;
  fresh.resolved_at = Clock::now();
  co_return endpoints;
}

asio::awaitable<AttemptResult> Client::Impl::attempt(const Url& url, const std::array<asio::const_buffer, 2>& message,
                                                     bool head_request, Clock::time_point deadline) {
  AttemptResult out;
  ++stats.attempts;
  auto classify = [&](const beast::error_code& ec, Failure transport_kind) {
    if (ec == beast::error::timeout) {
      out.failure = Failure::kTimeout;
    } else if (ec == asio::error::operation_aborted) {
      out.failure = Failure::kCancelled;
    } else if (ec == bhttp::error::body_limit || ec == bhttp::error::buffer_overflow) {
      out.failure = Failure::kTooLarge;
    } else if (ec == bhttp::error::header_limit) {
      out.failure = Failure::kTooLarge;
    } else if (ec.category() == bhttp::make_error_code(bhttp::error::end_of_stream).category() &&
               ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message) {
      out.failure = Failure::kParse;
    } else {
      out.failure = transport_kind;
    }
    out.detail = ec.message();
  };

  std::unique_ptr<Connection> conn;
  {
    auto& idle = pools[url.pool_key].idle;
    while (!idle.empty()) {
      std::unique_ptr<Connection> candidate = std::move(idle.back());
      idle.pop_back();
      if (looks_alive(*candidate)) {
        conn = std::move(candidate);
        break;
      }
    }
  }
  if (conn) {
    out.reused = true;
    ++stats.connections_reused;
  } else {
    auto endpoints = co_await endpoints_for(url, deadline);
    if (!endpoints) {
      out.failure = endpoints.error().code() == ErrorCode::kTimeout ? Failure::kTimeout : Failure::kConnect;
      out.detail = endpoints.error().message();
      co_return out;
    }
    conn = std::make_unique<Connection>(io);
    conn->stream.expires_at(deadline);
    auto [ec, endpoint] = co_await conn->stream.async_connect(*endpoints, kNoThrow);
    if (ec) {
      classify(ec, Failure::kConnect);
      co_return out;
    }
    beast::error_code ignored;
    conn->stream.socket().set_option(tcp::no_delay(true), ignored);
    ++stats.connections_opened;
  }

  conn->stream.expires_at(deadline);
  {
    auto [ec, n] = co_await asio::async_write(conn->stream, message, kNoThrow);
    if (ec) {
      classify(ec, Failure::kTransport);
      co_return out;
    }
  }
  bhttp::response_parser<bhttp::string_body> parser;
  parser.header_limit(kHeaderLimit);
  parser.body_limit(options.max_response_bytes);
  if (head_request) parser.skip(true);
  {
    auto [ec, n] = co_await bhttp::async_read(conn->stream, conn->buffer, parser, kNoThrow);
    out.got_response_bytes = parser.got_some();
    if (ec) {
      classify(ec, Failure::kTransport);
      co_return out;
    }
  }

  auto& answer = parser.get();
  out.response.status = static_cast<int>(answer.result_int());
  out.response.content_type.clear();
  for (const auto& field : answer) {
    if (field.name() == bhttp::field::content_type) {
      out.response.content_type = std::string(field.value());
      continue;
    }
    std::string name = detail::to_lower(field.name_string());
    auto [it, inserted] = out.response.headers.try_emplace(std::move(name), field.value());
    if (!inserted) {
      it->second += ", ";
      it->second += std::string_view(field.value());
    }
  }
  const bool keep_alive = answer.keep_alive() && parser.is_done();
  out.response.body = std::move(answer.body());

  auto& idle = pools[url.pool_key].idle;
  if (keep_alive && idle.size() < options.max_idle_per_host) {
    conn->stream.expires_never();
    idle.push_back(std::move(conn));
  } else {
    beast::error_code ignored;
    conn->stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    conn->stream.socket().close(ignored);
  }
  co_return out;
}

Duration Client::Impl::backoff(const RetryPolicy& policy, int attempt) {
  // Exponential, capped, then "equal jitter": uniformly in [d/2, d], so retries from many callers
  // spread out but never collapse to zero.
  using Ns = std::chrono::nanoseconds;
  const double base = static_cast<double>(std::chrono::duration_cast<Ns>(policy.initial_backoff).count());
  const double cap = static_cast<double>(std::chrono::duration_cast<Ns>(policy.max_backoff).count());
  const double d = std::min(cap, base * std::pow(2.0, std::max(0, attempt - 1)));
  std::uniform_real_distribution<double> jitter(0.5, 1.0);
  return std::chrono::duration_cast<Duration>(Ns(static_cast<Ns::rep>(std::max(0.0, d * jitter(rng)))));
}

Client::Client(asio::io_context& io, ClientOptions options) : impl_(std::make_shared<Impl>(io, std::move(options))) {}

Client::~Client() { close_idle(); }

asio::awaitable<Result<Response>> Client::request(ClientRequest request) {
  auto self = impl_;  // keeps the pool alive if the Client is destroyed mid-call
  Impl& c = *self;
  ++c.stats.requests;
  const auto deadline = Clock::now() + request.timeout;
  const std::string_view method_name = bhttp::to_string(request.method);
  auto fail = [&](ErrorCode code, std::string_view what) {
    return make_error(code, fmt::format("{} {}: {}", method_name, request.url, what));
  };

  auto url = parse_url(request.url);
  if (!url) co_return std::unexpected(std::move(url).error());

  // Serialise the head once (cheaper than Beast's serializer; retries re-send the same bytes).
  if (url->target.find_first_of(" \r\n") != std::string::npos) {
    co_return fail(ErrorCode::kInvalidArgument, "the path contains a space or a line break");
  }
  const bool has_body = !request.body.empty() || request.method == Verb::post || request.method == Verb::put ||
                        request.method == Verb::patch;
  std::string head;
  head.reserve(128 + url->target.size() + url->host_header.size() + 64 * request.headers.size());
  fmt::format_to(std::back_inserter(head), "{} {} HTTP/1.1\r\n", method_name, url->target);
  detail::append_header(head, "Host", url->host_header);
  bool user_agent_set = false, content_type_set = false, authorization_set = false;
  for (const auto& [name, value] : request.headers) {
    if (!detail::valid_header_name(name) || !detail::valid_header_value(value)) {
      co_return fail(ErrorCode::kInvalidArgument, fmt::format("invalid header '{}'", name));
    }
    // Framing and the connection are the client's business.
    if (beast::iequals(name, "host") || beast::iequals(name, "content-length") ||
        beast::iequals(name, "transfer-encoding") || beast::iequals(name, "connection")) {
      continue;
    }
    user_agent_set = user_agent_set || beast::iequals(name, "user-agent");
    content_type_set = content_type_set || beast::iequals(name, "content-type");
    authorization_set = authorization_set || beast::iequals(name, "authorization");
    detail::append_header(head, name, value);
  }
  if (!user_agent_set && !c.options.user_agent.empty()) detail::append_header(head, "User-Agent", c.options.user_agent);
  if (!authorization_set && !c.options.token.empty()) {
    if (!detail::valid_header_value(c.options.token)) co_return fail(ErrorCode::kInvalidArgument, "invalid token");
    detail::append_header(head, "Authorization", "Bearer " + c.options.token);
  }
  if (has_body) {
    if (!content_type_set && !request.content_type.empty()) {
      if (!detail::valid_header_value(request.content_type)) {
        co_return fail(ErrorCode::kInvalidArgument, "invalid content type");
      }
      detail::append_header(head, "Content-Type", request.content_type);
    }
    fmt::format_to(std::back_inserter(head), "Content-Length: {}\r\n", request.body.size());
  }
  head.append("\r\n");
  const std::array<asio::const_buffer, 2> message{asio::buffer(head), asio::buffer(request.body)};
  const bool head_request = request.method == Verb::head;

  const bool idempotent = request.idempotent.value_or(idempotent_by_method(request.method));
  const RetryPolicy policy = request.retry.value_or(c.options.retry);
  const int max_attempts = std::max(1, policy.max_attempts);
  bool stale_retry_left = true;

  std::optional<Response> last_response;  // last 5xx, returned when retries are spent
  std::string last_error;
  for (int attempt = 1;; ++attempt) {
    if (Clock::now() >= deadline) {
      co_return fail(ErrorCode::kTimeout, fmt::format("deadline expired after {} attempt(s)", attempt - 1));
    }
    AttemptResult r = co_await c.attempt(*url, message, head_request, deadline);
    bool retryable = false;
    switch (r.failure) {
      case Failure::kNone:
        if (r.response.status < 500 || !idempotent || attempt >= max_attempts) co_return std::move(r.response);
        last_response = std::move(r.response);
        retryable = true;
        break;
      case Failure::kTimeout:
        co_return fail(ErrorCode::kTimeout, fmt::format("deadline expired (attempt {}): {}", attempt, r.detail));
      case Failure::kCancelled:
        co_return fail(ErrorCode::kCancelled, "cancelled");
      case Failure::kParse:
        co_return fail(ErrorCode::kParse, fmt::format("malformed response: {}", r.detail));
      case Failure::kTooLarge:
        co_return fail(ErrorCode::kResourceExhausted,
                       fmt::format("response exceeds the limit of {} bytes: {}", c.options.max_response_bytes, r.detail));
      case Failure::kConnect:
        last_response.reset();
        last_error = fmt::format("cannot connect: {}", r.detail);
        retryable = true;
        break;
      case Failure::kTransport:
        if (r.reused && !r.got_response_bytes && idempotent && stale_retry_left) {
          // The pooled connection died while idle; try a fresh one without spending an attempt.
          stale_retry_left = false;
          --attempt;
          continue;
        }
        last_response.reset();
        last_error = fmt::format("connection failed: {}", r.detail);
        retryable = idempotent;
        break;
    }
    if (!retryable || attempt >= max_attempts) {
      if (last_response) co_return std::move(*last_response);
      co_return fail(ErrorCode::kUnavailable, fmt::format("{} (after {} attempt(s))", last_error, attempt));
    }
    const Duration delay = c.backoff(policy, attempt);
    if (Clock::now() + delay >= deadline) {
      // Waiting would end past the deadline: report the last outcome now.
      if (last_response) co_return std::move(*last_response);
      co_return fail(ErrorCode::kUnavailable,
                     fmt::format("{} (after {} attempt(s); no time left to retry)", last_error, attempt));
    }
    asio::steady_timer timer(c.io, delay);
    auto [ec] = co_await timer.async_wait(kNoThrow);
    if (ec) co_return fail(ErrorCode::kCancelled, "cancelled during retry backoff");
  }
}

asio::awaitable<Result<Response>> Client::get(std::string url, Duration timeout) {
  ClientRequest r;
  r.method = Verb::get;
  r.url = std::move(url);
  r.timeout = timeout;
  co_return co_await request(std::move(r));
}

asio::awaitable<Result<Response>> Client::post_json(std::string url, nlohmann::json body, Duration timeout) {
  ClientRequest r;
  r.method = Verb::post;
  r.url = std::move(url);
  r.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  r.timeout = timeout;
  co_return co_await request(std::move(r));
}

void Client::close_idle() {
  if (!impl_) return;
  for (auto& [key, pool] : impl_->pools) {
    for (auto& conn : pool.idle) {
      beast::error_code ignored;
      conn->stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
      conn->stream.socket().close(ignored);
    }
    pool.idle.clear();
  }
}

ClientStats Client::stats() const { return impl_->stats; }

}  // namespace arlo::http
