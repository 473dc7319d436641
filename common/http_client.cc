// arlo::http::Client: pooled keep-alive HTTP/1.1 client on Beast with deadlines and retries.
//
// A request runs as attempts; each attempt takes a pooled connection to host:port (or opens one),
// writes the request and reads the answer. The request's deadline is a timer on the client's Clock
// (ClientOptions::clock; the real one by default) that closes the attempt's connection when it
// fires, ending whichever of resolve, connect, write or read is pending; backoff waits on the same
// clock. So a whole call, retries and backoff included, never outlives `ClientRequest::timeout`,
// and tests drive deadlines and backoff with a FakeClock instead of waiting.
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

#include "common/async/clock.h"
#include "common/async/coro.h"
#include "common/http.h"
#include "common/http_util.h"
#include "common/log.h"

namespace arlo::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using TimePoint = arlo::Clock::time_point;

namespace {

constexpr auto kNoThrow = asio::as_tuple(asio::use_awaitable);
constexpr std::uint32_t kHeaderLimit = 64 * 1024;
constexpr Duration kResolveCacheTtl = std::chrono::seconds(30);

struct Url {
  std::string host;  // without brackets
  std::uint16_t port = 80;
  std::string target;       // "/path?query", never empty
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
    case Verb::trace: return true;
    default: return false;
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
  bool reused = false;  // the attempt ran on a pooled connection
  bool got_response_bytes = false;
  std::string detail;  // error text when failure != kNone
  Response response;
};

// Sorts a failed socket operation into a Failure; `transport_kind` is what a plain connection error
// means at this step (kConnect before the connection exists, kTransport after). `timed_out`: the
// call's deadline fired and closed the connection (the operation then reports operation_aborted).
void classify(const beast::error_code& ec, Failure transport_kind, bool timed_out, AttemptResult& out) {
  if (timed_out || ec == beast::error::timeout) {
    out.failure = Failure::kTimeout;
  } else if (ec == asio::error::operation_aborted) {
    out.failure = Failure::kCancelled;
  } else if (ec == bhttp::error::body_limit || ec == bhttp::error::buffer_overflow ||
             ec == bhttp::error::header_limit) {
    out.failure = Failure::kTooLarge;
  } else if (ec.category() == bhttp::make_error_code(bhttp::error::end_of_stream).category() &&
             ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message) {
    out.failure = Failure::kParse;
  } else {
    out.failure = transport_kind;
  }
  out.detail = timed_out ? "deadline expired" : ec.message();
}

// Copies a parsed Beast answer into a Response (the body is moved out). Repeated header fields
// are joined with ", ".
Response to_response(bhttp::response<bhttp::string_body>& answer) {
  Response out;
  out.status = static_cast<int>(answer.result_int());
  out.content_type.clear();
  for (const auto& field : answer) {
    if (field.name() == bhttp::field::content_type) {
      out.content_type = std::string(field.value());
      continue;
    }
    std::string name = detail::to_lower(field.name_string());
    auto [it, inserted] = out.headers.try_emplace(std::move(name), field.value());
    if (!inserted) {
      it->second += ", ";
      it->second += std::string_view(field.value());
    }
  }
  out.body = std::move(answer.body());
  return out;
}

void close_connection(Connection& conn) {
  beast::error_code ignored;
  conn.stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  conn.stream.socket().close(ignored);
}

bool is_framing_header(std::string_view name) {
  return beast::iequals(name, "host") || beast::iequals(name, "content-length") ||
         beast::iequals(name, "transfer-encoding") || beast::iequals(name, "connection");
}

// Serialises the request head (request line, headers, blank line) for `url`. Framing headers the
// caller set are dropped (they are the client's business); User-Agent, Authorization and
// Content-Type come from `options` / the request unless the caller set them. Errors
// (kInvalidArgument) name the offending header; the caller adds the method and URL.
Result<std::string> serialize_head(const ClientRequest& request, const Url& url, const ClientOptions& options) {
  if (url.target.find_first_of(" \r\n") != std::string::npos) {
    return make_error(ErrorCode::kInvalidArgument, "the path contains a space or a line break");
  }
  const bool has_body = !request.body.empty() || request.method == Verb::post || request.method == Verb::put ||
                        request.method == Verb::patch;
  std::string head;
  head.reserve(128 + url.target.size() + url.host_header.size() + 64 * request.headers.size());
  fmt::format_to(std::back_inserter(head), "{} {} HTTP/1.1\r\n", std::string_view(bhttp::to_string(request.method)),
                 url.target);
  detail::append_header(head, "Host", url.host_header);
  bool user_agent_set = false, content_type_set = false, authorization_set = false;
  for (const auto& [name, value] : request.headers) {
    if (!detail::valid_header_name(name) || !detail::valid_header_value(value)) {
      return make_error(ErrorCode::kInvalidArgument, fmt::format("invalid header '{}'", name));
    }
    if (is_framing_header(name)) continue;
    user_agent_set = user_agent_set || beast::iequals(name, "user-agent");
    content_type_set = content_type_set || beast::iequals(name, "content-type");
    authorization_set = authorization_set || beast::iequals(name, "authorization");
    detail::append_header(head, name, value);
  }
  if (!user_agent_set && !options.user_agent.empty()) detail::append_header(head, "User-Agent", options.user_agent);
  if (!authorization_set && !options.token.empty()) {
    if (!detail::valid_header_value(options.token)) return make_error(ErrorCode::kInvalidArgument, "invalid token");
    detail::append_header(head, "Authorization", "Bearer " + options.token);
  }
  if (has_body) {
    if (!content_type_set && !request.content_type.empty()) {
      if (!detail::valid_header_value(request.content_type)) {
        return make_error(ErrorCode::kInvalidArgument, "invalid content type");
      }
      detail::append_header(head, "Content-Type", request.content_type);
    }
    fmt::format_to(std::back_inserter(head), "Content-Length: {}\r\n", request.body.size());
  }
  head.append("\r\n");
  return head;
}

// One request() call's retry bookkeeping: its rules and what the failed attempts left to report.
struct Call {
  std::string_view method_name;
  const std::string& url;
  bool idempotent = false;
  RetryPolicy policy;
  int max_attempts = 1;
  bool stale_retry_left = true;           // one free retry for a pooled connection found dead
  std::optional<Response> last_response;  // the last 5xx, returned when retries are spent
  std::string last_error;                 // the last connection failure otherwise

  std::unexpected<Error> fail(ErrorCode code, std::string_view what) const {
    return make_error(code, fmt::format("{} {}: {}", method_name, url, what));
  }
  // The outcome once no attempt is left after `attempts` (or no time for the next backoff).
  Result<Response> spent(int attempts, bool no_time_left) {
    if (last_response) return std::move(*last_response);
    if (no_time_left) {
      return fail(ErrorCode::kUnavailable,
                  fmt::format("{} (after {} attempt(s); no time left to retry)", last_error, attempts));
    }
    return fail(ErrorCode::kUnavailable, fmt::format("{} (after {} attempt(s))", last_error, attempts));
  }
};

// What request() does after an attempt.
enum class Next {
  kDone,       // the call's outcome is decided
  kBackoff,    // retry after a backoff
  kRetryFree,  // retry at once without counting the attempt (stale pooled connection)
};

}  // namespace

struct Client::Impl {
  Impl(asio::io_context& io_in, ClientOptions options_in)
      : io(io_in), options(std::move(options_in)), rng(std::random_device{}()) {
    if (!options.clock) {
      own_clock = std::make_unique<RealClock>(io.get_executor());
      options.clock = own_clock.get();
    }
    clock = options.clock;
  }

  struct HostPool {
    std::vector<std::unique_ptr<Connection>> idle;  // LIFO: the most recently used is warmest
    std::vector<tcp::endpoint> endpoints;           // resolved (or literal) addresses
    TimePoint resolved_at{};
  };

  asio::io_context& io;
  ClientOptions options;
  std::unique_ptr<arlo::Clock> own_clock;           // the real clock, when options.clock is null
  arlo::Clock* clock = nullptr;                     // deadlines, backoff and the resolver cache
  std::unordered_map<std::string, HostPool> pools;  // "host:port" -> pool
  std::minstd_rand rng;                             // backoff jitter only
  ClientStats stats;

  asio::awaitable<Result<std::vector<tcp::endpoint>>> endpoints_for(const Url& url, TimePoint deadline);
  asio::awaitable<Result<std::vector<tcp::endpoint>>> resolve(const Url& url, TimePoint deadline);
  // `message` is the serialised request (head, body); it stays untouched so retries re-send it.
  asio::awaitable<AttemptResult> attempt(const Url& url, const std::array<asio::const_buffer, 2>& message,
                                         bool head_request, TimePoint deadline);
  std::unique_ptr<Connection> take_idle(const std::string& pool_key, AttemptResult& out);
  asio::awaitable<std::unique_ptr<Connection>> open_connection(const Url& url, TimePoint deadline, bool& timed_out,
                                                               AttemptResult& out);
  void release(std::unique_ptr<Connection> conn, bool keep_alive, const std::string& pool_key);
  std::unique_ptr<Timer> close_at(Connection& conn, TimePoint deadline, bool& timed_out);
  Next settle(Call& call, AttemptResult& r, int attempt, std::optional<Result<Response>>& outcome) const;
  Duration backoff(const RetryPolicy& policy, int attempt);
};

asio::awaitable<Result<std::vector<tcp::endpoint>>> Client::Impl::endpoints_for(const Url& url, TimePoint deadline) {
  HostPool& pool = pools[url.pool_key];
  if (!pool.endpoints.empty() && clock->now() - pool.resolved_at < kResolveCacheTtl) co_return pool.endpoints;
  beast::error_code ec;
  const auto literal = asio::ip::make_address(url.host, ec);
  std::vector<tcp::endpoint> endpoints;
  if (!ec) {
    endpoints.emplace_back(literal, url.port);
  } else {
    auto resolved = co_await resolve(url, deadline);
    if (!resolved) co_return resolved;
    endpoints = std::move(*resolved);
  }
  HostPool& fresh = pools[url.pool_key];  // re-find: the map may have changed while resolving
  fresh.endpoints = endpoints;
  fresh.resolved_at = clock->now();
  co_return endpoints;
}

// Resolves a host name. The resolver runs getaddrinfo on Asio's helper thread; the wait is bounded
// by the deadline (kTimeout). kUnavailable when the name does not resolve.
asio::awaitable<Result<std::vector<tcp::endpoint>>> Client::Impl::resolve(const Url& url, TimePoint deadline) {
  tcp::resolver resolver(io);
  bool timed_out = false;
  auto guard = clock->schedule(deadline, [&] {
    timed_out = true;
    resolver.cancel();
  });
  auto [rec, results] = co_await resolver.async_resolve(url.host, std::to_string(url.port), kNoThrow);
  guard->cancel();
  if (timed_out) co_return make_error(ErrorCode::kTimeout, fmt::format("resolving {}: deadline expired", url.host));
  if (rec) co_return make_error(ErrorCode::kUnavailable, fmt::format("resolving {}: {}", url.host, rec.message()));
  std::vector<tcp::endpoint> endpoints;
  for (const auto& entry : results) endpoints.push_back(entry.endpoint());
  if (endpoints.empty())
    co_return make_error(ErrorCode::kUnavailable, fmt::format("resolving {}: no address", url.host));
  co_return endpoints;
}

// The warmest pooled connection to `pool_key` that still looks alive (dead ones are dropped), or
// null.
std::unique_ptr<Connection> Client::Impl::take_idle(const std::string& pool_key, AttemptResult& out) {
  auto& idle = pools[pool_key].idle;
  while (!idle.empty()) {
    std::unique_ptr<Connection> candidate = std::move(idle.back());
    idle.pop_back();
    if (looks_alive(*candidate)) {
      out.reused = true;
      ++stats.connections_reused;
      return candidate;
    }
  }
  return nullptr;
}

// The call's deadline on the client's clock: at `deadline` the connection is closed (its pending
// operation ends with operation_aborted) and `timed_out` is set. Destroying the timer disarms it.
std::unique_ptr<Timer> Client::Impl::close_at(Connection& conn, TimePoint deadline, bool& timed_out) {
  return clock->schedule(deadline, [&conn, &timed_out] {
    timed_out = true;
    beast::error_code ignored;
    conn.stream.socket().close(ignored);
  });
}

// Resolves and connects a new connection (TCP_NODELAY set). On failure returns null with `out`
// filled in: kConnect (the request never left), kTimeout, kCancelled.
asio::awaitable<std::unique_ptr<Connection>> Client::Impl::open_connection(const Url& url, TimePoint deadline,
                                                                           bool& timed_out, AttemptResult& out) {
  auto endpoints = co_await endpoints_for(url, deadline);
  if (!endpoints) {
    out.failure = endpoints.error().code() == ErrorCode::kTimeout ? Failure::kTimeout : Failure::kConnect;
    out.detail = endpoints.error().message();
    co_return nullptr;
  }
  auto conn = std::make_unique<Connection>(io);
  auto watchdog = close_at(*conn, deadline, timed_out);
  auto [ec, endpoint] = co_await conn->stream.async_connect(*endpoints, kNoThrow);
  if (ec) {
    classify(ec, Failure::kConnect, timed_out, out);
    co_return nullptr;
  }
  beast::error_code ignored;
  conn->stream.socket().set_option(tcp::no_delay(true), ignored);
  ++stats.connections_opened;
  co_return conn;
}

// Returns a connection whose exchange completed to the pool when it may be kept alive and the pool
// has room; closes it otherwise.
void Client::Impl::release(std::unique_ptr<Connection> conn, bool keep_alive, const std::string& pool_key) {
  auto& idle = pools[pool_key].idle;
  if (keep_alive && idle.size() < options.max_idle_per_host) {
    idle.push_back(std::move(conn));
  } else {
    close_connection(*conn);
  }
}

asio::awaitable<AttemptResult> Client::Impl::attempt(const Url& url, const std::array<asio::const_buffer, 2>& message,
                                                     bool head_request, TimePoint deadline) {
  AttemptResult out;
  ++stats.attempts;
  bool timed_out = false;
  std::unique_ptr<Connection> conn = take_idle(url.pool_key, out);
  if (!conn) {
    conn = co_await open_connection(url, deadline, timed_out, out);
    if (!conn) co_return out;
  }
  auto watchdog = close_at(*conn, deadline, timed_out);
  {
    auto [ec, n] = co_await asio::async_write(conn->stream, message, kNoThrow);
    if (ec) {
      classify(ec, Failure::kTransport, timed_out, out);
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
      classify(ec, Failure::kTransport, timed_out, out);
      co_return out;
    }
  }
  watchdog.reset();  // the connection may outlive this call in the pool
  const bool keep_alive = parser.get().keep_alive() && parser.is_done();
  out.response = to_response(parser.get());
  release(std::move(conn), keep_alive, url.pool_key);
  co_return out;
}

// Decides what attempt number `attempt` (outcome `r`) means for the call. kDone sets `outcome`:
// a response (2xx-4xx, or a 5xx once retries are spent or not allowed) or the error. Connection
// failures and 5xx answers are retried within the policy (see the file comment).
Next Client::Impl::settle(Call& call, AttemptResult& r, int attempt, std::optional<Result<Response>>& outcome) const {
  bool retryable = false;
  switch (r.failure) {
    case Failure::kNone:
      if (r.response.status < 500 || !call.idempotent || attempt >= call.max_attempts) {
        outcome.emplace(std::move(r.response));
        return Next::kDone;
      }
      call.last_response = std::move(r.response);
      retryable = true;
      break;
    case Failure::kTimeout:
      outcome.emplace(
          call.fail(ErrorCode::kTimeout, fmt::format("deadline expired (attempt {}): {}", attempt, r.detail)));
      return Next::kDone;
    case Failure::kCancelled: outcome.emplace(call.fail(ErrorCode::kCancelled, "cancelled")); return Next::kDone;
    case Failure::kParse:
      outcome.emplace(call.fail(ErrorCode::kParse, fmt::format("malformed response: {}", r.detail)));
      return Next::kDone;
    case Failure::kTooLarge:
      outcome.emplace(call.fail(ErrorCode::kResourceExhausted, fmt::format("response exceeds the limit of {} bytes: {}",
                                                                           options.max_response_bytes, r.detail)));
      return Next::kDone;
    case Failure::kConnect:
      call.last_response.reset();
      call.last_error = fmt::format("cannot connect: {}", r.detail);
      retryable = true;
      break;
    case Failure::kTransport:
      if (r.reused && !r.got_response_bytes && call.idempotent && call.stale_retry_left) {
        // The pooled connection died while idle; try a fresh one without spending an attempt.
        call.stale_retry_left = false;
        return Next::kRetryFree;
      }
      call.last_response.reset();
      call.last_error = fmt::format("connection failed: {}", r.detail);
      retryable = call.idempotent;
      break;
  }
  if (!retryable || attempt >= call.max_attempts) {
    outcome.emplace(call.spent(attempt, false));
    return Next::kDone;
  }
  return Next::kBackoff;
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
  const auto deadline = c.clock->now() + request.timeout;
  const RetryPolicy policy = request.retry.value_or(c.options.retry);
  Call call{.method_name = bhttp::to_string(request.method),
            .url = request.url,
            .idempotent = request.idempotent.value_or(idempotent_by_method(request.method)),
            .policy = policy,
            .max_attempts = std::max(1, policy.max_attempts),
            .stale_retry_left = true,
            .last_response = std::nullopt,
            .last_error = {}};

  auto url = parse_url(request.url);
  if (!url) co_return std::unexpected(std::move(url).error());
  // Serialised once (cheaper than Beast's serializer; retries re-send the same bytes).
  auto head = serialize_head(request, *url, c.options);
  if (!head) co_return call.fail(head.error().code(), head.error().message());
  const std::array<asio::const_buffer, 2> message{asio::buffer(*head), asio::buffer(request.body)};
  const bool head_request = request.method == Verb::head;

  for (int attempt = 1;; ++attempt) {
    if (c.clock->now() >= deadline) {
      co_return call.fail(ErrorCode::kTimeout, fmt::format("deadline expired after {} attempt(s)", attempt - 1));
    }
    AttemptResult r = co_await c.attempt(*url, message, head_request, deadline);
    std::optional<Result<Response>> outcome;
    const Next next = c.settle(call, r, attempt, outcome);
    if (next == Next::kDone) co_return std::move(*outcome);
    if (next == Next::kRetryFree) {
      --attempt;
      continue;
    }
    const Duration delay = c.backoff(call.policy, attempt);
    // Waiting would end past the deadline: report the last outcome now.
    if (c.clock->now() + delay >= deadline) co_return call.spent(attempt, true);
    ++c.stats.backoffs;
    if (!co_await cancellable_sleep_until(c.io.get_executor(), *c.clock, c.clock->now() + delay)) {
      co_return call.fail(ErrorCode::kCancelled, "cancelled during retry backoff");
    }
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
    for (auto& conn : pool.idle) close_connection(*conn);
    pool.idle.clear();
  }
}

ClientStats Client::stats() const { return impl_->stats; }

}  // namespace arlo::http
