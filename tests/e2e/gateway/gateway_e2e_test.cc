// `arlo run configs/quickstart.yaml`, shortened with --set, whose every task is run by the example
// agent program (examples/agent/agent.py) through the policy gateway: the agent asks the model
// through the gateway, tells it when it is wrong, and answers the trajectory's reward, which the
// `env` reward module hands to the trainer. Checked from the outside: the run trains every step,
// the ledger adds up, the gateway was served and rollouts.jsonl holds the agent's trajectories.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/e2e/run_checks.h"
#include "testing/process.h"

namespace {

namespace fs = std::filesystem;
using arlo::e2e::read_text;

TEST(GatewayE2E, AgentProgramRunsEveryTrajectoryThroughTheGateway) {
  const char* src = std::getenv("ARLO_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  const fs::path dir = fs::temp_directory_path() / ("arlo_gateway_e2e_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path agent_log = dir / "agent.log";
  const pid_t agent = arlo::e2e::spawn_logged(
      {ARLO_TEST_PYTHON, std::string(src) + "/examples/agent/agent.py", "--port", "0", "--turns", "2"}, agent_log);
  ASSERT_TRUE(arlo::e2e::wait_for_text(agent_log, "listening on ", agent, std::chrono::seconds(60)))
      << read_text(agent_log);
  const std::string text = read_text(agent_log);
  const auto at = text.find("listening on ") + 13;
  const std::string address = text.substr(at, text.find('\n', at) - at);

  const fs::path run_dir = dir / "run";
  const int steps = 3;
  // The quickstart, short: no warm-up (the agent's reward is what trains), small groups, every
  // group kept, the env reward module, and the agent program.
  std::vector<std::string> sets = {"gateway.agent_url=http://" + address + "/", "reward.modules=[{kind: env}]"};
  for (const char* s : {"orchestrator.sft_warmup_steps=0", "orchestrator.batch_size=16", "orchestrator.group_size=4",
                        "orchestrator.max_inflight=16", "orchestrator.filter_equal_reward_groups=false", "eval.size=8",
                        "log.progress=false", "status.port=0"})
    sets.push_back(s);
  sets.push_back("run.dir=" + run_dir.string());
  sets.push_back("run.max_steps=" + std::to_string(steps));
  const auto args = arlo::e2e::arlo_run_argv(ARLO_BINARY, std::string(src) + "/configs/quickstart.yaml", sets);
  const auto run = arlo::e2e::run_to_end(args, dir / "arlo.log");
  ::kill(agent, SIGTERM);
  ::waitpid(agent, nullptr, 0);
  const std::string tail = arlo::e2e::tail(run.output);
  ASSERT_TRUE(run.exited_with(0)) << "arlo run failed (status " << run.status << "):\n" << tail;
  EXPECT_NE(run.output.find("policy gateway on http://"), std::string::npos) << tail;
  const std::string summary = read_text(run_dir / "summary.json");
  ASSERT_FALSE(summary.empty()) << tail;
  arlo::e2e::expect_every_step_trained(nlohmann::json::parse(summary), run_dir, steps, 2);
  // Every trained trajectory came from the agent: the model's turns are its turns, and the reward
  // is the one the agent answered (0, 0.5 or 1).
  std::size_t samples = 0;
  for (const auto& group : arlo::e2e::read_jsonl(run_dir / "rollouts.jsonl")) {
    for (const auto& s : group.value("samples", nlohmann::json::array())) {
      ++samples;
      const auto reward = s.value("env_reward", -1.0);
      EXPECT_TRUE(reward == 0.0 || reward == 0.5 || reward == 1.0) << s.dump();
      EXPECT_TRUE(s.contains("scores") && s["scores"].contains("env")) << s.dump();
      ASSERT_TRUE(s.contains("turns") && !s["turns"].empty()) << s.dump();
      EXPECT_EQ(s["turns"].front().value("role", ""), "assistant") << s.dump();
    }
  }
  EXPECT_GT(samples, 0U);
  fs::remove_all(dir);
}

}  // namespace
