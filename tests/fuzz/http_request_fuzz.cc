// libFuzzer target for the HTTP request parser (common/http_server.cc and http_message.cc): the
// fuzzer's bytes are what a client sends on one or more connections (split at "\n--next--\n") to
// a real http::Server on loopback, whose routes echo the request they were handed.
//
// Properties checked:
//   - the server never crashes, hangs or leaks, whatever the bytes: every connection ends with the
//     server closing it (a request cut off by the client's close is no request);
//   - every answer the server writes is an HTTP/1.x status line with a status in [100, 599];
//   - a handler only ever sees what the parser accepted: lower-case header names, a body within the
//     body limit, a path that is the percent-decoded part of the target before '?'.
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "common/http.h"
#include "common/http_util.h"
#include "tests/fuzz/check.h"
#include "tests/fuzz/loopback.h"

namespace {

namespace asio = boost::asio;
using arlo::fuzz::check;
using arlo::http::Request;
using arlo::http::Response;
using arlo::http::Verb;

constexpr std::size_t kMaxBody = 4096;

asio::awaitable<Response> echo(Request r) {
  for (const auto& [name, value] : r.headers) {
    check(arlo::http::detail::to_lower(name) == name, "header names are lower-case", name);
    check(arlo::http::detail::valid_header_name(name), "header names are tokens", name);
  }
  check(r.body.size() <= kMaxBody, "body within the limit", std::to_string(r.body.size()));
  const std::string before_query = r.target.substr(0, r.target.find('?'));
  check(r.path == arlo::http::detail::percent_decode(before_query, false), "path is the decoded target", r.target);
  nlohmann::json headers = nlohmann::json::object();
  for (const auto& [name, value] : r.headers) headers[name] = value;
  nlohmann::json query = nlohmann::json::object();
  for (const auto& [key, value] : r.query) query[key] = value;
  co_return Response::json(200, {{"path", r.path}, {"query", query}, {"headers", headers}, {"body", r.body.size()}});
}

struct Fixture {
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  std::unique_ptr<arlo::http::Server> server;
  std::uint16_t port = 0;
  std::thread thread;

  Fixture() {
    arlo::http::ServerOptions options;
    options.max_body_bytes = kMaxBody;
    options.header_timeout = std::chrono::seconds(10);
    options.idle_timeout = std::chrono::seconds(10);
    server = std::make_unique<arlo::http::Server>(io, options);
    for (const char* path : {"/", "/v1/completions", "/weights/update", "/a b"}) {
      for (const Verb verb : {Verb::get, Verb::post, Verb::put, Verb::delete_, Verb::head}) {
        server->route(verb, path, echo);
      }
    }
    auto started = server->start();
    if (!started) arlo::fuzz::die("http_request_fuzz", "server start");
    port = *started;
    thread = std::thread([this] { io.run(); });
  }
};

Fixture& fixture() {
  static Fixture* f = new Fixture();  // lives until exit (libFuzzer never returns to destroy it)
  return *f;
}

// Checks each status line in `answer` (responses follow each other on a keep-alive connection).
void check_answer(const std::string& answer) {
  if (answer.empty()) return;
  check(answer.rfind("HTTP/1.", 0) == 0, "the answer starts with a status line", answer.substr(0, 200));
  check(answer.size() >= 12, "a complete status line", answer);
  const int status = std::atoi(answer.substr(9, 3).c_str());
  check(status >= 100 && status <= 599, "status in [100, 599]", answer.substr(0, 200));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Fixture& f = fixture();
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  for (const auto bytes : arlo::fuzz::connections(input, 4)) {
    check_answer(arlo::fuzz::exchange("http_request_fuzz", f.port, bytes));
  }
  return 0;
}
