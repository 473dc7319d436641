// The arlo-worker admin dialect (rollout/admin.h has the table of calls).
#include <charconv>

#include "rollout/admin_dialects/admin_base.h"

namespace arlo::rollout {

namespace {

using namespace admin_detail;

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
      if (r->contains("version") && (*r)["version"].is_number_integer())
        info.version = (*r)["version"].get<std::int64_t>();
      if (r->contains("checksum") && (*r)["checksum"].is_string()) info.checksum = (*r)["checksum"].get<std::string>();
    }
    co_return info;
  }
};

}  // namespace

AdminDialectInfo arlo_admin_dialect() {
  return {"arlo",
          "arlo-worker",
          AdminDialect::kArlo,
          // /weights/prepare hands the worker's Subscriber the receiver block (tcp, shm, files).
          {.title = "arlo-worker",
           .streams = true,
           .loads_durable = true,
           .relays = true,
           .host_memory = true,
           .builtin_tokenizer = true},
          {},
          [](http::Client& client, std::string base_url, AdminOptions options) -> std::unique_ptr<AdminClient> {
            return std::make_unique<ArloAdmin>(client, std::move(base_url), std::move(options));
          }};
}

}  // namespace arlo::rollout
