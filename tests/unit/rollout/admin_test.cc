// Admin adapters against InferenceServerFake's arlo, vLLM and SGLang personalities on loopback: the
// routes, bodies and retries each adapter sends, from the fake's request log.
#include <gtest/gtest.h>

#include "rollout/admin.h"
#include "testing/inference_server_fake.h"
#include "tests/unit/rollout/rollout_test_util.h"

namespace arlo::rollout {
namespace {

using test::run;
namespace asio = boost::asio;

using testing::Dialect;
using testing::InferenceServerFake;

// Built outside coroutines: GCC 12 mis-compiles string literals in braced initialisers inside them.
WeightUpdate upd(std::int64_t version, std::string transport, Json manifest, Json extra) {
  WeightUpdate u;
  u.version = version;
  u.weight_sync = {{"transport", std::move(transport)}};
  u.manifest = std::move(manifest);
  u.extra = std::move(extra);
  return u;
}

AdminOptions fast() {
  AdminOptions o;
  o.call_timeout = std::chrono::seconds(5);
  o.transfer_timeout = std::chrono::seconds(5);
  o.retry = {3, std::chrono::milliseconds(1), std::chrono::milliseconds(5)};
  return o;
}

Json manifest() {
  return Json::parse(R"({"tensors": [{"name": "model.embed_tokens.weight", "dtype": "bfloat16", "shape": [32, 8]},
                                     {"name": "lm_head.weight", "dtype": "bfloat16", "shape": [32, 8]}]})");
}

TEST(AdminArlo, RoutesAndBodiesFollowDesignSection3) {
  asio::io_context io;
  InferenceServerFake srv(io, {.dialect = Dialect::kArlo});
  srv.arlo.checksum = "abc123";  // GET /weights reports it with the committed version
  http::Client client(io);
  auto admin = make_admin_client(AdminDialect::kArlo, client, srv.url(), fast());
  run(io, [&]() -> asio::awaitable<void> {
    srv.fail_next = 1;  // a transient 503 is retried
    EXPECT_TRUE(co_await admin->pause(PauseMode::kKeep));
    EXPECT_TRUE(co_await admin->prepare_weights(upd(5, "tcp", manifest(), Json::object())));
    EXPECT_TRUE(co_await admin->commit_weights(5));
    EXPECT_TRUE(co_await admin->resume());
    auto w = co_await admin->weights();
    EXPECT_TRUE(w);
    if (w) {
      EXPECT_EQ(w->version, 5);
      EXPECT_EQ(w->checksum, "abc123");
    }
  }());
  ASSERT_EQ(srv.requests.size(), 6u);
  EXPECT_EQ(srv.targets[0], "/pause?mode=keep");
  EXPECT_EQ(srv.targets[1], "/pause?mode=keep");
  EXPECT_EQ(srv.targets[2], "/weights/prepare");
  EXPECT_EQ(srv.request_bodies[2]["version"], 5);
  EXPECT_EQ(srv.request_bodies[2]["weight_sync"]["transport"], "tcp");
  EXPECT_EQ(srv.request_bodies[2]["manifest"], manifest());
  EXPECT_EQ(srv.request_bodies[3], Json({{"version", 5}}));
  EXPECT_EQ(srv.targets[4], "/resume");
  EXPECT_EQ(srv.requests[5], "GET /weights");
}

// The collective sequences are in admin_collective_test.cc; here the plain routes and the retry rule.
TEST(AdminVllm, PauseResumeRoutesAndProbesRetried) {
  asio::io_context io;
  InferenceServerFake srv(io, {.dialect = Dialect::kVllm});
  srv.weight_version = "12";  // what /weight_info reports
  http::Client client(io);
  auto admin = make_admin_client(AdminDialect::kVllm, client, srv.url(), fast());
  run(io, [&]() -> asio::awaitable<void> {
    EXPECT_TRUE(co_await admin->pause(PauseMode::kWait));
    EXPECT_TRUE(co_await admin->resume());
    srv.fail_next = 1;  // a transient 503 on a probe is retried
    auto w = co_await admin->weights();
    EXPECT_TRUE(w && w->version == 12);
  }());
  EXPECT_EQ(srv.targets, (std::vector<std::string>{"/pause?mode=wait", "/resume", "/weight_info", "/weight_info"}));
}

TEST(AdminSglang, TransferCallsAreNotRetriedButPausesAre) {
  asio::io_context io;
  InferenceServerFake srv(io, {.dialect = Dialect::kSglang});
  http::Client client(io);
  auto admin = make_admin_client(AdminDialect::kSglang, client, srv.url(), fast());
  const Json disk_extra = {{"model_path", "/runs/x/weights/v8"}};
  const WeightUpdate disk = upd(8, "filesystem", manifest(), disk_extra);
  run(io, [&]() -> asio::awaitable<void> {
    srv.fail_next = 1;
    EXPECT_TRUE(co_await admin->pause(PauseMode::kAbort));
    srv.fail_next = 1;
    auto r = co_await admin->prepare_weights(disk);
    EXPECT_FALSE(r);
    if (!r) {
      EXPECT_NE(r.error().what().find("/update_weights_from_disk: HTTP 503"), std::string::npos) << r.error().what();
    }
  }());
  ASSERT_EQ(srv.requests.size(), 3u);
  EXPECT_EQ(srv.request_bodies[1], Json({{"mode", "abort"}}));
  EXPECT_EQ(srv.request_bodies[2]["flush_cache"], true);  // after abort nothing runs
}

TEST(Admin, UnreachableServerFailsWithinTheDeadline) {
  asio::io_context io;
  http::Client client(io);
  AdminOptions o = fast();
  o.call_timeout = std::chrono::milliseconds(500);
  auto admin = make_admin_client(AdminDialect::kArlo, client, "http://127.0.0.1:1", o);
  run(io, [&]() -> asio::awaitable<void> {
    auto r = co_await admin->pause(PauseMode::kAbort);
    EXPECT_FALSE(r);
  }());
  EXPECT_FALSE(parse_admin_dialect("tgi"));
  EXPECT_EQ(*parse_admin_dialect("sglang"), AdminDialect::kSglang);
}

TEST(AdminDialects, RegistryNamesEachDialectAndBuildsItsAdapter) {
  asio::io_context io;
  http::Client client(io);
  std::vector<std::string> names;
  for (const auto& d : admin_dialects()) {
    names.push_back(d.name);
    EXPECT_FALSE(d.server.title.empty()) << d.name << ": its servers need a name for check-config's messages";
    auto admin = d.make(client, "http://127.0.0.1:1/", fast());
    ASSERT_TRUE(admin) << d.name;
    EXPECT_EQ(admin->dialect(), d.completions) << d.name;
    EXPECT_EQ(admin->url(), "http://127.0.0.1:1") << d.name;
    EXPECT_EQ(*parse_admin_dialect(d.name), d.completions);
    auto by_name = make_admin_client(std::string_view(d.name), client, "http://127.0.0.1:1", fast());
    ASSERT_TRUE(by_name);
    EXPECT_EQ(by_name->dialect(), d.completions);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"arlo", "vllm", "sglang"}));
  for (const auto dialect : {AdminDialect::kArlo, AdminDialect::kVllm, AdminDialect::kSglang})
    EXPECT_EQ(make_admin_client(dialect, client, "http://127.0.0.1:1", fast())->dialect(), dialect);
  auto unknown = parse_admin_dialect("tgi");
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().message(), "unknown inference.kind 'tgi': use arlo, vllm or sglang");
  EXPECT_EQ(make_admin_client(std::string_view("tgi"), client, "http://127.0.0.1:1", fast()), nullptr);
}

}  // namespace
}  // namespace arlo::rollout
