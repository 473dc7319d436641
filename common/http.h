#pragma once
// HTTP/1.1 on Boost.Beast with C++20 coroutines: a server whose handlers never throw, and a client
// with a keep-alive connection pool, per-request deadlines and retries.
//
// Server: routes (method, exact path) to awaitable handlers. It enforces a body size limit (413),
// header and idle timeouts (slow clients are cut off), turns a handler exception into a 500 with a
// JSON error body (and logs it), answers unknown paths with 404 and wrong methods with 405, and
// stops gracefully: stop() closes the listener, lets in-flight requests finish up to a grace
// period, then closes the remaining connections.
//
// Client: one pool of idle keep-alive connections per host:port. Each request has a deadline that
// covers connect, write and read. Connection errors and 5xx answers are retried with exponential
// backoff (with jitter) on idempotent requests (GET, HEAD, PUT, DELETE, or when the caller marks the
// request idempotent), never past the deadline. A failed connect is retried for every method (the
// request never left); when the next backoff would end past the deadline the last outcome is
// returned at once. Header names and values are checked on both sides (no CR/LF injection);
// framing headers (Content-Length, Transfer-Encoding, Connection, Host) are set by the library.
//
// Threading: a Server or Client belongs to one io_context and is used from that context's thread.
#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/beast/http/verb.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

// GCC 12 reports a false -Wmismatched-new-delete at the end of every coroutine returning
// asio::awaitable (the frame's class-specific operator new/delete pair is matched correctly; GCC
// bug 109224 family). Silenced here so every translation unit that writes awaitable handlers
// against this header builds with -Werror.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace arlo {
class Clock;  // common/async/clock.h
}  // namespace arlo

namespace arlo::http {

using Verb = boost::beast::http::verb;
using Duration = std::chrono::steady_clock::duration;

struct Request {
  Verb method = Verb::get;
  std::string target;                          // as sent: "/pause?mode=keep"
  std::string path;                            // "/pause"
  std::map<std::string, std::string> query;    // {"mode": "keep"}, percent-decoded
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;

  // Parses the body as JSON; the error says where the JSON is malformed.
  Result<nlohmann::json> json() const;
  std::optional<std::string> query_param(const std::string& key) const;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::map<std::string, std::string> headers;  // extra headers

  static Response json(int status, const nlohmann::json& body);
  static Response text(int status, std::string body, std::string content_type = "text/plain; charset=utf-8");
  // OpenAI-style error body: {"error": {"message", "type", "param", "code"}}.
  static Response error(int status, std::string message, std::string type = "invalid_request_error",
                        std::optional<std::string> param = std::nullopt);
  Result<nlohmann::json> parse_json() const;
};

using Handler = std::function<boost::asio::awaitable<Response>(Request)>;

// Counters for tests, benchmarks and /metrics. Read from the io_context's thread.
struct ServerStats {
  std::uint64_t connections_accepted = 0;  // since start()
  std::uint64_t connections_open = 0;      // right now
  std::uint64_t requests = 0;              // complete requests read (handled or rejected)
  std::uint64_t timeouts = 0;              // connections cut off by header_timeout or idle_timeout
};

struct ServerOptions {
  std::string bind = "127.0.0.1";
  std::uint16_t port = 0;  // 0 = pick a free port
  std::size_t max_body_bytes = 16u << 20;
  Duration header_timeout = std::chrono::seconds(10);  // to receive a complete request head+body
  Duration idle_timeout = std::chrono::seconds(60);    // keep-alive connection with no request
  Duration stop_grace = std::chrono::seconds(5);
  std::string server_name = "arlo";
  // Bearer token (common/auth.h). When set, a request to any path but `open_paths` without
  // "Authorization: Bearer <token>" gets 401 with a JSON error. start() refuses a bind address that
  // is not loopback while no token is set.
  std::string token;
  std::vector<std::string> open_paths = {"/health"};
};

class Server {
 public:
  Server(boost::asio::io_context& io, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Register before start(). A second route for the same method and path replaces the first.
  void route(Verb method, std::string path, Handler handler);

  // Binds and starts accepting; returns the bound port.
  Result<std::uint16_t> start();
  std::uint16_t port() const;
  // Graceful stop (see above). Safe to call more than once; completes when all connections closed.
  boost::asio::awaitable<void> stop();
  // Immediate stop: closes listener and all connections now.
  void close();

  ServerStats stats() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

struct RetryPolicy {
  int max_attempts = 3;  // 1 = no retry
  Duration initial_backoff = std::chrono::milliseconds(50);
  Duration max_backoff = std::chrono::seconds(2);
};

struct ClientOptions {
  std::size_t max_idle_per_host = 64;
  RetryPolicy retry;
  std::size_t max_response_bytes = 64u << 20;
  std::string user_agent = "arlo";
  std::string token;  // sent as "Authorization: Bearer <token>" unless a request sets Authorization
  // The time request deadlines and retry backoff are measured on (common/async/clock.h): a
  // FakeClock in tests. Not owned; it must outlive the client. Null: the real clock.
  Clock* clock = nullptr;
};

struct ClientRequest {
  Verb method = Verb::get;
  std::string url;  // http://host:port/path?query  (http only)
  std::string body;
  std::string content_type = "application/json";
  std::map<std::string, std::string> headers;
  Duration timeout = std::chrono::seconds(30);  // deadline for the whole call, retries included
  std::optional<bool> idempotent;               // default: by method
  std::optional<RetryPolicy> retry;             // default: the client's
};

// Counters for tests, benchmarks and /metrics. Read from the io_context's thread.
struct ClientStats {
  std::uint64_t requests = 0;            // request() calls
  std::uint64_t attempts = 0;            // attempts sent (first tries and retries)
  std::uint64_t connections_opened = 0;  // new TCP connections
  std::uint64_t connections_reused = 0;  // attempts served by a pooled keep-alive connection
  std::uint64_t backoffs = 0;            // retry backoff waits begun (each precedes a retry)
};

class Client {
 public:
  Client(boost::asio::io_context& io, ClientOptions options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Completes with the response (any status; 5xx only after retries are spent) or an error
  // (kTimeout, kUnavailable for connection failures, kParse for malformed responses).
  // Also: kInvalidArgument for a URL that is not http://host[:port]/..., kResourceExhausted for a
  // response over max_response_bytes, kCancelled when the awaiting coroutine is cancelled.
  boost::asio::awaitable<Result<Response>> request(ClientRequest request);

  boost::asio::awaitable<Result<Response>> get(std::string url, Duration timeout = std::chrono::seconds(30));
  boost::asio::awaitable<Result<Response>> post_json(std::string url, nlohmann::json body,
                                                     Duration timeout = std::chrono::seconds(30));
  // Closes idle pooled connections.
  void close_idle();

  ClientStats stats() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// Raises this process's soft limit on open files (RLIMIT_NOFILE) to the hard limit and returns the
// new soft limit. A server or client holding thousands of connections needs one descriptor each.
Result<std::uint64_t> raise_open_file_limit();

}  // namespace arlo::http
