// The arlo CLI as a user runs it: a real process, its output and its exit status.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "config/config.h"
#include "tests/temp_dir.h"

namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

struct Outcome {
  int status = -1;
  std::string output;  // stdout and stderr together
};

// Runs `arlo <args>` through the shell, capturing both streams and the exit status.
Outcome arlo(const std::string& args) {
  const std::string command = std::string(ARLO_CLI_PATH) + " " + args + " 2>&1";
  Outcome out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  std::array<char, 4096> buf;
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) out.output.append(buf.data(), n);
  const int raw = ::pclose(pipe);
  out.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return out;
}

class CliTest : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  const arlo::test_files::TempDir tmp_{"arlo_cli_test"};
  const fs::path& dir_ = tmp_.path();
};

TEST_F(CliTest, Version) {
  Outcome o = arlo("--version");
  EXPECT_EQ(o.status, 0);
  EXPECT_THAT(o.output, HasSubstr("arlo 0."));
}

TEST_F(CliTest, CheckConfigCitesFileLineColumnAndSuggestsAndExits2) {
  const std::string path = write("bad.yaml", "orchestrator:\n  group_size: 4\n  batchsize: 8\n");
  Outcome o = arlo("check-config " + path);
  EXPECT_EQ(o.status, 2) << o.output;
  EXPECT_THAT(o.output, HasSubstr(path + ":3:3:"));
  EXPECT_THAT(o.output, HasSubstr("did you mean 'batch_size'"));
}

TEST_F(CliTest, CheckConfigPrintsEveryProblem) {
  const std::string path = write("bad.yaml", "orchestrator:\n  batch_size: x\nsampling:\n  top_p: 7\n");
  Outcome o = arlo("check-config " + path + " --set run.max_steps=0");
  EXPECT_EQ(o.status, 2);
  EXPECT_THAT(o.output, HasSubstr(path + ":2:15: orchestrator.batch_size: expected an integer"));
  EXPECT_THAT(o.output, HasSubstr(path + ":4:10: sampling.top_p: must be between 0 and 1, got 7"));
  EXPECT_THAT(o.output, HasSubstr("--set run.max_steps=0: run.max_steps: must be >= 1, got 0"));
  EXPECT_THAT(o.output, HasSubstr("3 problem(s)"));
}

TEST_F(CliTest, CheckConfigPrintsResolvedYamlThatLoadsAgain) {
  const std::string path = write("good.yaml", "orchestrator:\n  batch_size: 16\n");
  Outcome o = arlo("check-config " + path + " --set sampling.temperature=0.7");
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_THAT(o.output, HasSubstr("batch_size: 16"));
  EXPECT_THAT(o.output, HasSubstr("temperature: 0.7"));
  auto again = arlo::config::load_string(o.output, "printed");
  ASSERT_TRUE(again) << again.error().what();
  EXPECT_EQ(again->integer("orchestrator.batch_size"), 16);
  EXPECT_DOUBLE_EQ(again->number("sampling.temperature"), 0.7);
}

TEST_F(CliTest, CheckConfigMissingFile) {
  Outcome o = arlo("check-config " + (dir_ / "missing.yaml").string());
  EXPECT_EQ(o.status, 2);
  EXPECT_THAT(o.output, HasSubstr("does not exist"));
}

TEST_F(CliTest, ConfigDocWritesTheGeneratedReference) {
  const std::string out = (dir_ / "configuration.md").string();
  Outcome o = arlo("config-doc --output " + out);
  ASSERT_EQ(o.status, 0) << o.output;
  std::ifstream in(out);
  std::ostringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), arlo::config::generate_markdown(arlo::config::product_schema()));
}

TEST_F(CliTest, RunRefusesABadConfigBeforeStartingAnything) {
  const std::string bad = write("bad.yaml", "run:\n  max_step: 3\n");
  Outcome b = arlo("run " + bad);
  EXPECT_EQ(b.status, 2) << b.output;
  EXPECT_THAT(b.output, HasSubstr("did you mean 'max_steps'"));
  EXPECT_THAT(b.output, HasSubstr("nothing was started"));
}

TEST_F(CliTest, BenchListsWhatIsMissing) {
  Outcome o = arlo("bench no-such-bench-xyz");
  EXPECT_EQ(o.status, 2) << o.output;
  EXPECT_THAT(o.output, HasSubstr("no benchmark 'no-such-bench-xyz'"));
}

TEST_F(CliTest, BenchRunsTheBinaryNextToArloWithArguments) {
  // A copy of arlo in a scratch dir, with a benchmark script beside it.
  const fs::path self = dir_ / "arlo";
  fs::copy_file(ARLO_CLI_PATH, self);
  const fs::path script = dir_ / "arlo-bench-echo";
  std::ofstream(script) << "#!/bin/sh\necho \"bench-args: $*\"\nexit 7\n";
  fs::permissions(script, fs::perms::owner_all);
  const std::string command = self.string() + " bench echo --scale 2 -x 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::array<char, 4096> buf;
  std::string output;
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) output.append(buf.data(), n);
  const int raw = ::pclose(pipe);
  EXPECT_EQ(WEXITSTATUS(raw), 7) << output;
  EXPECT_THAT(output, HasSubstr("bench-args: --scale 2 -x"));
}

TEST_F(CliTest, ReplayNamesWhatIsMissingAndScoresAStoredSample) {
  Outcome none = arlo("replay " + (dir_ / "no-run").string());
  if (none.status == 3) GTEST_SKIP() << "replay is not in this build: " << none.output;
  EXPECT_EQ(none.status, 2) << none.output;
  EXPECT_THAT(none.output, HasSubstr("rollouts.jsonl: no such file"));
  write("rollouts.jsonl", R"({"task_id": "t", "prompt": "1+1=", "answer": "2", "samples": [)"
                          R"({"completion": "2", "reward": 1.0, "scores": {"exact_match": 1.0}}]})"
                          "\n");
  Outcome no_config = arlo("replay " + dir_.string());
  EXPECT_EQ(no_config.status, 2) << no_config.output;
  EXPECT_THAT(no_config.output, HasSubstr("resolved_config.yaml: no such file"));
  EXPECT_THAT(no_config.output, HasSubstr("--config"));
  const std::string cfg = write("reward.yaml", "reward:\n  modules:\n    - kind: lcs_ratio\n");
  Outcome unknown = arlo("replay " + dir_.string() + " --config " + cfg + " --set 'reward.modules=[{kind: nope}]'");
  EXPECT_EQ(unknown.status, 2) << unknown.output;
  EXPECT_THAT(unknown.output, HasSubstr("got 'nope'"));
  Outcome ok = arlo("replay " + dir_.string() + " --config " + cfg);
  ASSERT_EQ(ok.status, 0) << ok.output;
  EXPECT_THAT(ok.output, HasSubstr("1 group(s), 1 sample(s) scored again; 0 failed now"));
  EXPECT_THAT(ok.output, HasSubstr("lcs_ratio"));
  EXPECT_TRUE(fs::exists(dir_ / "replay.jsonl"));
}

TEST_F(CliTest, UsageErrorsExit2) {
  EXPECT_EQ(arlo("").status, 2);
  EXPECT_EQ(arlo("check-config").status, 2);
  EXPECT_EQ(arlo("no-such-command").status, 2);
}

}  // namespace
