// vLLM's admin dialect: its native weight-transfer API (rollout/admin.h lists its calls).
#include <charconv>

#include "rollout/admin_dialects/admin_base.h"

namespace arlo::rollout {

namespace {

using namespace admin_detail;

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
// start body's is_checkpoint_format (0.28.0, per TRL PR #7001 and SkyRL PR #2114); PR #53784 added nccl_unique_id_b64,
// merged to main after 0.28.0 was cut: assumed first released in 0.29.0.
constexpr ServerVersion kVllmStartFinish{0, 22, 0};
constexpr ServerVersion kVllmPackedInInit{0, 28, 0};
constexpr ServerVersion kVllmUniqueIdInit{0, 29, 0};

// `unique_id`: the base64 id when the group offers one and the version takes it (a server that
// refused it gets the store's fields instead).
Result<Json> vllm_init_info(const Json& group, ServerVersion v, bool unique_id = true) {
  Json info = Json::object();
  const bool uid = unique_id && v >= kVllmUniqueIdInit && group.contains("nccl_unique_id_b64") &&
                   group["nccl_unique_id_b64"].is_string();
  ARLO_TRY(uid ? copy_keys(group, {"nccl_unique_id_b64", "rank_offset", "world_size"}, info)
               : copy_keys(group, {"master_address", "master_port", "rank_offset", "world_size"}, info));
  if (v >= kVllmPackedInInit)
    ARLO_TRY(copy_keys(group, {"packed", "packed_buffer_size_bytes", "packed_num_buffers"}, info));
  return Json{{"init_info", std::move(info)}};
}

Result<Json> vllm_update_info(const TensorLists& t, const Json& group, ServerVersion v) {
  Json info = {{"names", t.names}, {"dtype_names", t.dtypes}, {"shapes", t.shapes}};
  if (v < kVllmPackedInInit)
    ARLO_TRY(copy_keys(group, {"packed", "packed_buffer_size_bytes", "packed_num_buffers"}, info));
  return Json{{"update_info", std::move(info)}};
}

// Always a JSON body: handlers that read `await raw_request.json()` answer an empty one with 400;
// from 0.28 the flag is gone and the handler ignores the body or reads optional keys.
Json vllm_start_body(ServerVersion v) {
  if (v >= kVllmPackedInInit) return Json::object();
  return Json{{"is_checkpoint_format", true}};
}

// A server refusing the unique-id mode: a 4xx/5xx that names the field (a release without vllm PR
// #53784 fails its strict init_info parse with "Invalid init_info ... nccl_unique_id_b64").
bool refuses_unique_id(const Error& e) {
  return (e.code() == ErrorCode::kInvalidArgument || e.code() == ErrorCode::kUnavailable) &&
         e.what().find("nccl_unique_id_b64") != std::string::npos;
}

// What a vLLM server needs to take arlo's own transports (python/arlo_vllm, installed into the
// server's Python environment: pip install -e <arlo>/python).
constexpr const char* kArloBackendFlags =
    "VLLM_SERVER_DEV_MODE=1 (its weight-transfer routes) and --weight-transfer-config '{\"backend\": \"arlo\"}', "
    "with arlo's vLLM plugin installed where vLLM runs (pip install -e <arlo>/python)";

// The "arlo" backend's bodies: nothing up front; per update the version and the receiver block.
Json arlo_backend_init_body() { return Json{{"init_info", Json::object()}}; }
Json arlo_backend_update_body(const WeightUpdate& u) {
  return Json{{"update_info", {{"version", u.version}, {"weight_sync", u.weight_sync}}}};
}
// A server that did not take the backend's init: the server's answer and what to start it with.
Error without_arlo_backend(const Error& e, const WeightUpdate& u) {
  return Error(e.code(), fmt::format("{}; vLLM takes arlo's {} transport through arlo's weight-transfer backend: "
                                     "start it with {} (docs/vllm.md, \"arlo transports into vLLM\")",
                                     e.what(), u.weight_sync.value("transport", "?"), kArloBackendFlags));
}

// The workers' report of arlo's backend (python/arlo_vllm adds arlo_weights() to vLLM's workers).
Json arlo_weights_body() { return Json{{"method", "arlo_weights"}}; }
// What every worker of the server loaded last through arlo's backend (version and checksum empty
// before the first update); workers that disagree are an error.
Result<WeightsInfo> loaded_report(const Json& answer) {
  if (!answer.is_object() || !answer.contains("results") || !answer["results"].is_array() || answer["results"].empty())
    return make_error(ErrorCode::kParse, fmt::format("POST /collective_rpc arlo_weights answered {} (want "
                                                     "{{\"results\": [one report per worker]}})",
                                                     answer.dump().substr(0, 200)));
  std::optional<WeightsInfo> held;
  for (const auto& r : answer["results"]) {
    WeightsInfo info;
    if (r.is_object()) {
      if (r.contains("version") && r["version"].is_number_integer()) info.version = r["version"].get<std::int64_t>();
      info.checksum = r.value("checksum", std::string());
    }
    if (held && (held->version != info.version || held->checksum != info.checksum))
      return make_error(ErrorCode::kMismatch,
                        fmt::format("its workers hold different weights: {}", answer.dump().substr(0, 500)));
    held = std::move(info);
  }
  return *held;
}

// keep freezes the requests in flight with their KV: the cache must stay. vLLM 0.32 clears it in
// every mode unless told not to (clear_cache defaults to true; its route says keep ignores it, its
// engine does not), and a kept request then resumed on freed KV blocks: the stream ended in an error
// and the server answered 500 from then on (tests/vllm/vllm_test.py, PauseModesTest, under load). The
// per-version cache_salt keeps new requests off the old weights' prefix KV instead.
std::string vllm_pause_target(PauseMode mode) {
  return mode == PauseMode::kKeep ? "/pause?mode=keep&clear_cache=false"
                                  : fmt::format("/pause?mode={}", to_string(mode));
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
    co_return drop_value(co_await call(post(vllm_pause_target(mode), std::nullopt)));
  }
  asio::awaitable<Status> resume() override {
    auto resumed = co_await call(post("/resume", std::nullopt));
    if (!resumed) co_return std::unexpected(std::move(resumed).error());
    // /weight_checker refuses a paused engine (HTTP 409), so the check runs here, after finish.
    if (options_.verify_weights && unverified_) co_return co_await verify(*unverified_);
    co_return ok();
  }
  asio::awaitable<Status> prepare_weights(const WeightUpdate& u) override {
    auto version = co_await server_version();
    if (!version) co_return std::unexpected(std::move(version).error());
    if (!u.collective) co_return co_await prepare_streamed(u, *version);
    auto& session = u.collective;
    if (!world_size_) {
      auto w = co_await call(get("/get_world_size"));
      if (!w) co_return std::unexpected(std::move(w).error());
      if (!w->is_object() || !w->contains("world_size") || !(*w)["world_size"].is_number_integer() ||
          (*w)["world_size"].get<int>() < 1)
        co_return here(
            ErrorCode::kParse,
            fmt::format("GET /get_world_size answered {} (want {{\"world_size\": n >= 1}})", w->dump().substr(0, 200)));
      world_size_ = (*w)["world_size"].get<int>();
    }
    auto fresh = co_await new_group(*session, *world_size_, "weight-transfer group");
    if (!fresh) co_return std::unexpected(std::move(fresh).error());
    if (*fresh) {
      auto init = co_await init_engine(*session, **fresh, *version);
      if (!init) co_return init;
      group_ = std::move(**fresh);
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
    auto update_body = vllm_update_info(*lists, group_, *version);
    if (!update_body) co_return fail(update_body.error());
    auto started = co_await call(transfer("/start_weight_update", vllm_start_body(*version)));
    if (!started) co_return fail(started.error());
    auto sent = co_await transfer_collective(session, gen, u.version,
                                             call_status(transfer("/update_weights", std::move(*update_body))));
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
    if (backend_checked_) {  // what arlo's backend loaded: its checksum, the trainer's definition
      auto loaded = co_await call(post("/collective_rpc", arlo_weights_body()));
      if (!loaded) co_return std::unexpected(std::move(loaded).error());
      auto held = loaded_report(*loaded);
      if (!held) co_return std::unexpected(Error(held.error()).with_context(fmt::format("vllm admin {}", url_)));
      info.checksum = held->checksum;
    }
    co_return info;
  }

 private:
  // arlo's own transports (tcp, shm, filesystem) through the "arlo" weight-transfer backend that
  // python/arlo_vllm registers in vLLM: the same start/update/finish as NCCL, the update naming the
  // version and the receiver block; /update_weights returns once the version arrived whole and is
  // loaded. The backend's init only checks that it is there (a restarted server needs none).
  asio::awaitable<Status> prepare_streamed(const WeightUpdate& u, ServerVersion v) {
    if (!backend_checked_) {
      auto init = co_await call(transfer("/init_weight_transfer_engine", arlo_backend_init_body()));
      if (!init) co_return std::unexpected(without_arlo_backend(init.error(), u));
      backend_checked_ = true;
    }
    auto started = co_await call(transfer("/start_weight_update", vllm_start_body(v)));
    if (!started) co_return std::unexpected(std::move(started).error());
    auto sent = co_await call(transfer("/update_weights", arlo_backend_update_body(u)));
    if (!sent) co_return std::unexpected(std::move(sent).error());
    // The publisher hands out its newest version, maybe past the one asked for: that one is finished.
    auto loaded = co_await call(post("/collective_rpc", arlo_weights_body()));
    if (!loaded) co_return std::unexpected(std::move(loaded).error());
    auto held = loaded_report(*loaded);
    if (!held) co_return std::unexpected(Error(held.error()).with_context(fmt::format("vllm admin {}", url_)));
    if (!held->version || *held->version < u.version)
      co_return here(ErrorCode::kMismatch, fmt::format("v{}: /update_weights returned, but its workers report {}",
                                                       u.version, loaded->dump().substr(0, 300)));
    pending_version_ = *held->version;
    co_return ok();
  }

  // /init_weight_transfer_engine for `group`: with the unique id where offered; a server that
  // refuses it joins the same group through the store (which serves the id too), and is sent the
  // store's fields from then on.
  asio::awaitable<Status> init_engine(CollectiveSession& session, const Json& group, ServerVersion v) {
    auto body = vllm_init_info(group, v, !unique_id_refused_);
    if (!body) co_return std::unexpected(std::move(body).error());
    auto store_body = vllm_init_info(group, v, false);
    if (!store_body) co_return std::unexpected(std::move(store_body).error());
    const bool offers_id = *body != *store_body;
    std::function<std::optional<Call>(const Error&)> instead = [&](const Error& e) -> std::optional<Call> {
      if (!offers_id || !refuses_unique_id(e)) return std::nullopt;
      ARLO_WARN("vllm admin {}: the server refuses nccl_unique_id_b64 ({}): joining through the store", url_, e.what());
      unique_id_refused_ = true;
      return transfer("/init_weight_transfer_engine", *store_body);
    };
    co_return co_await join_group(session, group, transfer("/init_weight_transfer_engine", std::move(*body)),
                                  std::move(instead));
  }

  asio::awaitable<Result<ServerVersion>> server_version() {
    if (version_) co_return *version_;
    std::string text = options_.server_version;
    if (text.empty()) {
      auto r = co_await call(get("/version"));
      if (!r) co_return std::unexpected(std::move(r).error());
      if (!r->is_object() || !r->contains("version") || !(*r)["version"].is_string())
        co_return here(ErrorCode::kParse, fmt::format("GET /version answered {} (want {{\"version\": \"x.y.z\"}})",
                                                      r->dump().substr(0, 200)));
      text = (*r)["version"].get<std::string>();
    }
    auto v = parse_server_version(text);
    if (!v)
      co_return std::unexpected(std::move(v).error().with_context(fmt::format("vllm admin {}: server version", url_)));
    if (*v < kVllmStartFinish)
      co_return here(
          ErrorCode::kInvalidArgument,
          fmt::format(
              "vLLM {} lacks /start_weight_update and /finish_weight_update (added in 0.22.0); run vLLM >= 0.22",
              text));
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
        co_return here(ErrorCode::kMismatch,
                       fmt::format("v{}: /weight_checker: the weights differ from the baseline in {}", version,
                                   r->value("mismatches", Json::array()).dump().substr(0, 500)));
      ARLO_INFO("vllm admin {}: v{} matches the baseline's {} parameter checksums", url_, version,
                options_.verify_baseline.size());
      checksum_ = fmt::format("match:{}", options_.verify_baseline.size());
    } else {
      const std::size_t n =
          r->is_object() && r->contains("checksums") && (*r)["checksums"].is_object() ? (*r)["checksums"].size() : 0;
      if (n == 0)
        co_return here(ErrorCode::kMismatch, fmt::format("v{}: /weight_checker reported no parameter checksums: {}",
                                                         version, r->dump().substr(0, 200)));
      ARLO_INFO("vllm admin {}: v{}: /weight_checker reports {} parameter checksums", url_, version, n);
      checksum_ = fmt::format("checksums:{}", n);
    }
    unverified_.reset();
    co_return ok();
  }

  std::optional<ServerVersion> version_;
  std::optional<int> world_size_;
  Json group_ = Json::object();  // that generation's group
  std::optional<std::int64_t> pending_version_;
  std::optional<std::int64_t> committed_version_;
  std::optional<std::int64_t> unverified_;  // committed, not yet checked (verify_weights)
  std::string checksum_;
  bool has_weight_info_ = true;
  bool backend_checked_ = false;    // the "arlo" backend answered /init_weight_transfer_engine
  bool unique_id_refused_ = false;  // the server refused nccl_unique_id_b64: the store from then on
};

}  // namespace

AdminDialectInfo vllm_admin_dialect() {
  return {"vllm",
          "",
          AdminDialect::kVllm,
          // Its weight-transfer API takes NCCL (vLLM's own backend) and, through arlo's backend
          // (python/arlo_vllm), arlo's own transports: streams, files, chains.
          {.title = "vLLM", .streams = true, .loads_durable = true, .relays = true, .joins_collective = true},
          {},
          [](http::Client& client, std::string base_url, AdminOptions options) -> std::unique_ptr<AdminClient> {
            return std::make_unique<VllmAdmin>(client, std::move(base_url), std::move(options));
          }};
}

}  // namespace arlo::rollout
