#include "rollout/admin.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <charconv>
#include <exception>

#include "common/log.h"

namespace arlo::rollout {

namespace asio = boost::asio;

Result<AdminDialect> parse_admin_dialect(std::string_view name) {
  if (name == "arlo") return AdminDialect::kArlo;
  if (name == "vllm") return AdminDialect::kVllm;
  if (name == "sglang") return AdminDialect::kSglang;
  return make_error(ErrorCode::kInvalidArgument, fmt::format("unknown inference.kind '{}': use arlo, vllm or sglang", name));
}

std::string_view to_string(AdminDialect d) {
  switch (d) {
    case AdminDialect::kArlo: return "arlo";
    case AdminDialect::kVllm: return "vllm";
    case AdminDialect::kSglang: return "sglang";
  }
  return "?";
}

namespace {

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
  static Call transfer(std::string target, std::optional<Json> body) { return post(std::move(target), std::move(body), false, true); }
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
    const std::string what = fmt::format("{} admin {} {}", to_string(dialect()), c.method == http::Verb::get ? "GET" : "POST", r.url);
    auto resp = co_await client_.request(std::move(r));
    if (!resp) co_return std::unexpected(std::move(resp).error().with_context(what));
    auto j = resp->body.empty() ? Result<Json>(Json::object()) : resp->parse_json();
    if (j && j->is_object() && j->contains("success") && (*j)["success"].is_boolean() && !(*j)["success"].get<bool>())
      co_return make_error(ErrorCode::kUnavailable, fmt::format("{}: refused (HTTP {}): {}", what, resp->status,
                                                                j->value("message", resp->body.substr(0, 500))));
    if (resp->status < 200 || resp->status >= 300) {
      const auto code = resp->status == 404  ? ErrorCode::kNotFound
                        : resp->status >= 500 ? ErrorCode::kUnavailable
                                              : ErrorCode::kInvalidArgument;
      // An OpenAI-style error body ({"error": {"message"}}, arlo-worker's): its message, whole
      // enough to carry a failed weight pull's reason.
      std::string said = resp->body.substr(0, 500);
      if (j && j->is_object() && j->contains("error") && (*j)["error"].is_object() && (*j)["error"].contains("message") &&
          (*j)["error"]["message"].is_string())
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
    asio::co_spawn(ex, std::move(metadata), [flight, session, worker = url_, generation](std::exception_ptr e, Status st) {
      if (e) {
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& x) {
          st = make_error(ErrorCode::kInternal, fmt::format("admin {}: the metadata call threw: {}", worker, x.what()));
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
      std::string why = fmt::format("{} admin {}: receiving v{}: {}", to_string(dialect()), url_, version, sent.error().what());
      if (!*flight->result) why += fmt::format(" (the server's metadata call then failed: {})", flight->result->error().what());
      co_return std::unexpected(Error(sent.error().code(), std::move(why)));
    }
    if (!*flight->result) co_return std::unexpected(flight->result->error());
    co_return *sent;
  }

  http::Client& client_;
  std::string url_;
  AdminOptions options_;
};

class ArloAdmin final : public AdminBase {
 public:
  using AdminBase::AdminBase;
  AdminDialect dialect() const override { return AdminDialect::kArlo; }
  asio::awaitable<Status> pause(PauseMode mode) override {
    co_return drop_value(co_await call(post(fmt::format("/pause?mode={}", to_string(mode)), Json::object())));
  }
  asio::awaitable<Status> resume() override { co_return drop_value(co_await call(post("/resume", Json::object()))); }
  asio::awaitable<Status> prepare_weights(const WeightUpdate& u) override {
    Json body = {{"version", u.version}, {"weight_sync", u.weight_sync}, {"manifest", u.manifest}};
    for (const auto& [k, v] : u.extra.items()) body[k] = v;
    co_return drop_value(co_await call(post("/weights/prepare", std::move(body), true, true)));
  }
  asio::awaitable<Status> commit_weights(std::int64_t version) override {
    Json body = {{"version", version}};
    co_return drop_value(co_await call(post("/weights/commit", std::move(body), true, true)));
  }
  asio::awaitable<Result<WeightsInfo>> weights() override {
    auto r = co_await call(get("/weights"));
    if (!r) co_return std::unexpected(std::move(r).error());
    WeightsInfo info;
    if (r->is_object()) {
      if (r->contains("version") && (*r)["version"].is_number_integer()) info.version = (*r)["version"].get<std::int64_t>();
      if (r->contains("checksum") && (*r)["checksum"].is_string()) info.checksum = (*r)["checksum"].get<std::string>();
    }
    co_return info;
  }
};

// ---- helpers shared by the vllm and sglang adapters (plain functions: bodies are built outside
// coroutines) ----

// {"names", "dtypes", "shapes"} lists from CollectiveSession::tensors().
struct TensorLists {
  Json names = Json::array(), dtypes = Json::array(), shapes = Json::array();
};
Result<TensorLists> tensor_lists(const Json& tensors) {
  if (!tensors.is_array() || tensors.empty())
    return make_error(ErrorCode::kInvalidArgument, "the collective session lists no tensors");
  TensorLists out;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string() || !t.contains("dtype") || !t["dtype"].is_string() ||
        !t.contains("shape") || !t["shape"].is_array())
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("the collective session's tensor {} lacks a string name, a string dtype or a shape list: {}", i,
                                    t.dump().substr(0, 200)));
    out.names.push_back(t["name"]);
    out.dtypes.push_back(t["dtype"]);
    out.shapes.push_back(t["shape"]);
  }
  return out;
}

Result<std::int64_t> group_generation(const Json& g) {
  if (!g.is_object() || !g.contains("generation") || !g["generation"].is_number_integer())
    return make_error(ErrorCode::kInvalidArgument, fmt::format("the collective session's group has no integer generation: {}", g.dump().substr(0, 200)));
  return g["generation"].get<std::int64_t>();
}

// Copies `keys` from the session's group into `out`; every key must be there.
Status copy_keys(const Json& group, std::initializer_list<const char*> keys, Json& out) {
  for (const char* k : keys) {
    if (!group.contains(k))
      return make_error(ErrorCode::kInvalidArgument, fmt::format("the collective session's group lacks '{}': {}", k, group.dump().substr(0, 300)));
    out[k] = group[k];
  }
  return ok();
}

// A version label as the servers keep it ("7") back to a number; nullopt when it is not one.
std::optional<std::int64_t> version_number(const Json& v) {
  if (v.is_number_integer()) return v.get<std::int64_t>();
  if (!v.is_string()) return std::nullopt;
  const auto s = v.get<std::string>();
  std::int64_t n = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return n;
}

// ---- vLLM ----

struct ServerVersion {
  int major = 0, minor = 0, patch = 0;
  auto operator<=>(const ServerVersion&) const = default;
};
// "0.28.0", "0.27.2rc1.dev150+g311b3513a", "v0.29.0": the leading x.y[.z].
Result<ServerVersion> parse_server_version(std::string_view s) {
  if (!s.empty() && (s[0] == 'v' || s[0] == 'V')) s.remove_prefix(1);
  ServerVersion v;
  int* parts[3] = {&v.major, &v.minor, &v.patch};
  const char* p = s.data();
  const char* end = s.data() + s.size();
  for (int i = 0; i < 3; ++i) {
    auto [next, ec] = std::from_chars(p, end, *parts[i]);
    if (ec != std::errc()) {
      if (i >= 2) break;  // "0.28" has no patch
      return make_error(ErrorCode::kParse, fmt::format("'{}' is not a version (x.y.z)", s));
    }
    p = next;
    if (i < 2) {
      if (p == end || *p != '.') {
        if (i == 1) break;
        return make_error(ErrorCode::kParse, fmt::format("'{}' is not a version (x.y.z)", s));
      }
      ++p;
    }
  }
  return v;
}

// vLLM's body shapes by release. Sources: vllm PR #39212 added /start_weight_update and
// /finish_weight_update (first released in 0.22.0; absent in 0.19.1); PR #50902 moved packed,
// packed_buffer_size_bytes and packed_num_buffers from update_info to init_info and dropped the
// start body (0.28.0, per TRL PR #7001 and SkyRL PR #2114); PR #53784 added nccl_unique_id_b64,
// merged to main after 0.28.0 was cut: assumed first released in 0.29.0.
constexpr ServerVersion kVllmStartFinish{0, 22, 0};
constexpr ServerVersion kVllmPackedInInit{0, 28, 0};
constexpr ServerVersion kVllmUniqueIdInit{0, 29, 0};

Json vllm_init_info(const Json& group, ServerVersion v, Status& status) {
  Json info = Json::object();
  const bool uid = v >= kVllmUniqueIdInit && group.contains("nccl_unique_id_b64") && group["nccl_unique_id_b64"].is_string();
  status = uid ? copy_keys(group, {"nccl_unique_id_b64", "rank_offset", "world_size"}, info)
               : copy_keys(group, {"master_address", "master_port", "rank_offset", "world_size"}, info);
  if (status && v >= kVllmPackedInInit) status = copy_keys(group, {"packed", "packed_buffer_size_bytes", "packed_num_buffers"}, info);
  return Json{{"init_info", std::move(info)}};
}

Json vllm_update_info(const TensorLists& t, const Json& group, ServerVersion v, Status& status) {
  Json info = {{"names", t.names}, {"dtype_names", t.dtypes}, {"shapes", t.shapes}};
  status = ok();
  if (v < kVllmPackedInInit) status = copy_keys(group, {"packed", "packed_buffer_size_bytes", "packed_num_buffers"}, info);
  return Json{{"update_info", std::move(info)}};
}

std::optional<Json> vllm_start_body(ServerVersion v) {
  if (v >= kVllmPackedInInit) return std::nullopt;
  return Json{{"is_checkpoint_format", true}};
}

Json vllm_finish_body(std::int64_t version) { return Json{{"weight_version", std::to_string(version)}}; }
Json checker_body(const Json& baseline) {
  if (baseline.is_object() && !baseline.empty()) return Json{{"action", "compare"}, {"baseline", baseline}};
  return Json{{"action", "checksum"}};
}

class VllmAdmin final : public AdminBase {
 public:
  using AdminBase::AdminBase;
  AdminDialect dialect() const override { return AdminDialect::kVllm; }
  asio::awaitable<Status> pause(PauseMode mode) override {
    co_return drop_value(co_await call(post(fmt::format("/pause?mode={}", to_string(mode)), std::nullopt)));
  }
  asio::awaitable<Status> resume() override {
    auto resumed = co_await call(post("/resume", std::nullopt));
    if (!resumed) co_return std::unexpected(std::move(resumed).error());
    // /weight_checker refuses a paused engine (HTTP 409), so the check runs here, after finish.
    if (options_.verify_weights && unverified_) co_return co_await verify(*unverified_);
    co_return ok();
  }
  asio::awaitable<Status> prepare_weights(const WeightUpdate& u) override {
    if (!u.collective)
      co_return here(ErrorCode::kInvalidArgument,
                     fmt::format("v{}: vLLM's HTTP API has no route that loads weights from a directory{} (its shared-disk "
                                 "weight-transfer backend, vllm PR #52152, is not released); use weight_sync.transport: nccl",
                                 u.version, u.extra.contains("model_path") ? fmt::format(" such as {}", u.extra["model_path"].dump()) : ""));
    auto version = co_await server_version();
    if (!version) co_return std::unexpected(std::move(version).error());
    auto& session = u.collective;
    if (!world_size_) {
      auto w = co_await call(get("/get_world_size"));
      if (!w) co_return std::unexpected(std::move(w).error());
      if (!w->is_object() || !w->contains("world_size") || !(*w)["world_size"].is_number_integer() || (*w)["world_size"].get<int>() < 1)
        co_return here(ErrorCode::kParse, fmt::format("GET /get_world_size answered {} (want {{\"world_size\": n >= 1}})", w->dump().substr(0, 200)));
      world_size_ = (*w)["world_size"].get<int>();
    }
    // Every update asks: the session may have formed a new group (another worker rejoined).
    auto g = co_await session->group(url_, *world_size_);
    if (!g) co_return std::unexpected(std::move(g).error().with_context(fmt::format("vllm admin {}: joining the weight-transfer group", url_)));
    auto joined = group_generation(*g);
    if (!joined) co_return std::unexpected(std::move(joined).error());
    if (generation_ != *joined) {
      const auto gen = joined;
      Status built;
      Json body = vllm_init_info(*g, *version, built);
      if (!built) co_return std::unexpected(std::move(built).error());
      auto init = co_await call(transfer("/init_weight_transfer_engine", std::move(body)));
      if (!init) {
        session->failed(url_, *gen, init.error().what());
        co_return std::unexpected(std::move(init).error());
      }
      group_ = std::move(*g);
      generation_ = *gen;
    }
    const std::int64_t gen = *generation_;
    auto fail = [&](const Error& e) {
      session->failed(url_, gen, e.what());
      generation_.reset();  // the group is aborted: the next update joins a new generation
      return std::unexpected(e);
    };
    auto tensors = co_await session->tensors();
    if (!tensors) co_return fail(tensors.error());
    auto lists = tensor_lists(*tensors);
    if (!lists) co_return fail(lists.error());
    Status built;
    Json update_body = vllm_update_info(*lists, group_, *version, built);
    if (!built) co_return fail(built.error());
    auto started = co_await call(transfer("/start_weight_update", vllm_start_body(*version)));
    if (!started) co_return fail(started.error());
    auto sent = co_await transfer_collective(session, gen, u.version, call_status(transfer("/update_weights", std::move(update_body))));
    if (!sent) {
      generation_.reset();
      co_return std::unexpected(std::move(sent).error());
    }
    pending_version_ = *sent;
    co_return ok();
  }
  asio::awaitable<Status> commit_weights(std::int64_t version) override {
    // The session may have sent a newer version than the one asked for; that one is committed.
    if (!pending_version_ || *pending_version_ < version)
      co_return here(ErrorCode::kMismatch, fmt::format("commit of version {} but the prepared version is {}", version,
                                                       pending_version_ ? std::to_string(*pending_version_) : "none"));
    const std::int64_t sent = *pending_version_;
    auto r = co_await call(transfer("/finish_weight_update", vllm_finish_body(sent)));
    pending_version_.reset();
    if (!r) co_return std::unexpected(std::move(r).error());
    committed_version_ = sent;
    unverified_ = sent;
    co_return ok();
  }
  asio::awaitable<Result<WeightsInfo>> weights() override {
    WeightsInfo info{committed_version_, checksum_};
    if (!has_weight_info_) co_return info;
    auto r = co_await call(get("/weight_info"));
    if (!r) {
      if (r.error().code() != ErrorCode::kNotFound) co_return std::unexpected(std::move(r).error());
      has_weight_info_ = false;  // an older server: report what this adapter committed
      co_return info;
    }
    if (r->is_object() && r->contains("weight_version")) info.version = version_number((*r)["weight_version"]);
    co_return info;
  }

 private:
  asio::awaitable<Result<ServerVersion>> server_version() {
    if (version_) co_return *version_;
    std::string text = options_.server_version;
    if (text.empty()) {
      auto r = co_await call(get("/version"));
      if (!r) co_return std::unexpected(std::move(r).error());
      if (!r->is_object() || !r->contains("version") || !(*r)["version"].is_string())
        co_return here(ErrorCode::kParse, fmt::format("GET /version answered {} (want {{\"version\": \"x.y.z\"}})", r->dump().substr(0, 200)));
      text = (*r)["version"].get<std::string>();
    }
    auto v = parse_server_version(text);
    if (!v) co_return std::unexpected(std::move(v).error().with_context(fmt::format("vllm admin {}: server version", url_)));
    if (*v < kVllmStartFinish)
      co_return here(ErrorCode::kInvalidArgument,
                     fmt::format("vLLM {} lacks /start_weight_update and /finish_weight_update (added in 0.22.0); run vLLM >= 0.22", text));
    version_ = *v;
    co_return *v;
  }

  asio::awaitable<Status> verify(std::int64_t version) {
    const bool compare = options_.verify_baseline.is_object() && !options_.verify_baseline.empty();
    auto r = co_await call(post("/weight_checker", checker_body(options_.verify_baseline)));
    if (!r) co_return std::unexpected(std::move(r).error());
    if (compare) {
      if (!r->is_object() || !r->contains("match") || !(*r)["match"].is_boolean())
        co_return here(ErrorCode::kParse, fmt::format("/weight_checker compare answered {}", r->dump().substr(0, 200)));
      if (!(*r)["match"].get<bool>())
        co_return here(ErrorCode::kMismatch, fmt::format("v{}: /weight_checker: the weights differ from the baseline in {}", version,
                                                         r->value("mismatches", Json::array()).dump().substr(0, 500)));
      ARLO_INFO("vllm admin {}: v{} matches the baseline's {} parameter checksums", url_, version, options_.verify_baseline.size());
      checksum_ = fmt::format("match:{}", options_.verify_baseline.size());
    } else {
      const std::size_t n = r->is_object() && r->contains("checksums") && (*r)["checksums"].is_object() ? (*r)["checksums"].size() : 0;
      if (n == 0) co_return here(ErrorCode::kMismatch, fmt::format("v{}: /weight_checker reported no parameter checksums: {}", version, r->dump().substr(0, 200)));
      ARLO_INFO("vllm admin {}: v{}: /weight_checker reports {} parameter checksums", url_, version, n);
      checksum_ = fmt::format("checksums:{}", n);
    }
    unverified_.reset();
    co_return ok();
  }

  std::optional<ServerVersion> version_;
  std::optional<int> world_size_;
  std::optional<std::int64_t> generation_;  // the session generation the server joined
  Json group_ = Json::object();             // that generation's group
  std::optional<std::int64_t> pending_version_;
  std::optional<std::int64_t> committed_version_;
  std::optional<std::int64_t> unverified_;  // committed, not yet checked (verify_weights)
  std::string checksum_;
  bool has_weight_info_ = true;
};

// ---- SGLang ----

Json sglang_group_body(const Json& group, Status& status) {
  Json body = Json::object();
  status = copy_keys(group, {"master_address", "master_port", "rank_offset", "world_size", "group_name"}, body);
  body["backend"] = "nccl";
  return body;
}

Json sglang_distributed_body(const TensorLists& t, const std::string& group_name, bool flush, std::int64_t version) {
  return Json{{"names", t.names},         {"dtypes", t.dtypes},   {"shapes", t.shapes},
              {"group_name", group_name}, {"flush_cache", flush}, {"weight_version", std::to_string(version)}};
}

Json sglang_disk_body(const Json& extra, bool flush, std::int64_t version) {
  return Json{{"model_path", extra["model_path"]},
              {"load_format", extra.value("load_format", "auto")},
              {"flush_cache", flush},
              {"weight_version", std::to_string(version)}};
}

Json sglang_version_body(std::int64_t version) {
  return Json{{"new_version", std::to_string(version)}, {"abort_all_requests", false}};
}

Json sglang_pause_body(PauseMode mode) {
  // keep: requests stay where they are (in_place). wait: the orchestrator drained its dispatcher
  // before this call (orchestrator/weight_watcher.cc), so in_place holds nothing. abort: aborted.
  return Json{{"mode", mode == PauseMode::kAbort ? "abort" : "in_place"}};
}

// /destroy_weights_update_group's body (not built inside a coroutine: GCC 12 and string literals).
Json sglang_destroy_body(const std::string& group_name) { return Json{{"group_name", group_name}}; }

class SglangAdmin final : public AdminBase {
 public:
  using AdminBase::AdminBase;
  AdminDialect dialect() const override { return AdminDialect::kSglang; }
  asio::awaitable<Status> pause(PauseMode mode) override {
    auto r = co_await call(post("/pause_generation", sglang_pause_body(mode)));
    if (!r) co_return std::unexpected(std::move(r).error());
    // SGLang asserts when the cache is flushed with requests running: only after abort or a drain.
    idle_ = mode != PauseMode::kKeep;
    co_return ok();
  }
  asio::awaitable<Status> resume() override {
    idle_ = false;
    co_return drop_value(co_await call(post("/continue_generation", Json::object())));
  }
  asio::awaitable<Status> prepare_weights(const WeightUpdate& u) override {
    if (!u.collective) {
      if (!u.extra.contains("model_path") || !u.extra["model_path"].is_string())
        co_return here(ErrorCode::kInvalidArgument,
                       fmt::format("v{}: the update has neither a collective session (transport nccl) nor extra.model_path (a string)", u.version));
      co_return co_await call_status(transfer("/update_weights_from_disk", sglang_disk_body(u.extra, idle_, u.version)));
    }
    auto& session = u.collective;
    if (!tp_) {
      auto world = co_await tp_size();
      if (!world) co_return std::unexpected(std::move(world).error());
      tp_ = *world;
    }
    // Every update asks: the session may have formed a new group (another worker rejoined).
    auto g = co_await session->group(url_, *tp_);
    if (!g) co_return std::unexpected(std::move(g).error().with_context(fmt::format("sglang admin {}: joining the weight-update group", url_)));
    auto joined = group_generation(*g);
    if (!joined) co_return std::unexpected(std::move(joined).error());
    if (generation_ != *joined) {
      const auto gen = joined;
      Status built;
      Json body = sglang_group_body(*g, built);
      if (!built) co_return std::unexpected(std::move(built).error());
      if (joined_once_) {  // the previous group's communicator holds GPU memory on the server: free it
        auto gone = co_await call(post("/destroy_weights_update_group", sglang_destroy_body(group_name_), false));
        if (!gone) ARLO_WARN("sglang admin {}: destroying group {}: {}", url_, group_name_, gone.error().what());
      }
      auto init = co_await call(transfer("/init_weights_update_group", body));
      if (!init) {
        session->failed(url_, *gen, init.error().what());
        co_return std::unexpected(std::move(init).error());
      }
      group_name_ = body["group_name"].is_string() ? body["group_name"].get<std::string>() : "weight_update_group";
      joined_once_ = true;
      generation_ = *gen;
    }
    const std::int64_t gen = *generation_;
    auto tensors = co_await session->tensors();
    Result<TensorLists> lists = tensors ? tensor_lists(*tensors) : Result<TensorLists>(std::unexpected(tensors.error()));
    if (!lists) {
      session->failed(url_, gen, lists.error().what());
      generation_.reset();
      co_return std::unexpected(std::move(lists).error());
    }
    auto sent = co_await transfer_collective(
        session, gen, u.version,
        call_status(transfer("/update_weights_from_distributed", sglang_distributed_body(*lists, group_name_, idle_, u.version))));
    if (!sent) {
      generation_.reset();
      co_return std::unexpected(std::move(sent).error());
    }
    // The broadcast carried a newer version than the label sent with the metadata: relabel.
    if (*sent != u.version) co_return co_await call_status(post("/update_weight_version", sglang_version_body(*sent)));
    co_return ok();
  }
  asio::awaitable<Status> commit_weights(std::int64_t) override { co_return ok(); }
  asio::awaitable<Result<WeightsInfo>> weights() override {
    auto r = co_await call(get("/get_weight_version"));
    if (!r) co_return std::unexpected(std::move(r).error());
    WeightsInfo info;
    if (r->is_object() && r->contains("weight_version")) info.version = version_number((*r)["weight_version"]);
    co_return info;
  }

 private:
  // The GPUs this server puts in the group: tp_size (its ranks are rank_offset + tp_rank). A data
  // or pipeline parallel server is refused: SGLang's distributed update needs dp_size 1 (or DP
  // attention, where tp_size already counts every GPU) and gives pipeline stages no ranks of their own.
  asio::awaitable<Result<int>> tp_size() {
    auto r = co_await call(get("/get_server_info"));
    if (!r && r.error().code() == ErrorCode::kNotFound) r = co_await call(get("/server_info"));
    if (!r) co_return std::unexpected(std::move(r).error());
    auto number = [&](const char* key, int fallback) {
      return r->is_object() && r->contains(key) && (*r)[key].is_number_integer() ? (*r)[key].get<int>() : fallback;
    };
    const int tp = number("tp_size", 0);
    if (tp < 1) co_return here(ErrorCode::kParse, "the server info has no tp_size >= 1");
    const bool dp_attention = r->is_object() && r->contains("enable_dp_attention") && (*r)["enable_dp_attention"].is_boolean() &&
                              (*r)["enable_dp_attention"].get<bool>();
    if (number("dp_size", 1) > 1 && !dp_attention)
      co_return here(ErrorCode::kInvalidArgument, fmt::format("dp_size {} without DP attention: SGLang's distributed weight update needs dp_size 1; run one server per replica", number("dp_size", 1)));
    if (number("pp_size", 1) > 1)
      co_return here(ErrorCode::kInvalidArgument, fmt::format("pp_size {}: SGLang's distributed weight update gives pipeline stages no ranks; use tensor parallelism", number("pp_size", 1)));
    co_return tp;
  }

  std::optional<int> tp_;  // the server's tensor-parallel size (its ranks), asked once
  bool idle_ = false;  // nothing runs: the last pause aborted or followed a drain
  std::optional<std::int64_t> generation_;
  std::string group_name_ = "weight_update_group";
  bool joined_once_ = false;  // a group was initialised on the server (destroyed before the next)
};

}  // namespace

std::unique_ptr<AdminClient> make_admin_client(AdminDialect dialect, http::Client& client, std::string base_url,
                                               AdminOptions options) {
  switch (dialect) {
    case AdminDialect::kVllm: return std::make_unique<VllmAdmin>(client, std::move(base_url), std::move(options));
    case AdminDialect::kSglang: return std::make_unique<SglangAdmin>(client, std::move(base_url), std::move(options));
    case AdminDialect::kArlo: break;
  }
  return std::make_unique<ArloAdmin>(client, std::move(base_url), std::move(options));
}

}  // namespace arlo::rollout
