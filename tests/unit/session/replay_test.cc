// arlo replay (session/replay.h): a rollouts.jsonl written by the RolloutLog itself, scored again with
// another reward configuration; the per-module means, replay.jsonl, and the bad inputs (a corrupt
// line named, a partial last line skipped, a missing file, an unknown reward kind).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "session/replay.h"
#include "session/rollout_log.h"
#include "session/rollout_parts.h"
#include "tests/temp_dir.h"

namespace arlo::session {
namespace {

namespace fs = std::filesystem;

config::Config reward_config(const std::string& modules) {
  auto c = config::load_string("run:\n  name: t\nreward:\n  modules:\n" + modules, "<test>");
  EXPECT_TRUE(c) << c.error().what();
  return *c;
}

// A group of task "3+4=" (answer 7) whose three samples the run scored with exact_match.
orch::Group group(std::uint64_t id) {
  orch::Group g;
  g.id = id;
  g.target_step = static_cast<std::int64_t>(id);
  g.dispatch_version = 3;
  g.worker = "http://127.0.0.1:8001";
  auto task = std::make_shared<Task>();
  task->id = "t" + std::to_string(id);
  task->env = "arithmetic";
  task->prompt = "3+4=";
  task->answer = "7";
  g.task = task;
  for (const char* text : {"7", "it is 7", "8"}) {
    Sample s;
    s.text = text;
    s.completion_tokens.assign(s.text.size(), 1);
    s.finish_reason = FinishReason::kStop;
    g.completions.push_back(s);
  }
  g.scores.rewards = {1.0, 0.0, 0.0};
  g.scores.metrics = {{{"exact_match", 1.0}}, {{"exact_match", 0.0}}, {{"exact_match", 0.0}}};
  return g;
}

struct ReplayTest : ::testing::Test {
  test_files::TempDir dir;
  fs::path rollouts = dir.path() / "rollouts.jsonl";
  fs::path output = dir.path() / "replay.jsonl";

  void write_groups(int n) {
    RolloutLog log;
    ASSERT_TRUE(log.open(dir.path().string(), 1));
    for (int id = 1; id <= n; ++id) log.add(group(static_cast<std::uint64_t>(id)), 100.0);
  }
  Result<ReplaySummary> replay(const config::Config& cfg, std::vector<std::size_t>* progress = nullptr) {
    auto module = build_reward(cfg);
    EXPECT_TRUE(module) << module.error().what();
    ReplayOptions o;
    o.rollouts = rollouts.string();
    o.output = output.string();
    if (progress)
      o.progress = [progress](std::size_t done, std::size_t total) {
        progress->push_back(done);
        EXPECT_EQ(total, 2u);
      };
    return replay_rollouts(std::move(*module), replay_scorer_options(cfg), o);
  }
  std::vector<nlohmann::json> output_lines() const {
    std::vector<nlohmann::json> out;
    std::ifstream in(output);
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
    return out;
  }
};

TEST_F(ReplayTest, ScoresTheStoredSamplesAgainWithAnotherRewardConfig) {
  write_groups(2);
  std::vector<std::size_t> progress;
  const auto s = replay(reward_config("    - kind: numeric_match\n      weight: 2.0\n"), &progress);
  ASSERT_TRUE(s) << s.error().what();
  EXPECT_EQ(progress, (std::vector<std::size_t>{1, 2}));
  EXPECT_EQ(s->groups, 2u);
  EXPECT_EQ(s->samples, 6u);
  EXPECT_EQ(s->failed, 0u);
  EXPECT_TRUE(s->warnings.empty());
  const auto& total = s->modules.at("reward");
  EXPECT_EQ(total.old_n, 6u);
  EXPECT_EQ(total.new_n, 6u);
  EXPECT_DOUBLE_EQ(total.old_mean(), 1.0 / 3);  // exact_match: "7" only
  EXPECT_DOUBLE_EQ(total.new_mean(), 4.0 / 3);  // numeric_match, weight 2: "7" and "it is 7"
  EXPECT_EQ(s->modules.at("exact_match").old_n, 6u);
  EXPECT_EQ(s->modules.at("exact_match").new_n, 0u);
  EXPECT_DOUBLE_EQ(s->modules.at("numeric_match").new_mean(), 2.0 / 3);

  const auto lines = output_lines();
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_EQ(lines[1]["line"], 1);
  EXPECT_EQ(lines[1]["group"], 1);
  EXPECT_EQ(lines[1]["task_id"], "t1");
  EXPECT_EQ(lines[1]["sample"], 1);
  EXPECT_EQ(lines[1]["old"]["reward"], 0.0);
  EXPECT_EQ(lines[1]["old"]["scores"]["exact_match"], 0.0);
  EXPECT_EQ(lines[1]["new"]["reward"], 2.0);
  EXPECT_EQ(lines[1]["new"]["scores"]["numeric_match"], 1.0);
  EXPECT_EQ(lines[5]["line"], 2);
  EXPECT_FALSE(fs::exists(output.string() + ".tmp"));

  const auto text = format_replay_summary(*s);
  EXPECT_NE(text.find("2 group(s), 6 sample(s)"), std::string::npos) << text;
  EXPECT_NE(text.find("0.3333"), std::string::npos) << text;
  EXPECT_NE(text.find("+1.0000"), std::string::npos) << text;
  EXPECT_NE(text.find("numeric_match"), std::string::npos) << text;
}

TEST_F(ReplayTest, AMultiTurnTrajectorysEnvRewardAndTurnsReachTheEnvModule) {
  {
    RolloutLog log;
    ASSERT_TRUE(log.open(dir.path().string(), 1));
    auto g = group(1);
    g.completions[0].turns = {{"assistant", "8"}, {"user", "no"}, {"assistant", "7"}};
    g.completions[0].env_reward = 0.5;
    log.add(g, 1.0);
  }
  const auto s = replay(reward_config("    - kind: env\n"));
  ASSERT_TRUE(s) << s.error().what();
  EXPECT_EQ(s->samples, 3u);
  EXPECT_EQ(s->failed, 2u);  // the two samples without an env reward (reward.on_failure assign)
  const auto lines = output_lines();
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["new"]["reward"], 0.5);
  EXPECT_EQ(lines[0]["new"]["scores"]["env/turns"], 2.0);
  EXPECT_EQ(lines[1]["new"]["scores"]["reward/failed"], 1.0);
  EXPECT_NE(format_replay_summary(*s).find("2 failed now"), std::string::npos);

  // Under reward.on_failure fail the first failure stops the replay, naming its line.
  auto strict = config::load_string("run:\n  name: t\nreward:\n  on_failure: fail\n  modules:\n    - kind: env\n");
  ASSERT_TRUE(strict) << strict.error().what();
  const auto failed = replay(*strict);
  ASSERT_FALSE(failed);
  EXPECT_NE(failed.error().what().find("rollouts.jsonl:1: scoring: "), std::string::npos) << failed.error().what();
  EXPECT_FALSE(fs::exists(output.string() + ".tmp"));
}

TEST_F(ReplayTest, TheSameConfigGivesTheSameScores) {
  write_groups(2);
  const auto s = replay(reward_config("    - kind: exact_match\n"));
  ASSERT_TRUE(s) << s.error().what();
  EXPECT_DOUBLE_EQ(s->modules.at("reward").old_mean(), s->modules.at("reward").new_mean());
  EXPECT_DOUBLE_EQ(s->modules.at("exact_match").old_mean(), s->modules.at("exact_match").new_mean());
  for (const auto& l : output_lines()) EXPECT_EQ(l["old"], l["new"]) << l.dump();
}

TEST_F(ReplayTest, ACorruptLineIsNamedAndNothingIsWritten) {
  write_groups(1);
  std::ofstream(rollouts, std::ios::app) << "{\"group\": 2, \"samples\": [\n"
                                         << nlohmann::json{{"task_id", "x"}, {"prompt", "p"}, {"samples", 3}}.dump()
                                         << "\n";
  auto s = replay(reward_config("    - kind: exact_match\n"));
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.error().what().find("rollouts.jsonl:2: not valid JSON"), std::string::npos) << s.error().what();
  EXPECT_FALSE(fs::exists(output));
  EXPECT_FALSE(fs::exists(output.string() + ".tmp"));

  std::ofstream(rollouts, std::ios::trunc)
      << nlohmann::json{{"task_id", "x"}, {"prompt", "p"}, {"samples", 3}}.dump() << "\n";
  s = replay(reward_config("    - kind: exact_match\n"));
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().what().find("rollouts.jsonl:1: \"samples\": not an array"), std::string::npos)
      << s.error().what();
}

TEST_F(ReplayTest, APartialLastLineIsSkippedWithAWarning) {
  write_groups(2);
  std::ofstream(rollouts, std::ios::app) << "{\"group\": 3, \"task_id\": \"t3\", \"sam";  // a kill mid-write
  const auto s = replay(reward_config("    - kind: exact_match\n"));
  ASSERT_TRUE(s) << s.error().what();
  EXPECT_EQ(s->groups, 2u);
  ASSERT_EQ(s->warnings.size(), 1u);
  EXPECT_NE(s->warnings[0].find("rollouts.jsonl:3: a partial last line"), std::string::npos) << s->warnings[0];
}

TEST_F(ReplayTest, AMissingFileIsAClearError) {
  const auto s = replay(reward_config("    - kind: exact_match\n"));
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code(), ErrorCode::kNotFound);
  EXPECT_NE(s.error().what().find("rollouts.jsonl: cannot be read"), std::string::npos) << s.error().what();
}

TEST_F(ReplayTest, AnUnknownRewardKindIsRefusedNamingIt) {
  auto c = config::load_string("run:\n  name: t\nreward:\n  modules:\n    - kind: no_such_reward\n", "<test>");
  const std::string what = c ? build_reward(*c).error().what() : c.error().what();
  EXPECT_NE(what.find("no_such_reward"), std::string::npos) << what;
}

TEST_F(ReplayTest, TheRunConfigIsWrittenForReplayOwnerOnly) {
  const auto cfg = reward_config("    - kind: lcs_ratio\n");
  ASSERT_TRUE(write_run_config(dir.path().string(), cfg));
  const auto path = dir.path() / kRunConfigFile;
  EXPECT_EQ(fs::status(path).permissions() & (fs::perms::group_all | fs::perms::others_all), fs::perms::none);
  auto back = config::load_file(path.string());
  ASSERT_TRUE(back) << back.error().what();
  EXPECT_EQ(back->objects("reward.modules").at(0).string("kind"), "lcs_ratio");
}

}  // namespace
}  // namespace arlo::session
