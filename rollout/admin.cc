#include "rollout/admin.h"

#include <fmt/format.h>

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

std::string_view to_string(PauseMode m) {
  switch (m) {
    case PauseMode::kKeep: return "keep";
    case PauseMode::kWait: return "wait";
    case PauseMode::kAbort: return "abort";
  }
  return "?";
}

namespace {

// Shared plumbing: one admin call with deadline, retry policy and error mapping.
class AdminBase : public AdminClient {
 public:
  AdminBase(http::Client& client, std::string url, AdminOptions options)
      : client_(client), url_(std::move(url)), options_(options) {
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
  static Call get(std::string target) {
    Call c;
    c.method = http::Verb::get;
    c.target = std::move(target);
    return c;
  }

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
    if (resp->status < 200 || resp->status >= 300)
      co_return make_error(resp->status >= 500 ? ErrorCode::kUnavailable : ErrorCode::kInvalidArgument,
                           fmt::format("{}: HTTP {}: {}", what, resp->status, resp->body.substr(0, 500)));
    if (resp->body.empty()) co_return Json::object();
    auto j = resp->parse_json();
    if (!j) co_return Json(resp->body);  // some servers answer plain text ("OK")
    co_return std::move(*j);
  }

  static Status drop_value(const Result<Json>& r) {
    if (!r) return std::unexpected(r.error());
    return ok();
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

// Builds vLLM's update_info from a weight_sync manifest: {"names", "dtype_names", "shapes"}.
Json manifest_to_update_info(const Json& manifest) {
  Json names = Json::array(), dtypes = Json::array(), shapes = Json::array();
  if (manifest.is_object() && manifest.contains("tensors") && manifest["tensors"].is_array()) {
    for (const auto& t : manifest["tensors"]) {
      names.push_back(t.value("name", ""));
      dtypes.push_back(t.value("dtype", ""));
      shapes.push_back(t.value("shape", Json::array()));
    }
  }
  return {{"names", names}, {"dtype_names", dtypes}, {"shapes", shapes}};
}

class VllmAdmin final : public AdminBase {
 public:
  using AdminBase::AdminBase;
  AdminDialect dialect() const override { return AdminDialect::kVllm; }
  asio::awaitable<Status> pause(PauseMode mode) override {
    co_return drop_value(co_await call(post(fmt::format("/pause?mode={}", to_string(mode)), std::nullopt)));
  }
  asio::awaitable<Status> resume() override { co_return drop_value(co_await call(post("/resume", std::nullopt))); }
  asio::awaitable<Status> prepare_weights(const WeightUpdate& u) override {
    if (!engine_ready_) {
      if (!u.extra.contains("init_info") || !u.extra["init_info"].is_object())
        co_return make_error(ErrorCode::kInvalidArgument,
                             "vllm admin: the first weight update needs extra.init_info for /init_weight_transfer_engine");
      Json body = {{"init_info", u.extra["init_info"]}};
      auto r = co_await call(post("/init_weight_transfer_engine", std::move(body), false, true));
      if (!r) co_return std::unexpected(std::move(r).error());
      engine_ready_ = true;
    }
    const bool checkpoint_format = u.extra.value("is_checkpoint_format", true);
    Json start_body = {{"is_checkpoint_format", checkpoint_format}};
    auto started = co_await call(post("/start_weight_update", std::move(start_body), false));
    if (!started) co_return std::unexpected(std::move(started).error());
    Json update_info = u.extra.contains("update_info") ? u.extra["update_info"] : manifest_to_update_info(u.manifest);
    Json update_body = {{"update_info", update_info}};
    auto updated = co_await call(post("/update_weights", std::move(update_body), false, true));
    if (!updated) co_return std::unexpected(std::move(updated).error());
    pending_version_ = u.version;
    co_return ok();
  }
  asio::awaitable<Status> commit_weights(std::int64_t version) override {
    if (pending_version_ != version)
      co_return make_error(ErrorCode::kMismatch, fmt::format("vllm admin {}: commit of version {} but the prepared version is {}",
                                                             url_, version, pending_version_ ? std::to_string(*pending_version_) : "none"));
    auto r = co_await call(post("/finish_weight_update", Json::object(), false, true));
    if (!r) co_return std::unexpected(std::move(r).error());
    committed_version_ = version;
    pending_version_.reset();
    co_return ok();
  }
  asio::awaitable<Result<WeightsInfo>> weights() override {
    // vLLM has no version route; report what this adapter committed.
    co_return WeightsInfo{committed_version_, ""};
  }

 private:
  bool engine_ready_ = false;
  std::optional<std::int64_t> pending_version_;
  std::optional<std::int64_t> committed_version_;
};

class SglangAdmin final : public AdminBase {
 public:
  using AdminBase::AdminBase;
  AdminDialect dialect() const override { return AdminDialect::kSglang; }
  asio::awaitable<Status> pause(PauseMode mode) override {
    if (mode == PauseMode::kWait)
      co_return make_error(ErrorCode::kInvalidArgument,
                           "sglang admin: /pause_generation has no 'wait' mode; use keep (in_place) or abort");
    const char* m = mode == PauseMode::kKeep ? "in_place" : "abort";
    Json body = {{"mode", m}};
    co_return drop_value(co_await call(post("/pause_generation", std::move(body))));
  }
  asio::awaitable<Status> resume() override {
    co_return drop_value(co_await call(post("/continue_generation", Json::object())));
  }
  asio::awaitable<Status> prepare_weights(const WeightUpdate& u) override {
    const std::string version = std::to_string(u.version);
    if (u.extra.contains("model_path")) {  // a version on disk (a durable transport)
      if (!u.extra["model_path"].is_string())
        co_return make_error(ErrorCode::kInvalidArgument, "sglang admin: extra.model_path must be a string");
      Json body = {{"model_path", u.extra["model_path"]},
                   {"load_format", u.extra.value("load_format", "auto")},
                   {"flush_cache", true},
                   {"weight_version", version}};
      co_return check_success(co_await call(post("/update_weights_from_disk", std::move(body), false, true)));
    }
    if (!group_ready_) {
      if (!u.extra.contains("group") || !u.extra["group"].is_object())
        co_return make_error(ErrorCode::kInvalidArgument,
                             "sglang admin: the first distributed update needs extra.group for /init_weights_update_group");
      auto r = check_success(co_await call(post("/init_weights_update_group", u.extra["group"], false, true)));
      if (!r) co_return r;
      group_name_ = u.extra["group"].value("group_name", "weight_update_group");
      group_ready_ = true;
    }
    Json info = manifest_to_update_info(u.manifest);
    Json body = {{"names", info["names"]},
                 {"dtypes", info["dtype_names"]},
                 {"shapes", info["shapes"]},
                 {"group_name", group_name_},
                 {"flush_cache", true},
                 {"weight_version", version}};
    co_return check_success(co_await call(post("/update_weights_from_distributed", std::move(body), false, true)));
  }
  asio::awaitable<Status> commit_weights(std::int64_t) override { co_return ok(); }
  asio::awaitable<Result<WeightsInfo>> weights() override {
    auto r = co_await call(get("/get_weight_version"));
    if (!r) co_return std::unexpected(std::move(r).error());
    WeightsInfo info;
    if (r->is_object() && r->contains("weight_version")) {
      const auto& v = (*r)["weight_version"];
      try {
        if (v.is_number_integer()) info.version = v.get<std::int64_t>();
        else if (v.is_string()) info.version = std::stoll(v.get<std::string>());
      } catch (const std::exception&) {
        // a non-numeric version label: leave unset
      }
    }
    co_return info;
  }

 private:
  // SGLang answers {"success": false, "message": ...} with HTTP 200 on some failures.
  Status check_success(const Result<Json>& r) {
    if (!r) return std::unexpected(r.error());
    if (r->is_object() && r->contains("success") && (*r)["success"].is_boolean() && !(*r)["success"].get<bool>())
      return make_error(ErrorCode::kUnavailable, fmt::format("sglang admin {}: update refused: {}", url_, r->value("message", "")));
    return ok();
  }
  bool group_ready_ = false;
  std::string group_name_ = "weight_update_group";
};

}  // namespace

std::unique_ptr<AdminClient> make_admin_client(AdminDialect dialect, http::Client& client, std::string base_url,
                                               AdminOptions options) {
  switch (dialect) {
    case AdminDialect::kVllm: return std::make_unique<VllmAdmin>(client, std::move(base_url), options);
    case AdminDialect::kSglang: return std::make_unique<SglangAdmin>(client, std::move(base_url), options);
    case AdminDialect::kArlo: break;
  }
  return std::make_unique<ArloAdmin>(client, std::move(base_url), options);
}

}  // namespace arlo::rollout
