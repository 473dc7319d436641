// arlo-trainer end to end: batches written in the dir layout of the trainer bridge, versions
// published through the filesystem weight transport, checkpoints and resume.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "reference/model.h"
#include "reference/model_weights.h"
#include "reference/tokenizer.h"
#include "tests/integration/worker/child_process.h"
#include "trainer_bridge/batch.h"
#include "trainer_bridge/bridge.h"

namespace arlo {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / fmt::format("arlo_trainer_{}_{}", name, ::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Writes the batch of `step` as the orchestrator's dir transport does (whole step dir by rename).
void write_step(const fs::path& run_dir, std::int64_t step) {
  reference::Tokenizer tok;
  std::vector<bridge::Sample> samples;
  for (int i = 0; i < 16; ++i) {
    const int x = (i * 3 + static_cast<int>(step)) % 10, y = (i * 7) % 10;
    bridge::Sample s;
    s.prompt_tokens = tok.encode_prompt(std::to_string(x) + "+" + std::to_string(y) + "=");
    s.completion_tokens = tok.encode(std::to_string(x + y));
    s.completion_tokens.push_back(reference::Tokenizer::kEos);
    s.completion_logprobs.assign(s.completion_tokens.size(), -4.0f);
    s.token_versions.assign(s.completion_tokens.size(), static_cast<std::int32_t>(step - 1));
    s.advantage = i % 2 == 0 ? 1.0f : -1.0f;
    s.ce_weights.assign(s.completion_tokens.size(), 1.0f);
    samples.push_back(std::move(s));
  }
  auto packed = bridge::pack(step, samples, {.seq_len = 64, .num_ranks = 1});
  ASSERT_TRUE(packed) << packed.error().what();
  auto tmp = bridge::dir_layout::rollouts(run_dir) / fmt::format(".tmp_step_{}", step);
  fs::create_directories(tmp);
  ASSERT_TRUE(bridge::write_file(tmp / "rank_0.safetensors", packed->ranks[0]));
  fs::rename(tmp, bridge::dir_layout::step_dir(run_dir, step));
}

std::vector<std::string> trainer_args(const fs::path& run, std::int64_t max_steps) {
  return {ARLO_TRAINER_BINARY,
          "--run-dir",
          run.string(),
          "--weight-sync",
          nlohmann::json{{"transport", "filesystem"}, {"dir", (run / "weights").string()}}.dump(),
          "--max-steps",
          std::to_string(max_steps),
          "--checkpoint-every",
          "1",
          "--batch-timeout-ms",
          "200",
          "--seed",
          "3",
          "--log-level",
          "warn",
          "--threads",
          "1"};
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

TEST(Trainer, TrainsPublishesCheckpointsAndResumes) {
  auto run = temp_dir("run");
  for (std::int64_t s = 1; s <= 2; ++s) write_step(run, s);
  {
    testing::ChildProcess trainer(trainer_args(run, 2));
    ASSERT_TRUE(trainer.started());
    auto status = trainer.wait(std::chrono::seconds(120));
    ASSERT_TRUE(status.has_value());
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
  }
  // Versions 0, 1, 2 were announced with their checksums; the weights are on disk.
  for (int v = 0; v <= 2; ++v) {
    auto marker = bridge::dir_layout::version_file(run, v);
    ASSERT_TRUE(fs::exists(marker)) << marker;
  }
  EXPECT_TRUE(fs::exists(run / "weights" / "v2" / "STABLE"));
  // v0 is the seeded initialisation.
  auto v0 = reference::Model::init({}, 3);
  ASSERT_TRUE(v0);
  auto v0_sum = reference::weights_checksum_hex(**v0);
  json m0 = read_json(bridge::dir_layout::version_file(run, 0));
  EXPECT_EQ(m0.dump().find(*v0_sum) != std::string::npos, true) << m0.dump();
  // Metrics per step.
  std::ifstream metrics(run / "trainer_metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(metrics, line)) {
    json m = json::parse(line);
    EXPECT_TRUE(std::isfinite(m["loss"].get<double>()));
    EXPECT_GT(m["grad_norm"].get<double>(), 0.0);
    EXPECT_GE(m["mismatch_kl"].get<double>(), 0.0);
    ++lines;
  }
  EXPECT_EQ(lines, 2);
  // A checkpoint of step 2; a restarted trainer resumes from it and trains step 3 only.
  auto ckpt = run / "checkpoints" / "trainer";
  ASSERT_TRUE(fs::exists(ckpt / "step_2" / "model.safetensors"));
  write_step(run, 3);
  {
    testing::ChildProcess trainer(trainer_args(run, 3));
    auto status = trainer.wait(std::chrono::seconds(120));
    ASSERT_TRUE(status.has_value());
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
  }
  json state = read_json(ckpt / "step_3" / "state.json");
  EXPECT_EQ(state["step"], 3);
  EXPECT_EQ(state["optimizer_steps"], 3);
  // The version announced for step 3 carries the checksum of the checkpointed weights.
  auto m3 = reference::Model::load(ckpt / "step_3" / "model.safetensors");
  ASSERT_TRUE(m3);
  auto sum3 = reference::weights_checksum_hex(**m3);
  json marker3 = read_json(bridge::dir_layout::version_file(run, 3));
  EXPECT_NE(marker3.dump().find(*sum3), std::string::npos) << marker3.dump();
  fs::remove_all(run);
}

// A --run-dir that does not exist yet (a trainer on a host of its own, given a fresh directory) is
// made at start: the metrics log is there from the first step, not silently missing.
TEST(Trainer, MakesARunDirectoryThatDoesNotExistYet) {
  const auto base = temp_dir("fresh");
  const auto run = base / "not" / "yet";
  auto args = trainer_args(run, 1);
  args.insert(args.end(), {"--idle-exit-ms", "300"});
  testing::ChildProcess trainer(args);
  ASSERT_TRUE(trainer.started());
  auto status = trainer.wait(std::chrono::seconds(120));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
  EXPECT_TRUE(fs::exists(run / "trainer_metrics.jsonl"));
  fs::remove_all(base);
}

// arlo-trainer's stdout and stderr together, and how it exited (nullopt if it did not within the deadline).
struct Exit {
  std::optional<int> status;
  std::string output;
};
Exit run_to_exit(const std::vector<std::string>& trainer_argv) {
  std::vector<std::string> argv{"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1"};
  argv.insert(argv.end(), trainer_argv.begin(), trainer_argv.end());
  testing::ChildProcess trainer(argv);
  Exit e;
  if (!trainer.started()) return e;
  // Every line until the output closes (the trainer exits).
  while (auto line = trainer.wait_for_line("", std::chrono::seconds(120))) e.output += *line + "\n";
  e.status = trainer.wait(std::chrono::seconds(120));
  return e;
}

// The flags named as the config's keys (--is-correction, --is-low, --is-high) replaced --correction,
// --mis-low, --tis-high and --mis-high; the old ones still work for one release, each with a
// warning that names its new flag, and set the same option as the new one.
TEST(Trainer, RenamedImportanceSamplingFlagsStillWorkWithAWarningNamingTheNewOnes) {
  const auto run = temp_dir("renamed_flags");
  write_step(run, 1);
  auto args = trainer_args(run, 1);
  args.insert(args.end(), {"--correction", "token_mis", "--mis-low", "0.25", "--tis-high", "3", "--mis-high", "3.0"});
  auto old = run_to_exit(args);
  ASSERT_TRUE(old.status.has_value()) << old.output;
  EXPECT_TRUE(WIFEXITED(*old.status) && WEXITSTATUS(*old.status) == 0) << old.output;
  for (const auto& [was, is] : {std::pair{"--correction", "--is-correction"},
                                {"--mis-low", "--is-low"},
                                {"--tis-high", "--is-high"},
                                {"--mis-high", "--is-high"}})
    EXPECT_NE(old.output.find(fmt::format("{} is deprecated and goes in the next release: use {}", was, is)),
              std::string::npos)
        << was << ": " << old.output;
  EXPECT_TRUE(fs::exists(bridge::dir_layout::version_file(run, 1))) << "step 1 was not trained: " << old.output;

  // The new flags: no warning.
  const auto fresh = temp_dir("new_flags");
  write_step(fresh, 1);
  args = trainer_args(fresh, 1);
  args.insert(args.end(), {"--is-correction", "token_mis", "--is-low", "0.25", "--is-high", "3"});
  auto now = run_to_exit(args);
  ASSERT_TRUE(now.status.has_value()) << now.output;
  EXPECT_TRUE(WIFEXITED(*now.status) && WEXITSTATUS(*now.status) == 0) << now.output;
  EXPECT_EQ(now.output.find("deprecated"), std::string::npos) << now.output;
  // Both ran the same correction on the same batch from the same seed: the same loss.
  auto first_record = [](const fs::path& dir) {
    std::ifstream in(dir / "trainer_metrics.jsonl");
    std::string line;
    std::getline(in, line);
    return json::parse(line);
  };
  const auto a = first_record(run), b = first_record(fresh);
  EXPECT_EQ(a["loss"], b["loss"]) << a.dump() << "\n" << b.dump();
  EXPECT_EQ(a["clipped_fraction"], b["clipped_fraction"]);
  fs::remove_all(run);
  fs::remove_all(fresh);
}

// The old spelling sets the same option: a value it gives is checked like the new flag's, and
// spellings of one flag that disagree are refused, naming both.
TEST(Trainer, RenamedImportanceSamplingFlagsAreCheckedLikeTheNewOnes) {
  const auto run = temp_dir("renamed_refused");
  auto args = trainer_args(run, 1);
  args.insert(args.end(), {"--correction", "ppo", "--idle-exit-ms", "300"});
  auto bad = run_to_exit(args);
  ASSERT_TRUE(bad.status.has_value()) << bad.output;
  EXPECT_TRUE(WIFEXITED(*bad.status) && WEXITSTATUS(*bad.status) != 0) << bad.output;
  EXPECT_NE(bad.output.find("unknown is_correction 'ppo' (--is-correction)"), std::string::npos) << bad.output;

  args = trainer_args(run, 1);
  args.insert(args.end(), {"--tis-high", "2", "--mis-high", "3", "--idle-exit-ms", "300"});
  auto clash = run_to_exit(args);
  ASSERT_TRUE(clash.status.has_value()) << clash.output;
  EXPECT_TRUE(WIFEXITED(*clash.status) && WEXITSTATUS(*clash.status) == 2) << clash.output;
  EXPECT_NE(
      clash.output.find("--tis-high 2 and --mis-high 3 both set --is-high (trainer.is_high): give --is-high once"),
      std::string::npos)
      << clash.output;
  fs::remove_all(run);
}

}  // namespace
}  // namespace arlo
