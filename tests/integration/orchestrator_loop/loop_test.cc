// The orchestrator with real parts on every port: HTTP completion servers (InferenceServerFake
// with arlo's admin plane, answering every other sample correctly), rollout's InferencePool, arithmetic tasks,
// exact_match scoring on the scorer's threads, and a trainer thread on the bridge's dir transport
// that acknowledges each batch and publishes its version.
#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "common/http.h"
#include "common/metrics.h"
#include "session/adapters/bridge_trainer.h"
#include "session/adapters/rollout_adapters.h"
#include "orchestrator/orchestrator.h"
#include "session/reporter.h"
#include "rollout/reward.h"
#include "testing/inference_server_fake.h"
#include "tests/integration/orchestrator_loop/orchestrator_run.h"

namespace arlo::orch {
namespace {

namespace asio = boost::asio;

// A completion server (InferenceServerFake, arlo's admin plane) whose sample j of a request answers
// the sum of "a+b=" when j is even, "0" otherwise; tokens carry the version it committed last.
std::unique_ptr<testing::InferenceServerFake> completion_server(asio::io_context& io) {
  auto s = std::make_unique<testing::InferenceServerFake>(
      io, testing::InferenceServerOptions{.dialect = testing::Dialect::kArlo});
  s->reply = [](const nlohmann::json& body, int j) {
    int a = 0, b = 0;
    std::sscanf(body.value("prompt", std::string()).c_str(), "%d+%d=", &a, &b);
    return j % 2 == 0 ? std::to_string(a + b) : std::string("0");
  };
  return s;
}

// The admin requests `s` was asked, in order: "/pause keep", "/weights/prepare v3", "/resume", ...
std::vector<std::string> admin_log(const testing::InferenceServerFake& s) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < s.requests.size(); ++i) {
    if (s.requests[i].rfind("POST /", 0) != 0 || s.requests[i] == "POST /v1/completions") continue;
    std::string entry = s.requests[i].substr(5);
    const auto& body = s.request_bodies[i];
    if (body.is_object() && body.contains("version")) entry += " v" + body["version"].dump();
    if (const auto mode = s.targets[i].find("mode="); mode != std::string::npos)
      entry += " " + s.targets[i].substr(mode + 5);
    out.push_back(entry);
  }
  return out;
}

TEST(OrchestratorLoop, RealAdaptersEndToEnd) {
  const auto run_dir = std::filesystem::temp_directory_path() / fmt::format("arlo_orch_loop_{}", ::getpid());
  std::filesystem::remove_all(run_dir);
  std::filesystem::create_directories(run_dir);
  constexpr int kSteps = 3;

  asio::io_context io;
  auto s0 = completion_server(io), s1 = completion_server(io);

  rollout::InferencePool pool(io);
  const std::string u0 = s0->url(), u1 = s1->url();
  pool.add_worker(u0);
  pool.add_worker(u1);
  pool.start();
  std::vector<std::unique_ptr<rollout::AdminClient>> admins;
  admins.push_back(rollout::make_admin_client(rollout::AdminDialect::kArlo, pool.client(), u0));
  admins.push_back(rollout::make_admin_client(rollout::AdminDialect::kArlo, pool.client(), u1));
  session::adapters::RolloutInference inference(pool, std::move(admins), [](const std::string&, const WeightRound&) {
    rollout::WeightUpdate u;
    u.weight_sync = {{"transport", "filesystem"}};
    return u;
  });

  rollout::ArithmeticOptions ao;
  ao.seed = 3;
  ao.size = 200;
  auto source = rollout::make_arithmetic(ao);
  ASSERT_TRUE(source);
  auto stream = std::make_shared<rollout::TaskStream>(*source, rollout::TaskStream::Options{});
  session::adapters::RolloutTasks tasks(stream);
  std::vector<Task> eval_tasks;
  for (std::size_t i = 0; i < 4; ++i) eval_tasks.push_back((*source)->at(i));

  auto module = rollout::make_reward_module({{"kind", "exact_match"}});
  ASSERT_TRUE(module) << module.error().what();
  rollout::RewardScorer reward(io, std::shared_ptr<rollout::RewardModule>(std::move(*module)), {});
  session::adapters::RolloutScorer scorer(reward, rollout::AdvantageOptions{});

  bridge::ServerOptions bo;
  bo.transport = "dir";
  bo.run_dir = run_dir;
  auto bridge_server = bridge::BridgeServer::create(io, bo);
  ASSERT_TRUE(bridge_server) << bridge_server.error().what();
  ThreadPool threads(1);
  bridge::PackOptions pack;
  pack.seq_len = 64;
  session::adapters::BridgeTrainer trainer(io, **bridge_server, threads, pack);

  RealClock clock(io.get_executor());
  auto opt = test::small_run_options(kSteps);
  opt.eval_at_end = true;
  opt.eval_at_start = true;
  opt.eval_samples = 2;
  opt.eval_pass_k = {1, 2};
  opt.log_interval_s = 0.2;
  opt.console = true;
  opt.run_dir = run_dir.string();
  opt.ckpt_interval = 1;
  opt.status_port = 0;
  metrics::Registry registry;
  session::Reporter reporter(io, clock, opt, &registry);  // metrics.jsonl, summary.json, /metrics
  Orchestrator orch(io, Ports{&inference, &tasks, &scorer, &trainer, &clock, nullptr, eval_tasks}, opt, &reporter);
  ASSERT_TRUE(reporter.start(orch));
  ASSERT_TRUE(orch.start());
  ASSERT_TRUE((*bridge_server)->start());

  // The trainer: a separate thread on the bridge's blocking client, as arlo-trainer would be.
  std::vector<std::int64_t> trained;
  std::vector<std::int64_t> batch_samples;
  std::thread trainer_thread([&] {
    bridge::ClientOptions co;
    co.transport = "dir";
    co.run_dir = run_dir;
    auto client = bridge::connect(co);
    if (!client) return;
    for (int i = 0; i < kSteps; ++i) {
      auto batch = (*client)->next_batch(std::chrono::seconds(60));
      if (!batch) break;
      const auto step = batch->step();
      trained.push_back(step);
      batch_samples.push_back(batch->meta_int("step_samples").value_or(-1));
      if (!(*client)->ack(step)) break;
      if (!(*client)->published(step, {{"metrics", {{"loss", 0.25}, {"lr", 0.001}}}})) break;
    }
    (*client)->close();
  });

  const bool timed_out = test::run_to_the_end(io, orch, std::chrono::seconds(90), [&] {
    pool.stop();
    (*bridge_server)->stop();
    s0->close();
    s1->close();
  });
  trainer_thread.join();

  ASSERT_FALSE(timed_out);
  const auto& summary = orch.summary();
  EXPECT_TRUE(summary.ok) << summary.error;
  EXPECT_EQ(summary.steps, kSteps);
  EXPECT_EQ(trained, (std::vector<std::int64_t>{1, 2, 3}));
  for (auto n : batch_samples) EXPECT_EQ(n, 8);
  auto st = orch.ledger().check();
  EXPECT_TRUE(st) << st.error().what();
  // The final version reached both workers through pause -> prepare -> commit -> resume, and the
  // versions each worker committed only went up (notices that arrive during an update coalesce).
  for (const auto* s : {s0.get(), s1.get()}) {
    const auto log = admin_log(*s);
    auto commit = std::find(log.begin(), log.end(), "/weights/commit v" + std::to_string(kSteps));
    ASSERT_NE(commit, log.end());
    ASSERT_GE(commit - log.begin(), 2);
    EXPECT_EQ(*(commit - 1), "/weights/prepare v" + std::to_string(kSteps));
    EXPECT_EQ(*(commit - 2), "/pause keep");
    ASSERT_NE(commit + 1, log.end());
    EXPECT_EQ(*(commit + 1), "/resume");
    std::int64_t last = 0;
    for (const auto& e : log)
      if (e.rfind("/weights/commit v", 0) == 0) {
        const auto v = std::stoll(e.substr(17));
        EXPECT_GT(v, last);
        last = v;
      }
  }
  // Half the samples are right: reward mean 0.5 on every step; eval pass@2 = 1, pass@1 = 0.5.
  for (const auto& r : orch.step_reports()) EXPECT_DOUBLE_EQ(r.reward_mean, 0.5);
  ASSERT_TRUE(summary.eval_last.has_value());
  EXPECT_EQ(summary.eval_last->step, kSteps);
  const auto& e = summary.eval_last->envs.begin()->second;
  EXPECT_DOUBLE_EQ(e.pass_at.at(1), 0.5);
  EXPECT_DOUBLE_EQ(e.pass_at.at(2), 1.0);
  EXPECT_NE(registry.prometheus().find("arlo_train_reward_mean"), std::string::npos);
  int step_lines = 0, loss_lines = 0;
  std::ifstream metrics(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("kind", "") != "step") continue;
    ++step_lines;
    // The trainer's metrics, announced under "metrics" with each version, reach the step records.
    if (j.contains("trainer/loss")) {
      ++loss_lines;
      EXPECT_DOUBLE_EQ(j.at("trainer/loss").get<double>(), 0.25) << line;
      EXPECT_DOUBLE_EQ(j.at("trainer/lr").get<double>(), 0.001) << line;
    }
  }
  EXPECT_EQ(step_lines, kSteps);
  EXPECT_GE(loss_lines, 1) << "no step record carries the trainer's loss";
  EXPECT_NE(registry.prometheus().find("arlo_trainer_loss 0.25"), std::string::npos) << registry.prometheus();
  EXPECT_TRUE(std::filesystem::exists(run_dir / "summary.json"));
  EXPECT_TRUE(std::filesystem::exists(run_dir / "orchestrator" / "checkpoint.json"));
  std::filesystem::remove_all(run_dir);
}

}  // namespace
}  // namespace arlo::orch
