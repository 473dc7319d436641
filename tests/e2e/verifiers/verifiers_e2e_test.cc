// `arlo run configs/quickstart.yaml`, shortened with --set, whose tasks a verifiers environment runs
// (env.kind verifiers; docs/environments.md, "verifiers environments"): arlo starts verifiers'
// environment server from the project's Python, asks it for one episode per trajectory, and the
// episode's chat program calls the model through the policy gateway, which records every call. The
// test environments (tests/verifiers_envs) are modules on env.verifiers_python_path: no download.
// Checked from the outside: every step trains, the rewards are the environment's, the server was a
// supervised child, and a server killed mid-run is restarted and costs only its episodes in flight.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "testing/process.h"
#include "tests/e2e/run_checks.h"

namespace {

namespace fs = std::filesystem;
using arlo::e2e::read_text;
using nlohmann::json;

struct VerifiersRun {
  fs::path dir, run_dir;
  std::vector<std::string> args;
};

// A run of `env` over 8 prompts, `steps` steps of 8 trajectories (groups of 2).
VerifiersRun make_run(const std::string& name, const std::string& env, int steps) {
  const std::string src = std::getenv("ARLO_SOURCE_DIR");
  VerifiersRun r;
  r.dir = fs::temp_directory_path() / ("arlo_verifiers_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(r.dir);
  fs::create_directories(r.dir);
  {
    std::ofstream tasks(r.dir / "tasks.jsonl");
    for (int i = 0; i < 8; ++i) tasks << json{{"prompt", "say something about " + std::to_string(i)}}.dump() << "\n";
  }
  r.run_dir = r.dir / "run";
  std::vector<std::string> sets = {"env.kind=verifiers",
                                   "env.path=" + (r.dir / "tasks.jsonl").string(),
                                   "env.verifiers_env=" + env,
                                   "env.verifiers_python_path=" + src + "/tests/verifiers_envs",
                                   "reward.modules=[{kind: env}]",
                                   "orchestrator.sft_warmup_steps=0",
                                   "orchestrator.batch_size=8",
                                   "orchestrator.group_size=2",
                                   "orchestrator.max_inflight=8",
                                   "orchestrator.filter_equal_reward_groups=false",
                                   "eval.size=4",
                                   "eval.interval=0",
                                   "log.progress=false",
                                   "log.rollouts_every=1",
                                   "status.port=0",
                                   "run.dir=" + r.run_dir.string(),
                                   "run.max_steps=" + std::to_string(steps)};
  r.args = arlo::e2e::arlo_run_argv(ARLO_BINARY, src + "/configs/quickstart.yaml", sets);
  return r;
}

// make_run's run with env.sources: the verifiers source "echo" (arlo_vf_echo over make_run's
// tasks) and arithmetic (exact_match) at ratio 1:1; then `sets`.
VerifiersRun make_mixed_run(const std::string& name, int steps, const std::vector<std::string>& sets) {
  auto r = make_run(name, "arlo_vf_echo", steps);
  const std::string envs = std::string(std::getenv("ARLO_SOURCE_DIR")) + "/tests/verifiers_envs";
  r.args.insert(r.args.end(),
                {"--set", "env.sources=[{kind: verifiers, name: echo, path: " + (r.dir / "tasks.jsonl").string() +
                              ", options: {verifiers_env: arlo_vf_echo, verifiers_python_path: " + envs +
                              "}}, {kind: arithmetic, ratio: 1, reward: [{kind: exact_match}]}]"});
  for (const auto& set : sets) r.args.insert(r.args.end(), {"--set", set});
  return r;
}

std::vector<json> events_of(const fs::path& run_dir, const std::string& name) {
  std::vector<json> out;
  for (const auto& e : arlo::e2e::read_jsonl(run_dir / "supervision.jsonl"))
    if (e.value("name", "") == name) out.push_back(e);
  return out;
}

// Runs `r` to its end and checks it: exit 0, every step trained, every logged sample's reward one of
// `rewards` (the environment's) on turns the model wrote. Returns the run's output ("" on failure).
std::string run_and_check(const VerifiersRun& r, int steps, const std::vector<double>& rewards) {
  const auto run = arlo::e2e::run_to_end(r.args, r.dir / "arlo.log");
  const std::string tail = arlo::e2e::tail(run.output);
  EXPECT_TRUE(run.exited_with(0)) << "arlo run failed (status " << run.status << "):\n" << tail;
  const std::string summary = read_text(r.run_dir / "summary.json");
  EXPECT_FALSE(summary.empty()) << tail;
  if (summary.empty()) return "";
  arlo::e2e::expect_every_step_trained(json::parse(summary), r.run_dir, steps, 2);
  std::size_t samples = 0;
  for (const auto& group : arlo::e2e::read_jsonl(r.run_dir / "rollouts.jsonl"))
    for (const auto& s : group.value("samples", json::array())) {
      ++samples;
      const auto reward = s.value("env_reward", -1.0);
      EXPECT_NE(std::find(rewards.begin(), rewards.end(), reward), rewards.end()) << s.dump();
      EXPECT_TRUE(s.contains("turns") && !s["turns"].empty() && s["turns"].front().value("role", "") == "assistant")
          << s.dump();
    }
  EXPECT_GT(samples, 0U);
  return run.output;
}

// The single-turn environment: its reward (1 when the answer has a letter, else 0) on the gateway's turns.
TEST(VerifiersE2E, ASingleTurnEnvironmentRunsEveryTrajectoryThroughTheGateway) {
  ASSERT_NE(std::getenv("ARLO_SOURCE_DIR"), nullptr);
  auto r = make_run("echo", "arlo_vf_echo", 2);
  const std::string output = run_and_check(r, 2, {0.0, 1.0});
  EXPECT_NE(output.find("verifiers environment arlo_vf_echo at tcp://127.0.0.1:"), std::string::npos);
  const auto events = events_of(r.run_dir, "verifiers-env");
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.front().value("event", ""), "started");
  fs::remove_all(r.dir);
}

// The multi-turn tool environment: verifiers serves its `add` tool as an MCP server (python -m, from
// env.verifiers_python_path) and the chat program offers it to the model each turn. The untrained
// model does not call it: every episode is scored 0.5 (1 with a call; unscored would be 0).
TEST(VerifiersE2E, AToolEnvironmentRunsWithItsToolServer) {
  ASSERT_NE(std::getenv("ARLO_SOURCE_DIR"), nullptr);
  auto r = make_run("tools", "arlo_vf_tools", 2);
  run_and_check(r, 2, {0.5, 1.0});
  fs::remove_all(r.dir);
}

// Runs `r` and SIGKILLs the server of child `child` once a step trained (it is serving episodes
// then); checks that the run ended 0, trained every step, and that the server was restarted
// (supervision.jsonl: exited by SIGKILL, restarting, started again) with the run's warning naming it.
// `summary`: the run's summary.json.
void kill_server_mid_run(const VerifiersRun& r, const std::string& child, int steps, json& summary) {
  const fs::path log = r.dir / "arlo.log";
  const pid_t arlo = arlo::e2e::spawn_logged(r.args, log);
  ASSERT_TRUE(arlo::e2e::wait_for_text(log, "step 1/", arlo, std::chrono::seconds(180))) << read_text(log);
  pid_t server = 0;
  for (const auto& e : events_of(r.run_dir, child))
    if (e.value("event", "") == "started") server = e.value("pid", 0);
  ASSERT_GT(server, 0) << read_text(r.run_dir / "supervision.jsonl");
  ASSERT_EQ(::kill(server, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(arlo, &status, 0), arlo);
  const std::string output = read_text(log);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << arlo::e2e::tail(output);
  bool killed = false, restarting = false, restarted = false;
  for (const auto& e : events_of(r.run_dir, child)) {
    killed |= e.value("event", "") == "exited" && e.value("signal", 0) == SIGKILL;
    restarting |= e.value("event", "") == "restarting";
    restarted |= e.value("event", "") == "started" && e.value("restarted", false);
  }
  EXPECT_TRUE(killed && restarting && restarted) << read_text(r.run_dir / "supervision.jsonl");
  EXPECT_NE(output.find("the verifiers environment server died (" + child + ")"), std::string::npos)
      << arlo::e2e::tail(output);
  const std::string text = read_text(r.run_dir / "summary.json");
  ASSERT_FALSE(text.empty());
  summary = json::parse(text);
  arlo::e2e::expect_every_step_trained(summary, r.run_dir, steps, 2);
}

TEST(VerifiersE2E, AKilledServerIsRestartedAndCostsOnlyItsEpisodesInFlight) {
  ASSERT_NE(std::getenv("ARLO_SOURCE_DIR"), nullptr);
  const int steps = 4;
  auto r = make_run("kill", "arlo_vf_echo", steps);
  json s;
  kill_server_mid_run(r, "verifiers-env", steps, s);
  if (::testing::Test::HasFatalFailure()) return;
  arlo::e2e::print_fault_cost("SIGKILL of the verifiers environment server", r.run_dir, s);
  fs::remove_all(r.dir);
}

// env.sources mixes a verifiers environment (source "echo") with the built-in arithmetic tasks at
// ratio 1:1, and eval.env_kind verifiers runs eval.env_path's tasks through the same environment
// (the env.verifiers_* keys are the source's options: one server, child verifiers-env-echo, serves
// both). One group in flight at a time (max_inflight 2, groups of 2): the groups are scored in the
// order the mix served them, so rollouts.jsonl holds each source within one group of its share.
TEST(VerifiersE2E, AVerifiersSourceBesideABuiltInOneAndEvalThroughIt) {
  ASSERT_NE(std::getenv("ARLO_SOURCE_DIR"), nullptr);
  const int steps = 3;
  auto r = make_mixed_run("sources", steps,
                          {"orchestrator.max_inflight=2", "eval.env_kind=verifiers", "eval.interval=1", "eval.size=4"});
  r.args.insert(r.args.end(), {"--set", "eval.env_path=" + (r.dir / "tasks.jsonl").string()});
  const auto run = arlo::e2e::run_to_end(r.args, r.dir / "arlo.log");
  const std::string tail = arlo::e2e::tail(run.output);
  ASSERT_TRUE(run.exited_with(0)) << "arlo run failed (status " << run.status << "):\n" << tail;
  EXPECT_NE(run.output.find("verifiers environment arlo_vf_echo at tcp://127.0.0.1:"), std::string::npos) << tail;
  const auto events = events_of(r.run_dir, "verifiers-env-echo");
  ASSERT_FALSE(events.empty()) << read_text(r.run_dir / "supervision.jsonl");
  EXPECT_EQ(events.front().value("event", ""), "started");
  EXPECT_TRUE(events_of(r.run_dir, "verifiers-env").empty());  // eval shares the source's server
  arlo::e2e::expect_every_step_trained(json::parse(read_text(r.run_dir / "summary.json")), r.run_dir, steps, 2);
  std::map<std::string, int> groups;
  for (const auto& group : arlo::e2e::read_jsonl(r.run_dir / "rollouts.jsonl")) {
    const std::string env = group.value("env", "");
    ++groups[env];
    for (const auto& s : group.value("samples", json::array()))
      if (env == "echo") {  // the environment's reward (1 with a letter, else 0), on the gateway's turns
        const auto reward = s.value("env_reward", -1.0);
        EXPECT_TRUE(reward == 0.0 || reward == 1.0) << s.dump();
        EXPECT_TRUE(s.contains("turns") && !s["turns"].empty()) << s.dump();
      } else {
        EXPECT_FALSE(s.contains("env_reward") && !s["env_reward"].is_null()) << s.dump();
      }
  }
  ASSERT_EQ(groups.size(), 2U) << json(groups).dump();
  EXPECT_GE(groups["echo"] + groups["arithmetic"], steps * 4);
  EXPECT_LE(std::abs(groups["echo"] - groups["arithmetic"]), 1) << json(groups).dump();
  std::printf("[ sources ] groups scored: echo %d, arithmetic %d\n", groups["echo"], groups["arithmetic"]);
  int evals = 0;  // eval/verifiers/* (the eval tasks' env), as for every other kind
  for (const auto& rec : arlo::e2e::read_jsonl(r.run_dir / "metrics.jsonl"))
    for (const auto& [key, value] : rec.items())
      if (key.starts_with("eval/verifiers/")) ++evals;
  EXPECT_GT(evals, 0) << read_text(r.run_dir / "metrics.jsonl").substr(0, 2000);
  fs::remove_all(r.dir);
}

// A verifiers source's server killed mid-run (its own child, verifiers-env-echo) is restarted and
// costs only its own episodes in flight: the run trains every step, the arithmetic source goes on,
// and eval.env_kind same evaluates each source (the verifiers one through its server).
TEST(VerifiersE2E, AKilledSourceServerIsRestartedAndTheOtherSourceGoesOn) {
  ASSERT_NE(std::getenv("ARLO_SOURCE_DIR"), nullptr);
  const int steps = 4;
  auto r = make_mixed_run("source_kill", steps, {"eval.env_kind=same", "eval.interval=2", "eval.size=2"});
  json s;
  kill_server_mid_run(r, "verifiers-env-echo", steps, s);
  if (::testing::Test::HasFatalFailure()) return;
  std::map<std::string, int> groups;
  for (const auto& group : arlo::e2e::read_jsonl(r.run_dir / "rollouts.jsonl")) ++groups[group.value("env", "")];
  EXPECT_GT(groups["echo"], 0) << json(groups).dump();
  EXPECT_GT(groups["arithmetic"], 0) << json(groups).dump();
  bool eval_echo = false, eval_arithmetic = false;  // eval per source, as for any kind
  for (const auto& rec : arlo::e2e::read_jsonl(r.run_dir / "metrics.jsonl"))
    for (const auto& [key, value] : rec.items()) {
      eval_echo |= key.starts_with("eval/echo/");
      eval_arithmetic |= key.starts_with("eval/arithmetic/");
    }
  EXPECT_TRUE(eval_echo && eval_arithmetic) << read_text(r.run_dir / "metrics.jsonl").substr(0, 2000);
  arlo::e2e::print_fault_cost("SIGKILL of a verifiers source's server", r.run_dir, s);
  fs::remove_all(r.dir);
}

}  // namespace
