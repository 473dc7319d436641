// Fault tests for reward plugins under `isolate: process` (the default), through real processes:
// `arlo run configs/quickstart.yaml` shortened with --set, its reward the test plugin
// (tests/unit/rollout/test_reward_plugin.cc) in arlo-reward-host children.
//   - a plugin that segfaults on sample 0 of every task whose id ends in 7: the run finishes all its
//     steps with exit 0, each crash costing at most the groups in flight (ledger: score_failed),
//     the ledger adding up;
//   - a plugin that hangs there: each hang is cut off at reward.timeout_s (1 s) by killing the host,
//     and the run finishes;
//   - a plugin that segfaults on every call: the run stops after 5 restarts in a row, exit 1, with
//     the reason.
#include <gtest/gtest.h>

#include <regex>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/e2e/run_checks.h"
#include "testing/process.h"

namespace {

namespace fs = std::filesystem;
using arlo::e2e::tail;

constexpr int kSteps = 12;
constexpr int kGroupSize = 8;

struct Run {
  int status = -1;
  std::string output;
  nlohmann::json summary;
  double seconds = 0;
};

Run arlo_run(const std::string& name, const std::string& plugin_config, const std::vector<std::string>& sets = {}) {
  Run out;
  const char* src = std::getenv("ARLO_SOURCE_DIR");
  EXPECT_NE(src, nullptr);
  if (src == nullptr) return out;
  const fs::path run_dir =
      fs::temp_directory_path() / ("arlo_reward_isolation_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(run_dir);
  std::vector<std::string> all = {"run.dir=" + run_dir.string(),
                                  "log.progress=false",
                                  "status.port=0",
                                  "run.max_steps=" + std::to_string(kSteps),
                                  "orchestrator.sft_warmup_steps=2",
                                  "orchestrator.batch_size=32",
                                  "orchestrator.group_size=" + std::to_string(kGroupSize),
                                  "orchestrator.max_inflight=32",
                                  "eval.interval=100",
                                  "eval.size=8",
                                  "reward.modules=[{kind: plugin, path: " + std::string(ARLO_TEST_PLUGIN_PATH) +
                                      ", config: " + plugin_config + "}]"};
  all.insert(all.end(), sets.begin(), sets.end());
  const auto t0 = std::chrono::steady_clock::now();
  auto ended =
      arlo::e2e::run_to_end(arlo::e2e::arlo_run_argv(ARLO_BINARY, std::string(src) + "/configs/quickstart.yaml", all),
                            run_dir.string() + ".log");
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.status = ended.status;
  out.output = std::move(ended.output);
  const std::string summary = arlo::e2e::read_text(run_dir / "summary.json");
  if (!summary.empty()) out.summary = nlohmann::json::parse(summary, nullptr, false);
  fs::remove_all(run_dir);
  return out;
}

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (auto p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

// The run finished every step with exit 0 and a ledger that adds up; returns the samples dropped
// as score_failed.
std::uint64_t expect_finished(const Run& r) {
  EXPECT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0) << "status " << r.status << ":\n" << tail(r.output);
  if (!r.summary.is_object()) {
    ADD_FAILURE() << "no summary.json:\n" << tail(r.output);
    return 0;
  }
  EXPECT_TRUE(r.summary.value("ok", false)) << r.summary.dump(2);
  EXPECT_EQ(r.summary.value("steps", 0), kSteps) << r.summary.dump(2);
  const auto& ledger = r.summary.at("ledger");
  arlo::e2e::expect_ledger_adds_up(ledger);
  const auto& d = ledger.at("dispositions");
  return d.contains("score_failed") ? d.at("score_failed").get<std::uint64_t>() : 0;
}

TEST(RewardIsolation, CrashingPluginCostsOnlyTheGroupsInFlightAndTheRunFinishes) {
  const auto r = arlo_run("crash", R"({mode: segv_on_task, task_suffix: "7"})");
  const auto lost = expect_finished(r);
  const int crashes = count(r.output, "reward plugin 'test_plugin' crashed: signal 11 (SIGSEGV");
  std::printf("crash run: %.1f s, %d crashes, %llu samples dropped (score_failed), ledger %s\n", r.seconds, crashes,
              static_cast<unsigned long long>(lost), r.summary.is_object() ? r.summary["ledger"].dump().c_str() : "-");
  EXPECT_GE(crashes, 1) << "the plugin never crashed: the test proves nothing\n" << tail(r.output);
  EXPECT_EQ(lost % kGroupSize, 0u) << "groups are dropped whole";
  // Each crash costs the calls in flight on the host: at most the scorer's two threads' groups.
  EXPECT_LE(lost, static_cast<std::uint64_t>(2 * crashes * kGroupSize));
  EXPECT_EQ(count(r.output, "giving up"), 0) << tail(r.output);
}

TEST(RewardIsolation, HangingPluginIsCutOffAtTheTimeoutAndTheRunFinishes) {
  const auto r = arlo_run("hang", R"({mode: hang_on_task, task_suffix: "7"})", {"reward.timeout_s=1"});
  expect_finished(r);
  const int hangs = count(r.output, "killed: a call ran past the 1000 ms timeout");
  std::printf("hang run: %.1f s, %d hangs cut off\n", r.seconds, hangs);
  EXPECT_GE(hangs, 1) << "the plugin never hung: the test proves nothing\n" << tail(r.output);
}

TEST(RewardIsolation, PluginThatAlwaysCrashesStopsTheRunWithTheReason) {
  const auto r = arlo_run("always", R"({mode: segv_always})");
  std::printf("always-crashing run: %.1f s\n", r.seconds);
  EXPECT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) != 0) << "status " << r.status << ":\n" << tail(r.output);
  // Past the bound the run stops: at the 6th death in a row, or the 7th where two scorer threads'
  // calls were in flight when the 6th came.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      r.output, m, std::regex(R"(its host process died (\d+) times in a row \(the bound is 5 restarts\); giving up)")))
      << tail(r.output);
  EXPECT_GE(std::stoi(m[1]), 6);
  EXPECT_LE(std::stoi(m[1]), 7);
  EXPECT_NE(r.output.find("crashed: signal 11 (SIGSEGV"), std::string::npos) << tail(r.output);
}

}  // namespace
