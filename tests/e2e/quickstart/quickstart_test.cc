// `arlo run configs/quickstart.yaml`, shortened with --set, through real processes: arlo starts two
// arlo-worker processes and one arlo-trainer on loopback, runs a supervised warm-up and then GRPO,
// and stops them. Checked from the outside, as a user would: the exit status, summary.json (the
// ledger adds up exactly once: every dispatched rollout completed, failed or was cancelled, and every
// completed one has one disposition) and metrics.jsonl (one record per step with the DESIGN
// section 9 names, supervised steps marked); that the GRPO phase raises the reward it optimises;
// and that `arlo run --resume` continues a finished run at the next step and data position.
#include <gtest/gtest.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs argv with stdout and stderr into `log`; returns the wait status. The child dies with the test.
int run_process(const std::vector<std::string>& args, const fs::path& log) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    std::FILE* f = std::fopen(log.c_str(), "w");
    if (!f) ::_exit(126);
    ::dup2(::fileno(f), 1);
    ::dup2(::fileno(f), 2);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

std::uint64_t sum(const nlohmann::json& counts) {
  std::uint64_t s = 0;
  for (const auto& [k, v] : counts.items()) s += v.get<std::uint64_t>();
  return s;
}

fs::path scratch(const std::string& name) {
  return fs::temp_directory_path() / ("arlo_quickstart_e2e_" + name + "_" + std::to_string(::getpid()));
}

// `arlo run configs/quickstart.yaml` into run_dir with the given --set overrides (and extra flags);
// returns its whole output, failing the test when it does not exit 0.
std::string run_quickstart(const fs::path& run_dir, const std::vector<std::string>& sets,
                           const std::vector<std::string>& flags = {}) {
  const char* src = std::getenv("ARLO_SOURCE_DIR");
  EXPECT_NE(src, nullptr);
  if (src == nullptr) return {};
  std::vector<std::string> args = {ARLO_BINARY, "run", std::string(src) + "/configs/quickstart.yaml",
                                   "--set", "run.dir=" + run_dir.string(), "--set", "log.progress=false"};
  for (const auto& s : sets) args.insert(args.end(), {"--set", s});
  args.insert(args.end(), flags.begin(), flags.end());
  const fs::path log = run_dir.string() + ".log";
  const int status = run_process(args, log);
  std::string output = read_file(log);
  fs::remove(log);
  const std::string tail = output.size() > 6000 ? output.substr(output.size() - 6000) : output;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "arlo run failed (status " << status << "):\n" << tail;
  return output;
}

// The per-step records of metrics.jsonl that have a train reward (RL steps), in file order.
std::vector<nlohmann::json> rl_step_records(const fs::path& run_dir) {
  std::vector<nlohmann::json> out;
  std::ifstream metrics(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("train/reward/mean") && !j.value("train/supervised", false)) out.push_back(std::move(j));
  }
  return out;
}

constexpr int kWarmup = 10;
constexpr int kSteps = 25;

TEST(QuickstartE2E, ShortRunCompletesWithExactlyOnceAccounting) {
  const fs::path run_dir = scratch("accounting");
  fs::remove_all(run_dir);
  const std::string output =
      run_quickstart(run_dir, {"run.max_steps=" + std::to_string(kSteps),
                               "orchestrator.sft_warmup_steps=" + std::to_string(kWarmup), "eval.interval=100",
                               "ckpt.interval=10"});
  ASSERT_FALSE(HasFailure());
  EXPECT_NE(output.find("[worker-0]"), std::string::npos) << "worker output is forwarded with its prefix";
  EXPECT_NE(output.find("[trainer]"), std::string::npos);

  const auto summary = nlohmann::json::parse(read_file(run_dir / "summary.json"));
  EXPECT_TRUE(summary.at("ok").get<bool>()) << summary.dump(2);
  EXPECT_EQ(summary.at("steps").get<int>(), kSteps);
  const auto& ledger = summary.at("ledger");
  const auto dispatched = ledger.at("dispatched").get<std::uint64_t>();
  const auto completed = ledger.at("completed").get<std::uint64_t>();
  EXPECT_EQ(ledger.at("in_flight").get<std::uint64_t>(), 0u);
  EXPECT_EQ(dispatched, completed + sum(ledger.at("failed")) + sum(ledger.at("cancelled"))) << ledger.dump(2);
  EXPECT_EQ(sum(ledger.at("dispositions")), completed) << ledger.dump(2);
  EXPECT_EQ(sum(ledger.at("failed")), 0u) << ledger.dump(2);
  // Every RL step trained on a full batch of 64 samples drawn from completed rollouts.
  EXPECT_GE(completed, static_cast<std::uint64_t>((kSteps - kWarmup) * 64));

  int step_records = 0, supervised_records = 0;
  std::int64_t last_step = 0;
  std::ifstream metrics(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    ASSERT_TRUE(j.contains("step") && j.contains("time")) << line;
    if (j.value("train/supervised", false)) {
      ++supervised_records;
      EXPECT_LE(j.at("step").get<std::int64_t>(), kWarmup) << line;
      continue;
    }
    if (!j.contains("train/reward/mean")) continue;
    const double reward = j.at("train/reward/mean").get<double>();
    EXPECT_TRUE(reward >= 0.0 && reward <= 1.0) << line;
    EXPECT_EQ(j.at("train/samples/trainable").get<int>(), 64) << line;
    EXPECT_EQ(j.at("rollouts/failed").get<int>(), 0) << line;
    ++step_records;
    EXPECT_GT(j.at("step").get<std::int64_t>(), last_step) << "steps are logged once, in order";
    last_step = j.at("step").get<std::int64_t>();
    for (const char* key : {"rollouts/completed", "rollouts/failed", "rollouts/cancelled", "throughput/tokens_per_s",
                            "time/step_seconds"})
      EXPECT_TRUE(j.contains(key)) << key << " missing in " << line;
  }
  EXPECT_EQ(supervised_records, kWarmup);
  EXPECT_EQ(step_records, kSteps - kWarmup);
  EXPECT_EQ(last_step, kSteps);
  EXPECT_TRUE(fs::exists(run_dir / "orchestrator" / "checkpoint.json"));
  // The eval at the start of RL and at the end were both reported.
  EXPECT_TRUE(summary.contains("eval_first") && summary.contains("eval_last")) << summary.dump(2);
  fs::remove_all(run_dir);
}

// The in-memory weight transports end to end: the trainer pushes every version to both workers
// (v0 is announced, not sent: the workers build the same seeded weights), the run ends with both
// serving the last version with the same checksum, and no shared-memory segment is left behind.
TEST(QuickstartE2E, WeightsMoveOverTcpAndSharedMemory) {
  for (const std::string transport : {"tcp", "shm"}) {
    SCOPED_TRACE(transport);
    const fs::path run_dir = scratch("ws_" + transport);
    fs::remove_all(run_dir);
    const std::string output = run_quickstart(
        run_dir, {"run.max_steps=15", "orchestrator.sft_warmup_steps=10", "eval.interval=0",
                  "weight_sync.transport=" + transport});
    ASSERT_FALSE(HasFailure());
    EXPECT_NE(output.find("published v15: "), std::string::npos) << output;
    EXPECT_NE(output.find("2/2 receivers ok"), std::string::npos) << output;
    std::string checksums[2];
    for (int w = 0; w < 2; ++w) {
      const std::string prefix = "[worker-" + std::to_string(w) + "]";
      std::istringstream lines(output);
      for (std::string line; std::getline(lines, line);)
        if (line.starts_with(prefix) && line.find("serving weights v15 (checksum ") != std::string::npos)
          checksums[w] = line.substr(line.find("checksum "));
      EXPECT_FALSE(checksums[w].empty()) << prefix << " never served v15";
    }
    EXPECT_EQ(checksums[0], checksums[1]);
    if (transport == "shm") {  // the trainer logs "weights: shm publisher at shm:/<segment>"
      const std::string marker = "publisher at shm:/";
      const auto at = output.find(marker);
      ASSERT_NE(at, std::string::npos) << output;
      const auto begin = at + marker.size();
      const std::string segment = output.substr(begin, output.find_first_of(" \n", begin) - begin);
      EXPECT_FALSE(fs::exists(fs::path("/dev/shm") / segment)) << "left behind: /dev/shm/" << segment;
    }
    fs::remove_all(run_dir);
  }
}

// The quickstart's own warm-up (350 supervised steps leave 0.305 exact answers), then 150 GRPO
// steps. Over 14 runs here (different async timings and machine load; four of them full
// quickstarts) the mean train reward of RL steps 131-150 was 0.10 to 0.22 above that of steps 1-20;
// in the 8 with an eval after 150 RL steps, greedy eval pass@1 was 0.23 to 0.34 above the
// warmed-up policy's. The test asks for about half the smallest of each: 0.05 and 0.12.
TEST(QuickstartE2E, GrpoRaisesTheTrainRewardAndEval) {
  const fs::path run_dir = scratch("learning");
  fs::remove_all(run_dir);
  constexpr int kRlSteps = 150;
  run_quickstart(run_dir, {"run.max_steps=" + std::to_string(350 + kRlSteps), "orchestrator.sft_warmup_steps=350",
                           "eval.interval=" + std::to_string(kRlSteps)});
  ASSERT_FALSE(HasFailure());
  const auto steps = rl_step_records(run_dir);
  ASSERT_EQ(steps.size(), static_cast<std::size_t>(kRlSteps));
  auto mean_reward = [&](std::size_t from, std::size_t to) {
    double sum = 0;
    for (std::size_t i = from; i < to; ++i) sum += steps[i].at("train/reward/mean").get<double>();
    return sum / static_cast<double>(to - from);
  };
  const double first = mean_reward(0, 20), last = mean_reward(kRlSteps - 20, kRlSteps);
  std::printf("train reward: RL steps 1-20 %.3f, %d-%d %.3f\n", first, kRlSteps - 19, kRlSteps, last);
  const auto summary = nlohmann::json::parse(read_file(run_dir / "summary.json"));
  ASSERT_TRUE(summary.contains("eval_first") && summary.contains("eval_last")) << summary.dump(2);
  const double eval_first = summary["eval_first"].at("eval/arithmetic/pass@1").get<double>();
  const double eval_last = summary["eval_last"].at("eval/arithmetic/pass@1").get<double>();
  std::printf("greedy eval pass@1: v350 %.3f, v%d %.3f\n", eval_first, 350 + kRlSteps, eval_last);
  EXPECT_GE(eval_last, eval_first + 0.12) << summary.dump(2);
  EXPECT_GE(last, first + 0.05) << "first 20 RL steps " << first << ", last 20 " << last;
  fs::remove_all(run_dir);
}

// A finished run extended with --resume and a larger max_steps: the orchestrator continues at the
// next step, the trainer from its own checkpoint of the same step (its first RL step then sees the
// weights the workers sampled with, so the mismatch KL stays small), and no task is drawn twice.
TEST(QuickstartE2E, ResumeContinuesAtTheNextStepAndDataPosition) {
  const fs::path run_dir = scratch("resume");
  fs::remove_all(run_dir);
  run_quickstart(run_dir, {"run.max_steps=20", "orchestrator.sft_warmup_steps=10", "eval.interval=0",
                           "ckpt.interval=10"});
  ASSERT_FALSE(HasFailure());
  const auto checkpoint = nlohmann::json::parse(read_file(run_dir / "orchestrator" / "checkpoint.json"));
  // A new run into the same directory without --resume (or --overwrite) is refused, not mixed in.
  const char* src = std::getenv("ARLO_SOURCE_DIR");
  const fs::path refused_log = run_dir.string() + ".refused.log";
  const int refused = run_process({ARLO_BINARY, "run", std::string(src) + "/configs/quickstart.yaml", "--set",
                                   "run.dir=" + run_dir.string()},
                                  refused_log);
  const std::string refusal = read_file(refused_log);
  fs::remove(refused_log);
  EXPECT_TRUE(WIFEXITED(refused) && WEXITSTATUS(refused) != 0) << refusal;
  EXPECT_NE(refusal.find("holds a previous run"), std::string::npos) << refusal;
  const std::string output = run_quickstart(
      run_dir, {"run.max_steps=30", "orchestrator.sft_warmup_steps=10", "eval.interval=0", "ckpt.interval=10"},
      {"--resume"});
  ASSERT_FALSE(HasFailure());
  EXPECT_NE(output.find("resume: continuing after step 20"), std::string::npos) << output;

  const auto steps = rl_step_records(run_dir);
  ASSERT_EQ(steps.size(), 20u) << "10 RL steps per run";
  for (std::size_t i = 0; i < steps.size(); ++i) EXPECT_EQ(steps[i].at("step").get<int>(), static_cast<int>(11 + i));
  const auto summary = nlohmann::json::parse(read_file(run_dir / "summary.json"));
  EXPECT_EQ(summary.at("steps").get<int>(), 30);

  // The trainer resumed from step 20: its step 21 was trained from the weights the workers used.
  std::ifstream trainer_metrics(run_dir / "trainer_metrics.jsonl");
  std::vector<nlohmann::json> trained;
  for (std::string line; std::getline(trainer_metrics, line);) trained.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(trained.size(), 30u);
  for (std::size_t i = 0; i < trained.size(); ++i) EXPECT_EQ(trained[i].at("step").get<int>(), static_cast<int>(i + 1));
  EXPECT_LT(trained[20].at("mismatch_kl").get<double>(), 1e-3) << trained[20].dump();

  // The task stream continued where the checkpoint left it, not from the start.
  const auto resumed = nlohmann::json::parse(read_file(run_dir / "orchestrator" / "checkpoint.json"));
  const auto served = [](const nlohmann::json& c) { return c.at("task_cursor").at("seq").get<std::int64_t>(); };
  EXPECT_GT(served(resumed), served(checkpoint)) << checkpoint.at("task_cursor") << " then " << resumed.at("task_cursor");
  fs::remove_all(run_dir);
}

}  // namespace
