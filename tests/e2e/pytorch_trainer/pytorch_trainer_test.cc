// `arlo run configs/pytorch-trainer.yaml --set weight_sync.transport=T`, shortened with --set, from
// the source tree as a user runs it: arlo starts two arlo-worker processes and, as
// `trainer.launch: command`, examples/pytorch_trainer/train.py, which finds the bridge, the run dir,
// the weight-sync block and the model shape in its environment. Checked from the outside: the exit
// status, summary.json (every worker serves the trainer's last version, with the trainer's
// checksum), the trainer's own metrics in the run dir, and that the trainer stopped by itself, cleanly,
// when arlo run ended.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "testing/process.h"

namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 30;
constexpr int kWarmup = 10;

// The example needs Debian's python3-torch, which /usr/bin/python3 imports.
bool python_has_torch(const fs::path& scratch_log) {
  return arlo::e2e::run_to_end({"/usr/bin/python3", "-c", "import torch, numpy"}, scratch_log).exited_with(0);
}

// One `arlo run configs/pytorch-trainer.yaml` of `steps` steps (`warmup` supervised) with `sets`;
// skips the test without torch. The run dir is removed by the caller.
struct TrainerRun {
  fs::path run_dir;
  arlo::e2e::Ended run;
  std::string tail;
};

TrainerRun run_trainer(const std::string& name, int steps, int warmup, std::vector<std::string> sets) {
  TrainerRun r;
  r.run_dir = fs::temp_directory_path() / ("arlo_pytorch_trainer_e2e_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(r.run_dir);
  const char* src = std::getenv("ARLO_SOURCE_DIR");
  if (!src) throw std::runtime_error("ARLO_SOURCE_DIR is not set");
  // trainer.command's paths are relative to where arlo run starts: the top of the source tree.
  fs::current_path(src);
  ::setenv("ARLO_BRIDGE_LIB", ARLO_BRIDGE_LIBRARY, 1);  // the Python module loads this build's library
  sets.insert(sets.end(), {"run.dir=" + r.run_dir.string(),
                           "status.port=0",  // tests run side by side
                           "log.progress=false", "run.max_steps=" + std::to_string(steps),
                           "orchestrator.sft_warmup_steps=" + std::to_string(warmup), "eval.interval=0"});
  r.run = arlo::e2e::run_to_end(arlo::e2e::arlo_run_argv(ARLO_BINARY, "configs/pytorch-trainer.yaml", sets),
                                r.run_dir.string() + ".log");
  r.tail = arlo::e2e::tail(r.run.output, 8000);
  return r;
}

// summary.json: `steps` steps, and both workers serve the trainer's last version with its checksum.
void expect_workers_on_the_trainers_last_version(const fs::path& run_dir, int steps, const std::string& tail) {
  const std::string text = arlo::e2e::read_text(run_dir / "summary.json");
  ASSERT_FALSE(text.empty()) << "no summary.json in " << run_dir << "; output:\n" << tail;
  const auto summary = nlohmann::json::parse(text);
  EXPECT_TRUE(summary.at("ok").get<bool>()) << summary.dump(2);
  EXPECT_EQ(summary.at("steps").get<int>(), steps);
  // The trainer's newest announcement is the last step's version; both workers serve it.
  ASSERT_TRUE(summary.contains("trainer")) << summary.dump(2);
  const auto& trainer = summary.at("trainer");
  ASSERT_EQ(trainer.at("version").get<std::int64_t>(), steps) << trainer.dump();
  const std::string trainer_checksum = trainer.at("checksum").get<std::string>();
  EXPECT_FALSE(trainer_checksum.empty()) << "the trainer's announcement carries no checksum: " << trainer.dump();
  const auto& workers = summary.at("workers");
  ASSERT_EQ(workers.size(), 2u) << workers.dump(2);
  for (const auto& [name, w] : workers.items()) {
    ASSERT_FALSE(w.contains("error")) << name << ": " << w.dump();
    EXPECT_EQ(w.at("version").get<std::int64_t>(), steps) << name;
    EXPECT_EQ(w.at("checksum").get<std::string>(), trainer_checksum)
        << name << " serves other weights than the trainer published: " << summary.dump(2);
  }
}

// The trainer's metrics records in the run dir, one per step, in order.
std::vector<nlohmann::json> trainer_metrics(const fs::path& run_dir) {
  std::ifstream metrics(run_dir / "trainer_metrics.jsonl");
  std::vector<nlohmann::json> records;
  for (std::string line; std::getline(metrics, line);) records.push_back(nlohmann::json::parse(line));
  return records;
}

class PytorchTrainerE2E : public ::testing::TestWithParam<std::string> {};

TEST_P(PytorchTrainerE2E, EveryWorkerServesTheTrainersLastVersion) {
  const std::string transport = GetParam();
  if (!python_has_torch(fs::temp_directory_path() / ("arlo_pytorch_probe_" + std::to_string(::getpid()) + ".log")))
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch and numpy (Debian's python3-torch); "
                    "examples/pytorch_trainer needs them";
  const auto r = run_trainer(transport, kSteps, kWarmup, {"weight_sync.transport=" + transport});
  ASSERT_TRUE(r.run.exited_with(0)) << "arlo run failed (status " << r.run.status << "):\n" << r.tail;
  expect_workers_on_the_trainers_last_version(r.run_dir, kSteps, r.tail);

  // The trainer found the run dir in its environment and wrote one metrics record per step there.
  const auto records = trainer_metrics(r.run_dir);
  for (std::size_t i = 0; i < records.size(); ++i) EXPECT_EQ(records[i].at("step").get<std::size_t>(), i + 1);
  EXPECT_EQ(records.size(), static_cast<std::size_t>(kSteps));
  // It published v0 from its own initialisation, and stopped by itself, cleanly, when the run ended.
  EXPECT_NE(r.run.output.find("[trainer] published v0"), std::string::npos) << r.tail;
  EXPECT_NE(r.run.output.find("[trainer] trainer: stopped after step " + std::to_string(kSteps) +
                              ": SIGTERM (arlo run ended)"),
            std::string::npos)
      << r.tail;
  fs::remove_all(r.run_dir);
}

// trainer.num_ranks: 2: arlo run starts the command twice, ranks 0 and 1 with a torch.distributed
// rendezvous in their environment; the bridge splits each step's batch over them, and a step counts
// only once both acked it, while the ranks average their gradients with a gloo all-reduce (a rank
// that skipped a step would leave the other waiting in it). Rank 0 publishes.
TEST(PytorchTrainerRanksE2E, TwoRanksTrainEveryStepTogetherAndRankZeroPublishes) {
  if (!python_has_torch(fs::temp_directory_path() / ("arlo_pytorch_probe_" + std::to_string(::getpid()) + ".log")))
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch and numpy (Debian's python3-torch)";
  constexpr int kRankSteps = 12;
  const auto r = run_trainer("ranks", kRankSteps, 4, {"weight_sync.transport=tcp", "trainer.num_ranks=2"});
  ASSERT_TRUE(r.run.exited_with(0)) << "arlo run failed (status " << r.run.status << "):\n" << r.tail;
  expect_workers_on_the_trainers_last_version(r.run_dir, kRankSteps, r.tail);
  const auto records = trainer_metrics(r.run_dir);  // rank 0's
  ASSERT_EQ(records.size(), static_cast<std::size_t>(kRankSteps));
  for (const auto& rec : records) EXPECT_EQ(rec.at("num_ranks").get<int>(), 2) << rec.dump();
  EXPECT_NE(r.run.output.find("[trainer-0] published v0"), std::string::npos) << r.tail;
  EXPECT_EQ(r.run.output.find("[trainer-1] published"), std::string::npos) << "rank 1 published:\n" << r.tail;
  for (const std::string rank : {"trainer-0", "trainer-1"})
    EXPECT_NE(r.run.output.find("[" + rank + "] trainer: stopped after step " + std::to_string(kRankSteps) +
                                ": SIGTERM (arlo run ended)"),
              std::string::npos)
        << rank << ":\n"
        << r.tail;
  fs::remove_all(r.run_dir);
}

INSTANTIATE_TEST_SUITE_P(Transports, PytorchTrainerE2E,
                         ::testing::Values(std::string("filesystem"), std::string("tcp"), std::string("shm")),
                         [](const auto& info) { return info.param; });

}  // namespace
