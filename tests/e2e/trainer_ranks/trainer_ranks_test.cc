// `kill -9` of one rank of a data-parallel trainer that `arlo run` started (issue 25):
// configs/pytorch-trainer.yaml shortened with --set, trainer.num_ranks 2 over gloo on the CPU, the
// PyTorch example trainer (examples/pytorch_trainer/train.py: the hf trainer needs vLLM workers to
// serve its model, far too slow here) checkpointing before each ack (--checkpoint-dir in
// trainer.command; trainer.ckpt_interval > 0 tells arlo run that it resumes). Rank 1 (found by ARLO_RANK=1
// in its environment) is killed with SIGKILL once rank 0 wrote the metrics record of step kKillAfter
// (after its ack), a moment chosen by what the run wrote, never by sleeping. arlo run stops rank 0
// and starts both again (one group restart in supervision.jsonl, naming the killed rank and its
// signal, with a fresh MASTER_PORT); they resume from the checkpoint and the run finishes: exit 0,
// the ledger adding up, every step 1..N in the trainer's metrics exactly once, both workers on the
// trainer's checksum.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/e2e/run_checks.h"
#include "testing/process.h"

namespace {

namespace fs = std::filesystem;
using arlo::e2e::read_text;
using arlo::e2e::tail;

constexpr int kSteps = 12;
constexpr int kWarmup = 4;
constexpr int kKillAfter = 5;
constexpr auto kWait = std::chrono::seconds(300);  // generous: a loaded 2-core machine

// Not yet exited (a zombie has exited: waitid sees it without reaping it).
bool running(pid_t pid) {
  siginfo_t info{};
  const int r = ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT);
  return r == 0 && info.si_pid == 0;
}

// The child of `parent` running the example trainer with ARLO_RANK=`rank` in its environment; -1 when none.
pid_t trainer_rank(pid_t parent, int rank) {
  std::error_code ec;
  for (const auto& task : fs::directory_iterator("/proc/" + std::to_string(parent) + "/task", ec)) {
    std::stringstream children(read_text(task.path() / "children"));
    for (pid_t child; children >> child;) {
      const auto dir = "/proc/" + std::to_string(child);
      if (read_text(dir + "/cmdline").find("pytorch_trainer") == std::string::npos) continue;
      std::string env = read_text(dir + "/environ");
      for (auto& c : env)
        if (c == '\0') c = '\n';
      if (("\n" + env).find("\nARLO_RANK=" + std::to_string(rank) + "\n") != std::string::npos) return child;
    }
  }
  return -1;
}

bool python_has_torch(const fs::path& scratch_log) {
  return arlo::e2e::run_to_end({"/usr/bin/python3", "-c", "import torch, numpy"}, scratch_log).exited_with(0);
}

TEST(TrainerRanksE2E, KillingOneRankRestartsTheGroupAndEveryStepIsTrainedOnce) {
  const auto dir = arlo::e2e::fresh_temp_dir("arlo_trainer_ranks_e2e");
  if (!python_has_torch(dir / "probe.log"))
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch and numpy (Debian's python3-torch)";
  const char* src = std::getenv("ARLO_SOURCE_DIR");
  ASSERT_NE(src, nullptr) << "ARLO_SOURCE_DIR is not set";
  fs::current_path(src);  // trainer.command's paths are relative to the top of the source tree
  ::setenv("ARLO_BRIDGE_LIB", ARLO_BRIDGE_LIBRARY, 1);
  ::setenv("OMP_NUM_THREADS", "1", 1);
  const auto run_dir = dir / "run", log = dir / "arlo.log";
  const std::string command =
      "[\"/usr/bin/python3\", \"examples/pytorch_trainer/train.py\", \"--lr\", \"0.0003\", "
      "\"--checkpoint-dir\", \"" +
      (dir / "ckpt").string() + "\"]";
  std::vector<std::string> sets = {"run.dir=" + run_dir.string(), "status.port=0", "log.progress=false"};
  sets.insert(sets.end(), {"run.max_steps=" + std::to_string(kSteps), "eval.interval=0",
                           "orchestrator.sft_warmup_steps=" + std::to_string(kWarmup)});
  sets.insert(sets.end(), {"weight_sync.transport=tcp", "trainer.num_ranks=2", "trainer.ckpt_interval=1",
                           "trainer.command=" + command});
  for (const auto& s : arlo::e2e::extra_sets()) sets.push_back(s);
  const pid_t arlo =
      arlo::e2e::spawn_logged(arlo::e2e::arlo_run_argv(ARLO_BINARY, "configs/pytorch-trainer.yaml", sets), log);

  // Rank 0's metrics record of step kKillAfter (written after its ack): then rank 1 dies.
  const auto end = std::chrono::steady_clock::now() + kWait;
  auto steps_logged = [&] { return arlo::e2e::read_jsonl(run_dir / "trainer_metrics.jsonl").size(); };
  while (std::chrono::steady_clock::now() < end && running(arlo) &&
         steps_logged() < static_cast<std::size_t>(kKillAfter))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const pid_t rank1 = trainer_rank(arlo, 1);
  ASSERT_GT(rank1, 0) << "no rank 1 running after step " << kKillAfter << ":\n" << tail(read_text(log));
  ASSERT_EQ(::kill(rank1, SIGKILL), 0);

  int status = 0;
  ::waitpid(arlo, &status, 0);
  const std::string out = read_text(log);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << ":\n" << tail(out, 12000);
  const auto summary = nlohmann::json::parse(read_text(run_dir / "summary.json"));
  arlo::e2e::expect_every_step_trained(summary, run_dir, kSteps, 2);

  // Every step once in rank 0's metrics, across the restart.
  std::vector<int> steps;
  for (const auto& rec : arlo::e2e::read_jsonl(run_dir / "trainer_metrics.jsonl"))
    steps.push_back(rec.at("step").get<int>());
  std::vector<int> expected;
  for (int s = 1; s <= kSteps; ++s) expected.push_back(s);
  EXPECT_EQ(steps, expected) << tail(out, 12000);

  // One group restart, for rank 1's SIGKILL; both ranks started again and rank 0 resumed.
  int restarting = 0, restarted = 0;
  for (const auto& j : arlo::e2e::read_jsonl(run_dir / "supervision.jsonl")) {
    if (j.value("event", "") == "restarting") {
      ++restarting;
      EXPECT_EQ(j.value("name", ""), "trainer-1") << j.dump();
      EXPECT_EQ(j.value("group", ""), "trainer") << j.dump();
      EXPECT_EQ(j.value("signal", 0), SIGKILL) << j.dump();
      EXPECT_EQ(j.value("exited_pid", 0), rank1) << j.dump();
    }
    if (j.value("event", "") == "started" && j.value("restarted", false)) ++restarted;
  }
  EXPECT_EQ(restarting, 1) << tail(out, 12000);
  EXPECT_EQ(restarted, 2) << tail(out, 12000);
  EXPECT_NE(out.find("[trainer-0] resumed from"), std::string::npos) << tail(out, 12000);
  EXPECT_NE(out.find("[trainer-1] resumed from"), std::string::npos) << tail(out, 12000);
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

}  // namespace
