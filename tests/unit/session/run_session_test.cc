// RunSession driven in-process: a shortened quickstart (configs/quickstart.yaml) whose children are
// the real arlo-worker and arlo-trainer, observed through SessionOptions::observer. The test asserts
// on what the loop reported (each step, the weight syncs, the end) and that the run's reporter wrote
// the same steps to metrics.jsonl and the end to summary.json.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "orchestrator/observer.h"
#include "session/run_session.h"

namespace arlo::session {
namespace {

namespace fs = std::filesystem;

struct Recorder : orch::RunObserver {
  std::vector<orch::StepObservation> steps;
  std::vector<orch::SyncObservation> syncs;
  std::vector<orch::EndObservation> ends;
  void on_step(const orch::StepObservation& s) override { steps.push_back(s); }
  void on_sync(const orch::SyncObservation& s) override { syncs.push_back(s); }
  void on_end(const orch::EndObservation& e) override { ends.push_back(e); }
};

// The children are found on PATH (RunChildren execs arlo-worker / arlo-trainer by name when they are
// not next to the running program).
void put_programs_on_path() {
  std::string path =
      fs::path(ARLO_WORKER_BINARY).parent_path().string() + ":" + fs::path(ARLO_TRAINER_BINARY).parent_path().string();
  if (const char* old = std::getenv("PATH")) path += std::string(":") + old;
  ::setenv("PATH", path.c_str(), 1);
}

TEST(RunSession, AShortRunReportsEveryStepItsSyncsAndTheEndToTheObserver) {
  const char* src = std::getenv("ARLO_SOURCE_DIR");
  ASSERT_NE(src, nullptr) << "ARLO_SOURCE_DIR is not set";
  put_programs_on_path();
  const auto dir = fs::temp_directory_path() / ("arlo_run_session_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  config::LoadOptions lo;
  lo.overrides = {"run.dir=" + dir.string(), "run.max_steps=4",    "orchestrator.sft_warmup_steps=2", "eval.interval=0",
                  "status.port=0",           "log.progress=false", "orchestrator.batch_size=16"};
  auto cfg = config::load_file(std::string(src) + "/configs/quickstart.yaml", lo);
  ASSERT_TRUE(cfg) << cfg.error().what();
  Recorder seen;
  SessionOptions so;
  so.observer = &seen;
  auto session = RunSession::create(*cfg, so);
  ASSERT_TRUE(session) << session.error().what();
  const auto outcome = (*session)->run();
  ASSERT_EQ(outcome.end, RunOutcome::End::kFinished) << outcome.error;
  EXPECT_EQ(outcome.steps, 4);

  // Every step, in order: the warm-up's supervised, then RL.
  ASSERT_EQ(seen.steps.size(), 4u);
  for (std::size_t i = 0; i < seen.steps.size(); ++i) {
    EXPECT_EQ(seen.steps[i].report.step, static_cast<std::int64_t>(i + 1));
    EXPECT_EQ(seen.steps[i].report.supervised, i < 2);
    EXPECT_GT(seen.steps[i].report.samples, 0);
  }
  // The final version reached both workers.
  ASSERT_FALSE(seen.syncs.empty());
  EXPECT_EQ(seen.syncs.back().report.version, 4);
  EXPECT_TRUE(seen.syncs.back().report.applied);
  EXPECT_EQ(seen.syncs.back().report.workers.size(), 2u);
  // The end, once: ok, the ledger adding up.
  ASSERT_EQ(seen.ends.size(), 1u);
  const auto& end = seen.ends[0];
  EXPECT_TRUE(end.summary.ok) << end.summary.error;
  EXPECT_EQ(end.summary.steps, 4);
  EXPECT_EQ(end.completed + end.failed + end.cancelled, end.dispatched);

  // The run's own reporter saw the same: one step record per step, and the summary.
  std::ifstream metrics(dir / "metrics.jsonl");
  std::vector<std::int64_t> steps;
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("kind") == "step") steps.push_back(j.at("step").get<std::int64_t>());
  }
  EXPECT_EQ(steps, (std::vector<std::int64_t>{1, 2, 3, 4}));
  std::ifstream summary_file(dir / "summary.json");
  ASSERT_TRUE(summary_file.good());
  const auto summary = nlohmann::json::parse(summary_file);
  EXPECT_TRUE(summary.at("ok").get<bool>()) << summary.dump();
  EXPECT_EQ(summary.at("steps").get<std::int64_t>(), 4);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace arlo::session
