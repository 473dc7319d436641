#pragma once
// What the admin dialects (rollout/admin_dialects/<name>.cc) share: AdminBase, one admin call with
// deadline, retry policy and error mapping, and the helpers of the collective weight-transfer
// dialects. Internal to rollout/.
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <exception>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string_view>

#include "common/log.h"
#include "rollout/admin.h"

namespace arlo::rollout::admin_detail {

namespace asio = boost::asio;

// ---- helpers shared by the vllm and sglang adapters (plain functions: bodies are built outside
// coroutines; defined in rollout/admin.cc) ----

// {"names", "dtypes", "shapes"} lists from CollectiveSession::tensors().
struct TensorLists {
  Json names = Json::array(), dtypes = Json::array(), shapes = Json::array();
};
Result<TensorLists> tensor_lists(const Json& tensors);
// The generation of a CollectiveSession::group() answer.
Result<std::int64_t> group_generation(const Json& g);
// Copies `keys` from the session's group into `out`; every key must be there.
Status copy_keys(const Json& group, std::initializer_list<const char*> keys, Json& out);
// A version label as the servers keep it ("7") back to a number; nullopt when it is not one.
std::optional<std::int64_t> version_number(const Json& v);

// Shared plumbing: one admin call with deadline, retry policy and error mapping.
class AdminBase : public AdminClient {
 public:
  AdminBase(http::Client& client, std::string url, AdminOptions options)
      : client_(client), url_(std::move(url)), options_(std::move(options)) {
    while (!url_.empty() && url_.back() == '/') url_.pop_back();
  }
  const std::string& url() const override { return url_; }

 protected:
  struct Call {
    http::Verb method = http::Verb::post;
    std::string target;
    std::optional<Json> body;
    bool repeatable = true;
    bool transfer = false;  // long-running weight transfer: transfer_timeout
  };
  // Factories (not braced aggregates inside coroutines: GCC 12 mis-compiles string literals there).
  static Call post(std::string target, std::optional<Json> body, bool repeatable = true, bool transfer = false) {
    Call c;
    c.target = std::move(target);
    c.body = std::move(body);
    c.repeatable = repeatable;
    c.transfer = transfer;
    return c;
  }
  // A weight-transfer call: sent once, under transfer_timeout.
  static Call transfer(std::string target, std::optional<Json> body) {
    return post(std::move(target), std::move(body), false, true);
  }
  static Call get(std::string target) {
    Call c;
    c.method = http::Verb::get;
    c.target = std::move(target);
    return c;
  }

  // The reply's JSON (or its text as a JSON string). A status outside 2xx is an error naming the
  // route, the server and the server's answer (404: kNotFound, 5xx: kUnavailable); so is a
  // {"success": false} body with any status (SGLang refuses that way).
  asio::awaitable<Result<Json>> call(Call c) {
    http::ClientRequest r;
    r.method = c.method;
    r.url = url_ + c.target;
    if (c.body) r.body = c.body->dump();
    r.timeout = c.transfer ? options_.transfer_timeout : options_.call_timeout;
    r.idempotent = c.repeatable;
    r.retry = c.repeatable ? options_.retry : http::RetryPolicy{1, {}, {}};
    const std::string what =
        fmt::format("{} admin {} {}", to_string(dialect()), c.method == http::Verb::get ? "GET" : "POST", r.url);
    auto resp = co_await client_.request(std::move(r));
    if (!resp) co_return std::unexpected(std::move(resp).error().with_context(what));
    auto j = resp->body.empty() ? Result<Json>(Json::object()) : resp->parse_json();
    if (j && j->is_object() && j->contains("success") && (*j)["success"].is_boolean() && !(*j)["success"].get<bool>())
      co_return make_error(ErrorCode::kUnavailable, fmt::format("{}: refused (HTTP {}): {}", what, resp->status,
                                                                j->value("message", resp->body.substr(0, 500))));
    if (resp->status < 200 || resp->status >= 300) {
      const auto code = resp->status == 404   ? ErrorCode::kNotFound
                        : resp->status >= 500 ? ErrorCode::kUnavailable
                                              : ErrorCode::kInvalidArgument;
      // An OpenAI-style error body ({"error": {"message"}}, arlo-worker's): its message, whole
      // enough to carry a failed weight pull's reason.
      std::string said = resp->body.substr(0, 500);
      if (j && j->is_object() && j->contains("error") && (*j)["error"].is_object() &&
          (*j)["error"].contains("message") && (*j)["error"]["message"].is_string())
        said = (*j)["error"]["message"].get<std::string>().substr(0, 2000);
      co_return make_error(code, fmt::format("{}: HTTP {}: {}", what, resp->status, said));
    }
    if (!j) co_return Json(resp->body);  // some servers answer plain text ("OK")
    co_return std::move(*j);
  }

  static Status drop_value(const Result<Json>& r) {
    if (!r) return std::unexpected(r.error());
    return ok();
  }

  asio::awaitable<Status> call_status(Call c) { co_return drop_value(co_await call(std::move(c))); }

  // An error of this adapter: "vllm admin http://host:port: message".
  std::unexpected<Error> here(ErrorCode code, std::string message) const {
    return std::unexpected(Error(code, fmt::format("{} admin {}: {}", to_string(dialect()), url_, message)));
  }

  // One collective transfer: `metadata` (the server's receive call, which returns once the tensors
  // arrived) is sent and, while it is in flight, the session is told this worker receives. A
  // metadata call that fails tells the session at once (failed()), so that a broadcast waiting on
  // this worker stops. Both complete before this returns. Ok: the version the session sent.
  asio::awaitable<Result<std::int64_t>> transfer_collective(const std::shared_ptr<CollectiveSession>& session,
                                                            std::int64_t generation, std::int64_t version,
                                                            asio::awaitable<Status> metadata) {
    struct Flight {
      std::optional<Status> result;
      asio::steady_timer done;
      explicit Flight(asio::any_io_executor ex) : done(ex, asio::steady_timer::time_point::max()) {}
    };
    auto ex = co_await asio::this_coro::executor;
    auto flight = std::make_shared<Flight>(ex);
    asio::co_spawn(ex, std::move(metadata),
                   [flight, session, worker = url_, generation](std::exception_ptr e, Status st) {
                     if (e) {
                       try {
                         std::rethrow_exception(e);
                       } catch (const std::exception& x) {
                         st = make_error(ErrorCode::kInternal,
                                         fmt::format("admin {}: the metadata call threw: {}", worker, x.what()));
                       }
                     }
                     if (!st) session->failed(worker, generation, st.error().what());
                     flight->result = std::move(st);
                     flight->done.cancel();
                   });
    auto sent = co_await session->receiving(url_, generation, version);
    if (!flight->result) {
      boost::system::error_code ec;
      co_await flight->done.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    if (!sent) {  // the session's failure is the cause; the server's answer follows from it
      std::string why =
          fmt::format("{} admin {}: receiving v{}: {}", to_string(dialect()), url_, version, sent.error().what());
      if (!*flight->result)
        why += fmt::format(" (the server's metadata call then failed: {})", flight->result->error().what());
      co_return std::unexpected(Error(sent.error().code(), std::move(why)));
    }
    if (!*flight->result) co_return std::unexpected(flight->result->error());
    co_return *sent;
  }

  // The collective dialects ask on every update where this server joins (the session may have
  // formed a new group: another worker rejoined). Ok: the group when it is of a generation this
  // server has not joined (join_group next), nullopt when it is joined already. `group_word` names
  // the group in the error ("weight-transfer group").
  asio::awaitable<Result<std::optional<Json>>> new_group(CollectiveSession& session, int world_size,
                                                         std::string_view group_word) {
    auto g = co_await session.group(url_, world_size);
    if (!g)
      co_return std::unexpected(std::move(g).error().with_context(
          fmt::format("{} admin {}: joining the {}", to_string(dialect()), url_, group_word)));
    auto joined = group_generation(*g);
    if (!joined) co_return std::unexpected(std::move(joined).error());
    if (generation_ == *joined) co_return std::optional<Json>();
    co_return std::optional<Json>(std::move(*g));
  }
  // Sends `init`, the server's call that joins `group` (from new_group); a failure tells the session
  // at once (failed()), so that its publisher does not wait for this server. When `init` fails and
  // `instead` returns a call for its error, that call is sent once in its place (another body for
  // the same group). Ok: generation_ is the group's.
  asio::awaitable<Status> join_group(CollectiveSession& session, const Json& group, Call init,
                                     std::function<std::optional<Call>(const Error&)> instead = {}) {
    const std::int64_t generation = group["generation"].get<std::int64_t>();
    auto r = co_await call(std::move(init));
    if (!r && instead)
      if (auto other = instead(r.error())) r = co_await call(std::move(*other));
    if (!r) {
      session.failed(url_, generation, r.error().what());
      co_return std::unexpected(std::move(r).error());
    }
    generation_ = generation;
    co_return ok();
  }

  http::Client& client_;
  std::string url_;
  AdminOptions options_;
  // The collective dialects: the session generation this server joined (reset when a transfer
  // fails: the group is aborted, the next update joins a new generation).
  std::optional<std::int64_t> generation_;
};

}  // namespace arlo::rollout::admin_detail
