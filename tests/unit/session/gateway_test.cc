// The policy gateway (session/gateway.h) against the real arlo-worker and real agent programs: the
// example agent (examples/agent/agent.py, a Python process) and, for bad calls, an agent the test
// serves itself. What each trajectory records (prompt ids, loss mask, logprobs, turns, reward), and
// that bad calls are clear, counted 4xx errors while the run goes on.
#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/http.h"
#include "common/metrics.h"
#include "rollout/inference_pool.h"
#include "session/adapters/agent_inference.h"
#include "session/gateway.h"
#include "tests/integration/worker/child_process.h"

namespace arlo::session {
namespace {

namespace asio = boost::asio;
using json = nlohmann::json;

constexpr const char* kToken = "gateway-test-token";

// arlo-worker's character vocabulary (reference/tokenizer.h): what the example agent's token_ids
// mode appends for its feedback.
std::vector<std::int32_t> char_ids(const std::string& text) {
  std::vector<std::int32_t> out;
  for (char c : text) out.push_back(c == '\n' ? 8 : 9 + (c - 32));
  return out;
}

std::shared_ptr<const Task> sum_task() {
  Task t;
  t.id = "sum-1";
  t.env = "arithmetic";
  t.prompt = "23+45=";
  t.answer = "68";
  return std::make_shared<const Task>(std::move(t));
}

class Child {
 public:
  explicit Child(std::vector<std::string> argv) : proc_(argv) {
    if (auto rest = proc_.wait_for_line("listening on ", std::chrono::seconds(60))) url_ = "http://" + *rest;
  }
  const std::string& url() const { return url_; }

 private:
  testing::ChildProcess proc_;
  std::string url_;
};

class GatewayTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    worker_ =
        new Child({ARLO_WORKER_BINARY, "--port", "0", "--threads", "1", "--log-level", "warn", "--init-seed", "1"});
  }
  static void TearDownTestSuite() {
    delete worker_;
    worker_ = nullptr;
  }

  void SetUp() override {
    ASSERT_FALSE(worker_->url().empty()) << "arlo-worker did not start";
    rollout::PoolOptions po;
    po.client.token = kToken;
    pool_ = std::make_unique<rollout::InferencePool>(io_, po);
    pool_->add_worker(worker_->url());
    pool_->start();
  }
  void TearDown() override {
    if (gateway_) gateway_->close();
    pool_->stop();
    io_.run_for(std::chrono::milliseconds(50));
  }

  void start_gateway(std::string agent_url, std::chrono::milliseconds call_timeout = {}) {
    GatewayOptions o;
    o.token = kToken;
    o.agent_url = std::move(agent_url);
    o.call_timeout = call_timeout;
    gateway_ = std::make_unique<Gateway>(io_, *pool_, o);
    auto port = gateway_->start();
    ASSERT_TRUE(port) << port.error().what();
  }

  // Starts the example agent with `flags`; its URL ("" if it did not start).
  std::string start_agent(std::vector<std::string> flags) {
    std::vector<std::string> argv{ARLO_TEST_PYTHON, ARLO_AGENT_SCRIPT, "--port", "0"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    agent_ = std::make_unique<Child>(argv);
    return agent_->url();
  }

  Result<orch::GenerateResult> run_group(int n, std::uint64_t seed = 1) {
    orch::GenerateRequest r;
    r.group_id = 7;
    r.task = sum_task();
    r.n = n;
    r.sampling.max_tokens = 6;
    r.sampling.temperature = 1.0;
    r.seed = seed;
    r.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    std::optional<Result<orch::GenerateResult>> out;
    asio::co_spawn(
        io_, [&]() -> Awaitable<void> { out = co_await gateway_->run(std::move(r)); }, asio::detached);
    while (!out) io_.run_one();
    return std::move(*out);
  }

  // Every sample's per-token vectors line up, and the model's tokens have loss mask 1.
  static void expect_consistent(const Sample& s) {
    EXPECT_EQ(s.completion_tokens.size(), s.logprobs.size());
    EXPECT_EQ(s.completion_tokens.size(), s.loss_mask.size());
    EXPECT_GT(std::count(s.loss_mask.begin(), s.loss_mask.end(), 1), 0);
    EXPECT_TRUE(s.env_reward.has_value());
    EXPECT_FALSE(s.worker.empty());
    ASSERT_FALSE(s.turns.empty());
    EXPECT_EQ(s.turns.back().role, "assistant");
  }

  asio::io_context io_;
  static Child* worker_;
  std::unique_ptr<rollout::InferencePool> pool_;
  std::unique_ptr<Gateway> gateway_;
  std::unique_ptr<Child> agent_;
};

Child* GatewayTest::worker_ = nullptr;

TEST_F(GatewayTest, TokenInTokenOutTrajectoriesRecordEveryTurn) {
  start_gateway(start_agent({"--behave", "token_ids", "--turns", "2"}));
  auto r = run_group(3);
  ASSERT_TRUE(r) << r.error().what();
  ASSERT_EQ(r->completions.size(), 3U);
  std::vector<std::int32_t> prompt{1};  // <bos> then the task's characters
  for (auto id : char_ids("23+45=")) prompt.push_back(id);
  EXPECT_EQ(r->prompt_tokens, prompt);
  const auto feedback = char_ids("\nwrong, try again\n23+45=");
  std::size_t calls = 0;
  for (const auto& s : r->completions) {
    expect_consistent(s);
    calls += s.turn_versions.size();
    // Each turn after the first starts with the feedback's ids, out of the loss, then the model's.
    std::size_t zeros = std::count(s.loss_mask.begin(), s.loss_mask.end(), 0);
    EXPECT_EQ(zeros, feedback.size() * (s.turn_versions.size() - 1));
    if (s.turn_versions.size() > 1) {
      auto first_env = std::find(s.loss_mask.begin(), s.loss_mask.end(), 0) - s.loss_mask.begin();
      std::vector<std::int32_t> env(
          s.completion_tokens.begin() + first_env,
          s.completion_tokens.begin() + first_env + static_cast<std::ptrdiff_t>(feedback.size()));
      EXPECT_EQ(env, feedback);
      EXPECT_EQ(s.logprobs[static_cast<std::size_t>(first_env)], 0.0F);
    }
    EXPECT_EQ(s.turns.size(), s.turn_versions.size());  // token prompts: only the model's turns are text
  }
  const auto st = gateway_->stats();
  EXPECT_EQ(st.calls, calls);
  EXPECT_EQ(st.trajectories, 3U);
  EXPECT_EQ(st.rewrites, 0U);
  EXPECT_EQ(st.agent_failures, 0U);
}

TEST_F(GatewayTest, TextAndChatProgramsExtendTheirTrajectories) {
  // A sample that misses the answer tries again, its second prompt extending the first turn's ids
  // (the <eos> that ended a turn, which the next prompt does not render, left out).
  std::size_t two_turns = 0;
  for (const std::string mode : {"completions", "chat"}) {
    start_gateway(start_agent({"--mode", mode, "--turns", "2"}));
    auto r = run_group(2, 5);
    ASSERT_TRUE(r) << mode << ": " << r.error().what();
    ASSERT_EQ(r->completions.size(), 2U);
    std::size_t one_turn = 0;
    for (const auto& s : r->completions) {
      expect_consistent(s);
      two_turns += s.turn_versions.size() == 2;
      if (s.turn_versions.size() == 1 && s.env_reward != 1.0) {
        // The untrained model wrote a token its text does not render (<unk>, a role, <eos> before
        // the end): the program's next prompt could not extend the trajectory, which ended there.
        ++one_turn;
        const auto& t = s.completion_tokens;
        EXPECT_TRUE(std::any_of(t.begin(), t.end() - 1, [](std::int32_t id) { return id < 7; }) ||
                    (t.back() < 7 && t.back() != 2))
            << mode;
      }
      if (s.turn_versions.size() == 2 && mode == "chat") {
        ASSERT_EQ(s.turns.size(), 3U) << mode;  // the model, the program's feedback, the model
        EXPECT_EQ(s.turns[1].content, "wrong, try again");
      }
    }
    EXPECT_EQ(gateway_->stats().rewrites, one_turn) << mode;
    gateway_->close();
  }
  EXPECT_GE(two_turns, 1U);
}

TEST_F(GatewayTest, ProgramThroughTheOpenAiSdk) {
  start_gateway(start_agent({"--sdk", "--mode", "chat"}));
  auto r = run_group(2, 9);
  ASSERT_TRUE(r) << r.error().what();
  for (const auto& s : r->completions) expect_consistent(s);
}

TEST_F(GatewayTest, RewrittenHistoryEndsTheTrajectoryWhichStillGetsItsReward) {
  start_gateway(start_agent({"--behave", "rewrite", "--turns", "3"}));
  auto r = run_group(2);
  ASSERT_TRUE(r) << r.error().what();
  for (const auto& s : r->completions) {
    expect_consistent(s);
    if (s.env_reward == 1.0) continue;  // solved at the first try: no second call
    EXPECT_EQ(s.turn_versions.size(), 1U);
    EXPECT_EQ(*s.env_reward, 0.0);
  }
  EXPECT_GE(gateway_->stats().rewrites, 1U);
}

TEST_F(GatewayTest, ProgramFailuresFailTheGroupWithTheReason) {
  start_gateway(start_agent({"--behave", "garbage"}));
  auto r = run_group(2);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kParse);
  EXPECT_NE(r.error().what().find("reward"), std::string::npos) << r.error().what();
  EXPECT_EQ(gateway_->stats().agent_failures, 2U);

  start_gateway(start_agent({"--behave", "no_calls"}));
  r = run_group(1);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find("without a model call"), std::string::npos) << r.error().what();

  start_gateway("http://127.0.0.1:1/");  // nobody listens: unavailable, the run goes on
  r = run_group(1);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kUnavailable) << r.error().what();
}

// In-process programs (set_program) by task env: each env's tasks go to its own program (a
// verifiers environment per source), the others to the HTTP program or not to the gateway at all.
TEST_F(GatewayTest, EachEnvItsOwnInProcessProgram) {
  start_gateway("");
  std::vector<std::string> ran;
  auto program = [&ran](std::string name) -> Gateway::Program {
    return [&ran, name](json, std::chrono::steady_clock::time_point) -> Awaitable<Result<double>> {
      ran.push_back(name);
      co_return make_error(ErrorCode::kUnavailable, "program " + name);
    };
  };
  gateway_->set_program("a", program("a"));
  gateway_->set_program("b", program("b"));
  for (const std::string env : {"a", "b", "a"}) {
    Task t;
    t.id = "t-" + env;
    t.env = env;
    t.prompt = "hi";
    EXPECT_TRUE(gateway_->handles(t));
    orch::GenerateRequest r;
    r.task = std::make_shared<const Task>(t);
    r.n = 1;
    r.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    std::optional<Result<orch::GenerateResult>> out;
    asio::co_spawn(
        io_, [&]() -> Awaitable<void> { out = co_await gateway_->run(std::move(r)); }, asio::detached);
    while (!out) io_.run_one();
    ASSERT_FALSE(*out);
    EXPECT_NE(out->error().what().find("program " + env), std::string::npos) << out->error().what();
  }
  EXPECT_EQ(ran, (std::vector<std::string>{"a", "b", "a"}));
  Task other;
  other.env = "arithmetic";
  EXPECT_FALSE(gateway_->handles(other));  // no agent_url: not the gateway's
}

// An agent served by the test: it sends the gateway bad calls, one good one, then a rewrite and a
// call after it, and answers reward 0.25. Each answer's status and error param is kept.
struct ProbeAgent {
  http::Server server;
  std::vector<std::pair<int, std::string>> seen;  // status, error.param
  http::Client* client = nullptr;
  ProbeAgent(asio::io_context& io, http::Client& c) : server(io, http::ServerOptions{}), client(&c) {
    server.route(http::Verb::post, "/", [this](http::Request req) -> Awaitable<http::Response> {
      auto job = json::parse(req.body);
      const std::string base = job["base_url"];
      const std::vector<std::pair<std::string, std::string>> calls = {
          {"/completions", "{not json"},
          {"/completions", R"({"prompt": 5})"},
          {"/completions", R"({"prompt": "1+1=", "n": 2})"},
          {"/completions", R"({"prompt": "1+1=", "stream": "yes"})"},
          {"/chat/completions", R"({"messages": []})"},
          {"/chat/completions", R"({"messages": [{"role": "user", "content": 3}]})"},
          {"/chat/completions", R"({"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function"}]})"},
          {"/chat/completions", R"({"messages": [{"role": "user", "content": "a"}], "tool_choice": 3,
            "tools": [{"type": "function", "function": {"name": "add"}}]})"},
          {"/completions", R"({"prompt": "1+1=", "max_tokens": 3, "temperature": 0})"},
          {"/completions", R"({"prompt": "2+2="})"},
          {"/completions", R"({"prompt": "1+1="})"},
      };
      for (const auto& [path, body] : calls) {
        http::ClientRequest cr;
        cr.method = http::Verb::post;
        cr.url = base + path;
        cr.body = body;
        cr.headers["Authorization"] = std::string("Bearer ") + kToken;
        auto a = co_await client->request(std::move(cr));
        if (!a) {
          seen.emplace_back(-1, a.error().what());
          continue;
        }
        auto j = json::parse(a->body, nullptr, false);
        std::string param;
        if (j.is_object() && j.contains("error") && j["error"].value("param", json()).is_string())
          param = j["error"]["param"];
        seen.emplace_back(a->status, param);
      }
      co_return http::Response::json(200, {{"reward", 0.25}});
    });
  }
};

TEST_F(GatewayTest, BadCallsAreClearCountedErrorsAndTheRunGoesOn) {
  http::Client client(io_);
  ProbeAgent agent(io_, client);
  auto port = agent.server.start();
  ASSERT_TRUE(port);
  start_gateway(fmt::format("http://127.0.0.1:{}/", *port));
  metrics::Registry registry;
  gateway_->count_into(&registry);
  auto r = run_group(1);
  ASSERT_TRUE(r) << r.error().what();
  const std::vector<std::pair<int, std::string>> expected = {
      {400, "body"},  {400, "prompt"},      {400, "n"}, {400, "stream"}, {400, "messages"},  {400, "messages[0]"},
      {400, "tools"}, {400, "tool_choice"}, {200, ""},  {409, "prompt"}, {409, "trajectory"}};
  EXPECT_EQ(agent.seen, expected);
  const auto st = gateway_->stats();
  EXPECT_EQ(st.malformed, 8U);
  EXPECT_EQ(st.calls, 1U);
  EXPECT_EQ(st.rewrites, 1U);
  EXPECT_EQ(st.closed_trajectory, 1U);
  EXPECT_EQ(registry.counter("gateway/malformed").value(), 8.0);  // the same counts on /metrics
  EXPECT_EQ(registry.counter("gateway/calls").value(), 1.0);
  EXPECT_EQ(registry.counter("gateway/rewrites").value(), 1.0);
  ASSERT_EQ(r->completions.size(), 1U);
  const auto& s = r->completions[0];
  EXPECT_EQ(s.env_reward, 0.25);
  EXPECT_EQ(std::count(s.loss_mask.begin(), s.loss_mask.end(), 0), 0);  // one call: all the model's
  EXPECT_EQ(s.turn_versions.size(), 1U);

  // After the run: the trajectory is closed, an unknown one is not found, a call without the token
  // or naming no trajectory is refused; all while the gateway goes on serving.
  auto call = [&](std::string path, std::map<std::string, std::string> headers) {
    http::ClientRequest cr;
    cr.method = http::Verb::post;
    cr.url = gateway_->url() + path;
    cr.body = R"({"prompt": "1+1="})";
    cr.headers = std::move(headers);
    std::optional<Result<http::Response>> out;
    asio::co_spawn(
        io_, [&]() -> Awaitable<void> { out = co_await client.request(std::move(cr)); }, asio::detached);
    while (!out) io_.run_one();
    return *out ? (**out).status : -1;
  };
  const std::map<std::string, std::string> auth{{"Authorization", std::string("Bearer ") + kToken}};
  EXPECT_EQ(call("/t/7-0-0/v1/completions", auth), 409);
  EXPECT_EQ(call("/t/nope/v1/completions", auth), 404);
  auto by_header = auth;
  by_header["X-Arlo-Trajectory"] = "nope";
  EXPECT_EQ(call("/v1/completions", by_header), 404);
  EXPECT_EQ(call("/v1/completions", auth), 400);
  EXPECT_EQ(call("/t/7-0-0/v1/other", auth), 404);
  EXPECT_EQ(call("/t/7-0-0/v1/completions", {}), 401);
  EXPECT_EQ(gateway_->stats().unknown_trajectory, 3U);
  agent.server.close();
}

// An agent whose first call meets a paused worker (keep mode: the worker holds the call, answering
// nothing): past gateway.call_timeout_s the gateway answers it 504 with an OpenAI error naming the
// trajectory, and counts it. The agent resumes the worker and calls again (a call that also runs past
// the timeout on a loaded machine is answered 504 the same way, and it tries again); the trajectory
// records the call that was answered and closes with the agent's reward.
TEST_F(GatewayTest, ACallPastItsTimeoutIsA504AndTheTrajectoryGoesOn) {
  http::Client client(io_);
  http::Server agent(io_, http::ServerOptions{});
  const std::string worker = worker_->url();
  std::vector<std::pair<int, json>> seen;  // each call's status and body
  agent.route(http::Verb::post, "/", [&](http::Request req) -> Awaitable<http::Response> {
    const std::string base = json::parse(req.body)["base_url"];
    auto paused = co_await client.post_json(worker + "/pause?mode=keep", json::object());
    EXPECT_TRUE(paused && paused->status == 200);
    for (int i = 0; i < 10 && (seen.empty() || seen.back().first != 200); ++i) {
      if (i == 1) (void)co_await client.post_json(worker + "/resume", json::object());
      http::ClientRequest cr;
      cr.method = http::Verb::post;
      cr.url = base + "/completions";
      cr.body = R"({"prompt": "1+1=", "max_tokens": 3})";
      cr.headers["Authorization"] = std::string("Bearer ") + kToken;
      auto a = co_await client.request(std::move(cr));
      seen.emplace_back(a ? a->status : -1, a ? json::parse(a->body, nullptr, false) : json());
    }
    co_return http::Response::json(200, {{"reward", 0.5}});
  });
  auto port = agent.start();
  ASSERT_TRUE(port);
  start_gateway(fmt::format("http://127.0.0.1:{}/", *port), std::chrono::milliseconds(1000));
  metrics::Registry registry;
  gateway_->count_into(&registry);
  auto r = run_group(1);
  agent.close();
  ASSERT_TRUE(r) << r.error().what();
  ASSERT_GE(seen.size(), 2U);
  EXPECT_EQ(seen.back().first, 200);
  const auto timeouts = static_cast<std::size_t>(
      std::count_if(seen.begin(), seen.end(), [](const std::pair<int, json>& s) { return s.first == 504; }));
  EXPECT_EQ(timeouts, seen.size() - 1);  // every call but the answered one
  const json& first = seen.front().second;
  ASSERT_TRUE(first.contains("error")) << first.dump();
  EXPECT_EQ(first["error"]["type"], "timeout_error");
  EXPECT_EQ(first["error"]["param"], "trajectory");
  EXPECT_EQ(first["error"]["code"], 504);
  const std::string message = first["error"]["message"];
  EXPECT_NE(message.find("trajectory 7-0-"), std::string::npos) << message;
  EXPECT_NE(message.find("gateway.call_timeout_s"), std::string::npos) << message;
  const auto st = gateway_->stats();
  EXPECT_EQ(st.call_timeouts, timeouts);
  EXPECT_EQ(st.call_failures, 0U);
  EXPECT_EQ(st.calls, 1U);
  EXPECT_EQ(registry.counter("gateway/call_timeouts").value(), static_cast<double>(timeouts));
  ASSERT_EQ(r->completions.size(), 1U);
  EXPECT_EQ(r->completions[0].env_reward, 0.5);
  EXPECT_EQ(r->completions[0].turn_versions.size(), 1U);
}

// The decorator hands agent tasks to the runner and everything else to the port it wraps.
struct CountingRunner final : adapters::AgentRunner {
  int runs = 0;
  bool handles(const Task& task) const override { return task.env == "agent"; }
  Awaitable<Result<orch::GenerateResult>> run(orch::GenerateRequest) override {
    ++runs;
    co_return orch::GenerateResult{};
  }
};

TEST_F(GatewayTest, AgentInferenceRoutesOnlyAgentTasks) {
  CountingRunner runner;
  struct Inner final : orch::InferencePort {
    int generated = 0;
    Awaitable<Result<orch::GenerateResult>> generate(orch::GenerateRequest) override {
      ++generated;
      co_return orch::GenerateResult{};
    }
    std::vector<std::string> workers() const override { return {"w"}; }
    Awaitable<Status> pause(std::string, PauseMode, orch::TimePoint) override { co_return ok(); }
    Awaitable<Status> update_weights(std::string, orch::WeightRound, orch::TimePoint) override { co_return ok(); }
    Awaitable<Status> resume(std::string, orch::TimePoint) override { co_return ok(); }
    Awaitable<Result<orch::WorkerWeights>> weights(std::string, orch::TimePoint) override {
      co_return orch::WorkerWeights{};
    }
  } inner;
  adapters::AgentInference port(inner, runner);
  for (const std::string env : {"agent", "arithmetic", "agent"}) {
    orch::GenerateRequest r;
    Task t;
    t.env = env;
    r.task = std::make_shared<const Task>(t);
    bool done = false;
    asio::co_spawn(
        io_,
        [&]() -> Awaitable<void> {
          (void)co_await port.generate(std::move(r));
          done = true;
        },
        asio::detached);
    while (!done) io_.run_one();
  }
  EXPECT_EQ(runner.runs, 2);
  EXPECT_EQ(inner.generated, 1);
  EXPECT_EQ(port.workers(), std::vector<std::string>{"w"});
}

}  // namespace
}  // namespace arlo::session
