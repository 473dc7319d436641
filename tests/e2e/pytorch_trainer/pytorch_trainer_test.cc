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

class PytorchTrainerE2E : public ::testing::TestWithParam<std::string> {};

TEST_P(PytorchTrainerE2E, EveryWorkerServesTheTrainersLastVersion) {
  const std::string transport = GetParam();
  const fs::path run_dir =
      fs::temp_directory_path() / ("arlo_pytorch_trainer_e2e_" + transport + "_" + std::to_string(::getpid()));
  fs::remove_all(run_dir);
  if (!python_has_torch(run_dir.string() + ".probe.log"))
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch and numpy (Debian's python3-torch); "
                    "examples/pytorch_trainer needs them";
  const char* src = std::getenv("ARLO_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  // trainer.command's paths are relative to where arlo run starts: the top of the source tree.
  fs::current_path(src);
  ::setenv("ARLO_BRIDGE_LIB", ARLO_BRIDGE_LIBRARY, 1);  // the Python module loads this build's library
  const auto run = arlo::e2e::run_to_end(
      arlo::e2e::arlo_run_argv(ARLO_BINARY, "configs/pytorch-trainer.yaml",
                               {"weight_sync.transport=" + transport, "run.dir=" + run_dir.string(),
                                "status.port=0",  // tests run side by side
                                "log.progress=false", "run.max_steps=" + std::to_string(kSteps),
                                "orchestrator.sft_warmup_steps=" + std::to_string(kWarmup), "eval.interval=0"}),
      run_dir.string() + ".log");
  const std::string& output = run.output;
  const std::string tail = arlo::e2e::tail(output, 8000);
  ASSERT_TRUE(run.exited_with(0)) << "arlo run failed (status " << run.status << "):\n" << tail;

  const std::string text = arlo::e2e::read_text(run_dir / "summary.json");
  ASSERT_FALSE(text.empty()) << "no summary.json in " << run_dir << "; output:\n" << tail;
  const auto summary = nlohmann::json::parse(text);
  EXPECT_TRUE(summary.at("ok").get<bool>()) << summary.dump(2);
  EXPECT_EQ(summary.at("steps").get<int>(), kSteps);

  // The trainer's newest announcement is the last step's version; both workers serve it.
  ASSERT_TRUE(summary.contains("trainer")) << summary.dump(2);
  const auto& trainer = summary.at("trainer");
  ASSERT_EQ(trainer.at("version").get<std::int64_t>(), kSteps) << trainer.dump();
  const std::string trainer_checksum = trainer.at("checksum").get<std::string>();
  EXPECT_FALSE(trainer_checksum.empty()) << "the trainer's announcement carries no checksum: " << trainer.dump();
  const auto& workers = summary.at("workers");
  ASSERT_EQ(workers.size(), 2u) << workers.dump(2);
  for (const auto& [name, w] : workers.items()) {
    ASSERT_FALSE(w.contains("error")) << name << ": " << w.dump();
    EXPECT_EQ(w.at("version").get<std::int64_t>(), kSteps) << name;
    EXPECT_EQ(w.at("checksum").get<std::string>(), trainer_checksum)
        << name << " serves other weights than the trainer published: " << summary.dump(2);
  }

  // The trainer found the run dir in its environment and wrote one metrics record per step there.
  std::ifstream metrics(run_dir / "trainer_metrics.jsonl");
  int records = 0;
  for (std::string line; std::getline(metrics, line); ++records)
    EXPECT_EQ(nlohmann::json::parse(line).at("step").get<int>(), records + 1) << line;
  EXPECT_EQ(records, kSteps);
  // It published v0 from its own initialisation, and stopped by itself, cleanly, when the run ended.
  EXPECT_NE(output.find("[trainer] published v0"), std::string::npos) << tail;
  EXPECT_NE(
      output.find("[trainer] trainer: stopped after step " + std::to_string(kSteps) + ": SIGTERM (arlo run ended)"),
      std::string::npos)
      << tail;
  fs::remove_all(run_dir);
}

INSTANTIATE_TEST_SUITE_P(Transports, PytorchTrainerE2E,
                         ::testing::Values(std::string("filesystem"), std::string("tcp"), std::string("shm")),
                         [](const auto& info) { return info.param; });

}  // namespace
