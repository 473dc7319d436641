// The locked door (issue 15): an unauthenticated request to each listening plane is refused, over
// real sockets and a real arlo-worker process; a worker loads weights only from what its own
// configuration allows; planes bound off loopback refuse to start without a token.
//
// Planes: the worker's HTTP server (admin and OpenAI routes; the orchestrator's status server is the
// same http::Server with the same token rule), the trainer bridge (socket), the tcp weight publisher.
#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <thread>

#include "common/http.h"
#include "testing/process.h"
#include "tests/unit/weight_sync/test_util.h"
#include "trainer_bridge/bridge.h"
#include "weight_sync/weight_sync.h"

namespace arlo {
namespace {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

constexpr const char* kToken = "e2e-security-token-3f9c";

// Scoped $ARLO_TOKEN (children spawned meanwhile inherit it; parts created meanwhile read it).
struct TokenEnv {
  explicit TokenEnv(const char* value) {
    if (value)
      ::setenv("ARLO_TOKEN", value, 1);
    else
      ::unsetenv("ARLO_TOKEN");
    ::unsetenv("ARLO_TOKEN_FILE");
  }
  ~TokenEnv() { ::unsetenv("ARLO_TOKEN"); }
};

Result<http::Response> call(http::Verb method, const std::string& url, const std::string& token = "",
                            const json& body = nullptr) {
  asio::io_context io;
  http::ClientOptions co;
  co.retry.max_attempts = 1;
  co.token = token;
  http::Client client(io, co);
  http::ClientRequest req;
  req.method = method;
  req.url = url;
  if (!body.is_null()) req.body = body.dump();
  req.timeout = 30s;
  Result<http::Response> out = make_error(ErrorCode::kInternal, "not run");
  asio::co_spawn(
      io, [&]() -> asio::awaitable<void> { out = co_await client.request(std::move(req)); }, asio::detached);
  io.run();
  return out;
}

std::string error_message(const http::Response& r) {
  auto j = json::parse(r.body, nullptr, false);
  return j.is_object() && j.contains("error") ? j["error"].value("message", std::string()) : r.body;
}

class Worker {
 public:
  Worker(const fs::path& dir, std::vector<std::string> extra) : log_(dir / "worker.log") {
    std::vector<std::string> argv{ARLO_WORKER_BINARY, "--port", "0", "--threads", "1", "--init-seed", "1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    pid_ = e2e::spawn_logged(argv, log_);
    if (e2e::wait_for_text(log_, "listening on ", pid_, 60s)) {
      const auto text = e2e::read_text(log_);
      const auto at = text.find("listening on ") + 13;
      url_ = "http://" + text.substr(at, text.find('\n', at) - at);
    }
  }
  ~Worker() {
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  const std::string& url() const { return url_; }
  std::string log() const { return e2e::read_text(log_); }

 private:
  fs::path log_;
  pid_t pid_ = -1;
  std::string url_;
};

fs::path temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("arlo-e2e-security-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(SecurityFault, WorkerHttpPlaneWantsTheBearerToken) {
  const auto dir = temp_dir("worker");
  TokenEnv env(kToken);
  Worker w(dir, {"--allow-weights-from", (dir / "allowed").string()});
  ASSERT_FALSE(w.url().empty()) << w.log();
  // No token, a wrong one: 401 with a JSON error, on the admin and the OpenAI routes alike.
  for (const auto& [verb, path] :
       std::vector<std::pair<http::Verb, std::string>>{{http::Verb::post, "/pause"},
                                                       {http::Verb::post, "/weights/prepare"},
                                                       {http::Verb::get, "/weights"},
                                                       {http::Verb::get, "/v1/models"},
                                                       {http::Verb::post, "/v1/completions"},
                                                       {http::Verb::get, "/metrics"}}) {
    for (const std::string token : {"", "wrong-token"}) {
      auto r = call(verb, w.url() + path, token, verb == http::Verb::post ? json::object() : json());
      ASSERT_TRUE(r) << r.error().what();
      EXPECT_EQ(r->status, 401) << path << " " << r->body;
      auto j = json::parse(r->body, nullptr, false);
      ASSERT_TRUE(j.is_object()) << r->body;
      EXPECT_EQ(j["error"]["type"], "authentication_error") << r->body;
      EXPECT_NE(error_message(*r).find(token.empty() ? "needs a token" : "wrong"), std::string::npos) << r->body;
    }
  }
  // /health stays open (supervisors probe it); the token opens the rest.
  auto health = call(http::Verb::get, w.url() + "/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200) << health->body;
  auto weights = call(http::Verb::get, w.url() + "/weights", kToken);
  ASSERT_TRUE(weights);
  EXPECT_EQ(weights->status, 200) << weights->body;
  fs::remove_all(dir);
}

TEST(SecurityFault, WorkerLoadsOnlyFromAllowedSources) {
  const auto dir = temp_dir("sources");
  fs::create_directories(dir / "allowed");
  fs::create_directories(dir / "elsewhere");
  TokenEnv env(kToken);
  Worker w(dir,
           {"--allow-weights-from", (dir / "allowed").string(), "--weight-sync", R"({"transport": "filesystem"})"});
  ASSERT_FALSE(w.url().empty()) << w.log();
  auto prepare = [&](const json& block) {
    auto r = call(http::Verb::post, w.url() + "/weights/prepare", kToken, {{"version", 1}, {"weight_sync", block}});
    EXPECT_TRUE(r) << (r ? "" : r.error().what());
    return r ? *r : http::Response{};
  };
  // A directory outside the allowed ones, also through "..": 403 naming the directory.
  for (const auto& d : {(dir / "elsewhere").string(), (dir / "allowed" / ".." / "elsewhere").string(), std::string("/"),
                        std::string("/etc")}) {
    auto r = prepare({{"transport", "filesystem"}, {"dir", d}});
    EXPECT_EQ(r.status, 403) << d << " " << r.body;
    EXPECT_NE(error_message(r).find("outside the directories this worker loads weights from"), std::string::npos)
        << r.body;
  }
  // Another transport than the worker's own block names: 403.
  auto tcp = prepare({{"transport", "tcp"}, {"address", "127.0.0.1:9"}});
  EXPECT_EQ(tcp.status, 403) << tcp.body;
  EXPECT_NE(error_message(tcp).find("takes weights over filesystem only"), std::string::npos) << tcp.body;
  // Inside the allowed directory: accepted (the transfer itself then waits for a STABLE version).
  auto inside = prepare({{"transport", "filesystem"}, {"dir", (dir / "allowed").string()}, {"timeout_ms", 1000}});
  EXPECT_EQ(inside.status, 200) << inside.body;
  fs::remove_all(dir);
}

TEST(SecurityFault, WorkerTcpSourcesAreLoopbackOrListedHosts) {
  const auto dir = temp_dir("hosts");
  TokenEnv env(kToken);
  Worker w(dir, {});
  ASSERT_FALSE(w.url().empty()) << w.log();
  auto r = call(http::Verb::post, w.url() + "/weights/prepare", kToken,
                {{"version", 1}, {"weight_sync", {{"transport", "tcp"}, {"address", "192.0.2.7:29500"}}}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 403) << r->body;
  EXPECT_NE(error_message(*r).find("not a host this worker loads weights from (loopback only)"), std::string::npos)
      << r->body;
  fs::remove_all(dir);
}

TEST(SecurityFault, PlanesOffLoopbackRefuseToStartWithoutToken) {
  const auto dir = temp_dir("bind");
  TokenEnv env(nullptr);
  const auto log = dir / "w.log";
  const pid_t pid =
      e2e::spawn_logged({ARLO_WORKER_BINARY, "--bind", "0.0.0.0", "--port", "0", "--init-seed", "1"}, log);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0);
  EXPECT_NE(e2e::read_text(log).find("which other hosts can reach, without a token"), std::string::npos)
      << e2e::read_text(log);

  asio::io_context io;
  bridge::ServerOptions bo;
  bo.transport = "socket";
  bo.bind = "0.0.0.0";
  auto server = bridge::BridgeServer::create(io, bo);
  ASSERT_TRUE(server);
  auto started = (*server)->start();
  ASSERT_FALSE(started);
  EXPECT_NE(started.error().message().find("the trainer bridge (socket) would listen on 0.0.0.0"), std::string::npos);

  weight_sync::Options po;
  po.transport = "tcp";
  po.params = {{"address", "0.0.0.0:0"}};
  auto pub = weight_sync::Publisher::create(po);
  ASSERT_FALSE(pub);
  EXPECT_NE(pub.error().what().find("the tcp weight publisher would listen on"), std::string::npos)
      << pub.error().what();
  fs::remove_all(dir);
}

// The bridge on an io thread of its own; calls hop there.
struct BridgeOnThread {
  explicit BridgeOnThread(const std::string& token) {
    bridge::ServerOptions bo;
    bo.transport = "socket";
    bo.token = token;
    bo.heartbeat_timeout = 30s;
    server = std::move(bridge::BridgeServer::create(io, bo).value());
    server->on_version([this](bridge::VersionEvent v) { versions.push_back(v.version); });
    EXPECT_TRUE(server->start());
    thread = std::thread([this] { io.run(); });
  }
  ~BridgeOnThread() {
    std::promise<void> stopped;
    asio::post(io, [&] {
      server->stop();
      stopped.set_value();
    });
    stopped.get_future().wait();
    guard.reset();
    io.stop();
    thread.join();
  }
  std::vector<std::int64_t> seen() {
    std::promise<std::vector<std::int64_t>> p;
    asio::post(io, [&] { p.set_value(versions); });
    return p.get_future().get();
  }
  asio::io_context io;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard{asio::make_work_guard(io)};
  std::unique_ptr<bridge::BridgeServer> server;
  std::vector<std::int64_t> versions;  // io thread
  std::thread thread;
};

TEST(SecurityFault, BridgeRefusesTrainersWithoutTheToken) {
  BridgeOnThread b(kToken);
  for (const std::string token : {"", "wrong-token"}) {
    TokenEnv env(nullptr);
    bridge::ClientOptions co;
    co.transport = "socket";
    co.port = b.server->port();
    co.token = token;
    auto client = bridge::connect(co);
    ASSERT_TRUE(client);
    ASSERT_TRUE((*client)->published(5));
    auto batch = (*client)->next_batch(30s);
    ASSERT_FALSE(batch);
    EXPECT_NE(batch.error().what().find("authentication failed"), std::string::npos) << batch.error().what();
    (*client)->close();
  }
  EXPECT_TRUE(b.seen().empty());  // nobody unauthenticated announced a version

  // A frame header claiming a huge HELLO before authentication: the connection is closed unread.
  {
    asio::io_context io;
    asio::ip::tcp::socket sock(io);
    sock.connect({asio::ip::make_address("127.0.0.1"), b.server->port()});
    std::array<unsigned char, 9> head{};
    head[0] = 1;  // HELLO
    const std::uint64_t n = 1ull << 30;
    for (int i = 0; i < 8; ++i) head[1 + i] = static_cast<unsigned char>(n >> (8 * i));
    asio::write(sock, asio::buffer(head));
    std::array<char, 4096> sink{};
    boost::system::error_code ec;
    std::size_t total = 0;
    while (!ec) total += sock.read_some(asio::buffer(sink), ec);  // CHALLENGE, then the close
    EXPECT_TRUE(ec == asio::error::eof || ec == asio::error::connection_reset) << ec.message();
    EXPECT_LT(total, 4096u);
  }

  // With the token: accepted, its version announced.
  TokenEnv env(kToken);
  bridge::ClientOptions co;
  co.transport = "socket";
  co.port = b.server->port();
  auto client = bridge::connect(co);  // the token from $ARLO_TOKEN
  ASSERT_TRUE(client);
  ASSERT_TRUE((*client)->published(7));
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (b.seen().empty() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(b.seen(), std::vector<std::int64_t>{7});
  (*client)->close();
}

TEST(SecurityFault, TcpPublisherServesOnlyReceiversWithTheToken) {
  using namespace weight_sync;
  Options po;
  po.transport = "tcp";
  po.bucket_bytes = testing::kTestBucket;
  po.bucket_timeout = 10s;
  po.timeout = 30s;
  po.params = {{"address", "127.0.0.1:0"}};
  std::unique_ptr<Publisher> pub;
  {
    TokenEnv env(kToken);
    pub = std::move(Publisher::create(po).value());
  }
  HostWeights source(testing::odd_specs());
  testing::fill(source, 3);
  Options ro;
  ro.transport = "tcp";
  ro.bucket_timeout = 10s;
  ro = testing::reaching(ro, pub->endpoint());
  // A receiver with no token and one with a wrong one are refused; one with the run's token gets
  // every byte.
  struct Receiver {
    const char* token;
    bool admitted;
  };
  for (const auto& r : {Receiver{nullptr, false}, Receiver{"wrong-token", false}, Receiver{kToken, true}}) {
    TokenEnv env(r.token);
    ro.peer_name = r.admitted ? "worker" : "intruder";
    auto sub = Subscriber::create(ro);
    ASSERT_TRUE(sub);
    HostWeights sink(testing::odd_specs());
    auto receiving = std::async(std::launch::async, [&] { return (*sub)->receive(sink, deadline_in(30s)); });
    // A refused receiver is gone at once; the publisher then has nobody to serve until its deadline.
    auto report = pub->publish(r.admitted ? 2 : 1, source, deadline_in(r.admitted ? 30s : 5s));
    auto got = receiving.get();
    if (r.admitted) {
      ASSERT_TRUE(got) << got.error().what();
      ASSERT_TRUE(report && report->all_ok());
      EXPECT_TRUE(testing::same_bytes(sink, source));
      continue;
    }
    ASSERT_FALSE(got);
    EXPECT_NE(got.error().what().find("the publisher refused this receiver: authentication failed"), std::string::npos)
        << got.error().what();
    EXPECT_FALSE(testing::same_bytes(sink, source));  // not one byte of the weights
    EXPECT_FALSE(report && report->all_ok());
  }
}

}  // namespace
}  // namespace arlo
