// SGLang's admin dialect (rollout/admin.h has the table of calls).
#include <charconv>

#include "rollout/admin_dialects/admin_base.h"

namespace arlo::rollout {

namespace {

using namespace admin_detail;

// ---- SGLang ----

Result<Json> sglang_group_body(const Json& group) {
  Json body = Json::object();
  ARLO_TRY(copy_keys(group, {"master_address", "master_port", "rank_offset", "world_size", "group_name"}, body));
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
        co_return here(
            ErrorCode::kInvalidArgument,
            fmt::format(
                "v{}: the update has neither a collective session (transport nccl) nor extra.model_path (a string)",
                u.version));
      co_return co_await call_status(
          transfer("/update_weights_from_disk", sglang_disk_body(u.extra, idle_, u.version)));
    }
    auto& session = u.collective;
    if (!tp_) {
      auto world = co_await tp_size();
      if (!world) co_return std::unexpected(std::move(world).error());
      tp_ = *world;
    }
    auto fresh = co_await new_group(*session, *tp_, "weight-update group");
    if (!fresh) co_return std::unexpected(std::move(fresh).error());
    if (*fresh) {
      auto body = sglang_group_body(**fresh);
      if (!body) co_return std::unexpected(std::move(body).error());
      if (joined_once_) {  // the previous group's communicator holds GPU memory on the server: free it
        auto gone = co_await call(post("/destroy_weights_update_group", sglang_destroy_body(group_name_), false));
        if (!gone) ARLO_WARN("sglang admin {}: destroying group {}: {}", url_, group_name_, gone.error().what());
      }
      auto init = co_await join_group(*session, **fresh, transfer("/init_weights_update_group", *body));
      if (!init) co_return init;
      group_name_ =
          (*body)["group_name"].is_string() ? (*body)["group_name"].get<std::string>() : "weight_update_group";
      joined_once_ = true;
    }
    const std::int64_t gen = *generation_;
    auto tensors = co_await session->tensors();
    Result<TensorLists> lists =
        tensors ? tensor_lists(*tensors) : Result<TensorLists>(std::unexpected(tensors.error()));
    if (!lists) {
      session->failed(url_, gen, lists.error().what());
      generation_.reset();
      co_return std::unexpected(std::move(lists).error());
    }
    auto sent = co_await transfer_collective(
        session, gen, u.version,
        call_status(transfer("/update_weights_from_distributed",
                             sglang_distributed_body(*lists, group_name_, idle_, u.version))));
    if (!sent) {
      generation_.reset();
      co_return std::unexpected(std::move(sent).error());
    }
    // The broadcast carried a newer version than the label sent with the metadata: relabel.
    if (*sent != u.version) co_return co_await call_status(post("/update_weight_version", sglang_version_body(*sent)));
    co_return ok();
  }
  asio::awaitable<Status> commit_weights(std::int64_t) override { co_return ok(); }
  // GET /model_info's weight_version. An older server, whose /model_info is missing or lacks the
  // field, has it under /get_weight_version, which current SGLang answers with 404 ("deprecated,
  // use /model_info").
  asio::awaitable<Result<WeightsInfo>> weights() override {
    auto r = co_await call(get("/model_info"));
    const bool found = r && r->is_object() && r->contains("weight_version");
    if (!found && (r || r.error().code() == ErrorCode::kNotFound)) {
      auto old = co_await call(get("/get_weight_version"));
      if (old || !r) r = std::move(old);
    }
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
    const bool dp_attention = r->is_object() && r->contains("enable_dp_attention") &&
                              (*r)["enable_dp_attention"].is_boolean() && (*r)["enable_dp_attention"].get<bool>();
    if (number("dp_size", 1) > 1 && !dp_attention)
      co_return here(ErrorCode::kInvalidArgument,
                     fmt::format("dp_size {} without DP attention: SGLang's distributed weight update needs dp_size 1; "
                                 "run one server per replica",
                                 number("dp_size", 1)));
    if (number("pp_size", 1) > 1)
      co_return here(
          ErrorCode::kInvalidArgument,
          fmt::format(
              "pp_size {}: SGLang's distributed weight update gives pipeline stages no ranks; use tensor parallelism",
              number("pp_size", 1)));
    co_return tp;
  }

  std::optional<int> tp_;  // the server's tensor-parallel size (its ranks), asked once
  bool idle_ = false;      // nothing runs: the last pause aborted or followed a drain
  std::string group_name_ = "weight_update_group";
  bool joined_once_ = false;  // a group was initialised on the server (destroyed before the next)
};

}  // namespace

AdminDialectInfo sglang_admin_dialect() {
  return {"sglang",
          "",
          AdminDialect::kSglang,
          // /update_weights_from_distributed (NCCL) or /update_weights_from_disk (extra.model_path).
          {.title = "SGLang", .loads_durable = true, .joins_collective = true, .takes_model_path = true},
          {},
          [](http::Client& client, std::string base_url, AdminOptions options) -> std::unique_ptr<AdminClient> {
            return std::make_unique<SglangAdmin>(client, std::move(base_url), std::move(options));
          }};
}

}  // namespace arlo::rollout
