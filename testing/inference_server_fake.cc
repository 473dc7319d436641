#include "testing/inference_server_fake.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace arlo::testing {

namespace asio = boost::asio;

namespace {

constexpr auto kNoThrow = asio::as_tuple(asio::use_awaitable);

asio::awaitable<void> sleep_for(std::chrono::steady_clock::duration d) {
  asio::steady_timer t(co_await asio::this_coro::executor, d);
  co_await t.async_wait(kNoThrow);
}

asio::awaitable<http::Response> busy() { co_return http::Response::error(503, "busy", "server_error"); }

}  // namespace

std::set<std::string> json_keys(const Json& j) {
  std::set<std::string> out;
  if (j.is_object())
    for (const auto& [k, v] : j.items()) out.insert(k);
  return out;
}

InferenceServerFake::InferenceServerFake(asio::io_context& io, std::uint16_t port)
    : InferenceServerFake(io, InferenceServerOptions{.port = port}) {}

InferenceServerFake::InferenceServerFake(asio::io_context& io, InferenceServerOptions options)
    : io_(io), options_(std::move(options)), release_(io, std::chrono::steady_clock::time_point::max()) {
  start(options_.port);
}

InferenceServerFake::~InferenceServerFake() { close(); }

void InferenceServerFake::start(std::uint16_t port) {
  http::ServerOptions o;
  o.port = port;
  o.stop_grace = std::chrono::milliseconds(100);
  server_ = std::make_unique<http::Server>(io_, o);
  on(http::Verb::get, "/health", [this](Json, http::Request) { return health(); });
  for (const char* path : {"/v1/completions", "/v1/chat/completions"})
    on(http::Verb::post, path, [this, path](Json, http::Request req) { return complete(path, std::move(req)); });
  if (options_.dialect == Dialect::kArlo) serve_arlo();
  if (options_.dialect == Dialect::kVllm) serve_vllm();
  if (options_.dialect == Dialect::kSglang) serve_sglang();
  auto port_or = server_->start();
  if (!port_or) throw std::runtime_error(port_or.error().what());
  port_ = *port_or;
  closed_ = false;
}

void InferenceServerFake::on(http::Verb verb, const std::string& path, Handler handler) {
  std::string name = fmt::format("{} {}", verb == http::Verb::get ? "GET" : "POST", path);
  server_->route(verb, path, [this, name = std::move(name), handler = std::move(handler)](http::Request req) {
    requests.push_back(name);
    Json body = req.body.empty() ? Json() : Json::parse(req.body, nullptr, false);
    if (body.is_discarded()) body = Json();
    request_bodies.push_back(body);
    targets.push_back(req.target);
    if (fail_next > 0) {
      --fail_next;
      return busy();
    }
    return handler(std::move(body), std::move(req));
  });
}

Json InferenceServerFake::body_of(const std::string& request, int nth) const {
  for (std::size_t i = 0; i < requests.size(); ++i)
    if (requests[i] == request && nth-- == 0) return request_bodies[i];
  return Json();
}

int InferenceServerFake::count(const std::string& request) const {
  return static_cast<int>(std::count(requests.begin(), requests.end(), request));
}

http::Response InferenceServerFake::violation(std::string what) {
  violations.push_back(what);
  if (on_violation) on_violation(what);
  return http::Response::json(400, Json{{"error", std::move(what)}});
}

asio::awaitable<std::optional<http::Response>> InferenceServerFake::weights_request(Json body) {
  if (!on_weights_request) co_return std::nullopt;
  co_return co_await on_weights_request(std::move(body));
}

std::optional<http::Response> InferenceServerFake::group_init(const Json& init) {
  if (!on_group_init) return std::nullopt;
  return on_group_init(init);
}

asio::awaitable<http::Response> InferenceServerFake::health() {
  ++health_calls;
  if (health_delay.count() > 0) co_await sleep_for(health_delay);  // slow, or past a timeout silent
  if (health_status != 200) co_return http::Response::error(health_status, "injected health failure", "server_error");
  co_return http::Response::json(200, {{"status", "ok"}, {"version", version}});
}

asio::awaitable<http::Response> InferenceServerFake::complete(std::string path, http::Request req) {
  ++received;
  auto body = req.json();
  if (!body) co_return http::Response::error(400, body.error().what());
  bodies.push_back(*body);
  if (fail_with_status) co_return http::Response::error(fail_with_status, "injected failure", "server_error");
  if (answer_delay.count() > 0) co_await sleep_for(answer_delay);
  if (hold) {
    ++held;
    if (on_held) on_held();
    co_await wait_released();
    if (closed_) co_return http::Response::error(503, "closed");
  }
  ++answered;
  if (on_completion) co_return on_completion(path, *body);
  if (path != "/v1/completions") co_return http::Response::error(404, "no answer for " + path, "not_found_error");
  co_return http::Response::json(200, answer(*body));
}

asio::awaitable<void> InferenceServerFake::wait_released() {
  while (!released_) co_await release_.async_wait(kNoThrow);
}

Json InferenceServerFake::answer(const Json& body) const {
  std::string prompt =
      body.value("prompt", Json("")).is_string() ? body["prompt"].get<std::string>() : body["prompt"].dump();
  const int n = body.value("n", 1);
  Json choices = Json::array();
  for (int i = 0; i < n; ++i) {
    std::string text = reply ? reply(body, i) : "echo:" + prompt;
    Json ids = Json::array(), lps = Json::array();
    for (unsigned char c : text) {
      ids.push_back(static_cast<int>(c));
      lps.push_back(-0.5);
    }
    choices.push_back({{"index", i},
                       {"text", text},
                       {"token_ids", ids},
                       {"logprobs", {{"token_logprobs", lps}}},
                       {"finish_reason", "stop"},
                       {"version_spans", Json::array({Json::array({version, 0})})}});
  }
  return {{"id", "cmpl-test"}, {"model", "fake"}, {"prompt_token_ids", Json::array({1, 2, 3})}, {"choices", choices}};
}

void InferenceServerFake::close() {
  if (!server_) return;
  closed_ = true;
  server_->close();
  release_all();
  graveyard_.push_back(std::move(server_));
}

void InferenceServerFake::release_all() {
  released_ = true;
  release_.cancel();
}

std::string InferenceServerFake::url() const { return fmt::format("http://127.0.0.1:{}", port_); }

}  // namespace arlo::testing
