// Admin adapters against a real local HTTP server that records each request and answers with the
// response shapes the arlo, vLLM and SGLang servers document.
#include <gtest/gtest.h>

#include "rollout/admin.h"
#include "tests/unit/rollout/rollout_test_util.h"

namespace arlo::rollout {
namespace {

using test::run;
namespace asio = boost::asio;

struct Recorded {
  std::string method;
  std::string target;
  Json body;
};

// Records every request; answers from a table of (path -> response), default {} with 200.
class RecordingServer {
 public:
  RecordingServer(asio::io_context& io, std::vector<std::string> post_paths, std::vector<std::string> get_paths) {
    http::ServerOptions o;
    o.stop_grace = std::chrono::milliseconds(100);
    server_ = std::make_unique<http::Server>(io, o);
    auto handler = [this](http::Request req) -> asio::awaitable<http::Response> {
      Recorded r;
      r.method = req.method == http::Verb::get ? "GET" : "POST";
      r.target = req.target;
      r.body = req.body.empty() ? Json() : Json::parse(req.body, nullptr, false);
      calls.push_back(r);
      if (fail_next > 0) {
        --fail_next;
        co_return http::Response::error(503, "busy");
      }
      auto it = answers.find(req.path);
      co_return it == answers.end() ? http::Response::json(200, Json::object()) : it->second;
    };
    for (const auto& p : post_paths) server_->route(http::Verb::post, p, handler);
    for (const auto& p : get_paths) server_->route(http::Verb::get, p, handler);
    port_ = *server_->start();
  }
  ~RecordingServer() { server_->close(); }
  std::string url() const { return fmt::format("http://127.0.0.1:{}", port_); }

  std::vector<Recorded> calls;
  std::map<std::string, http::Response> answers;
  int fail_next = 0;

 private:
  std::unique_ptr<http::Server> server_;
  std::uint16_t port_ = 0;
};

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
  RecordingServer srv(io, {"/pause", "/resume", "/weights/prepare", "/weights/commit"}, {"/weights"});
  srv.answers["/weights"] = http::Response::json(200, {{"version", 5}, {"checksum", "abc123"}});
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
  ASSERT_EQ(srv.calls.size(), 6u);
  EXPECT_EQ(srv.calls[0].target, "/pause?mode=keep");
  EXPECT_EQ(srv.calls[1].target, "/pause?mode=keep");
  EXPECT_EQ(srv.calls[2].target, "/weights/prepare");
  EXPECT_EQ(srv.calls[2].body["version"], 5);
  EXPECT_EQ(srv.calls[2].body["weight_sync"]["transport"], "tcp");
  EXPECT_EQ(srv.calls[2].body["manifest"], manifest());
  EXPECT_EQ(srv.calls[3].body, Json({{"version", 5}}));
  EXPECT_EQ(srv.calls[4].target, "/resume");
  EXPECT_EQ(srv.calls[5].method, "GET");
}

// The collective sequences are in admin_collective_test.cc; here the plain routes and the retry rule.
TEST(AdminVllm, PauseResumeRoutesAndProbesRetried) {
  asio::io_context io;
  RecordingServer srv(io, {"/pause", "/resume"}, {"/weight_info"});
  srv.answers["/weight_info"] = http::Response::json(200, {{"weight_version", "12"}});
  http::Client client(io);
  auto admin = make_admin_client(AdminDialect::kVllm, client, srv.url(), fast());
  run(io, [&]() -> asio::awaitable<void> {
    EXPECT_TRUE(co_await admin->pause(PauseMode::kWait));
    EXPECT_TRUE(co_await admin->resume());
    srv.fail_next = 1;  // a transient 503 on a probe is retried
    auto w = co_await admin->weights();
    EXPECT_TRUE(w && w->version == 12);
  }());
  std::vector<std::string> targets;
  for (const auto& c : srv.calls) targets.push_back(c.target);
  EXPECT_EQ(targets, (std::vector<std::string>{"/pause?mode=wait", "/resume", "/weight_info", "/weight_info"}));
}

TEST(AdminSglang, TransferCallsAreNotRetriedButPausesAre) {
  asio::io_context io;
  RecordingServer srv(io, {"/pause_generation", "/update_weights_from_disk"}, {});
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
  ASSERT_EQ(srv.calls.size(), 3u);
  EXPECT_EQ(srv.calls[1].body, Json({{"mode", "abort"}}));
  EXPECT_EQ(srv.calls[2].body["flush_cache"], true);  // after abort nothing runs
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
