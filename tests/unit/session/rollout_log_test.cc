// rollouts.jsonl: what one scored group's line holds, which groups are written, and a resume after a
// kill mid-line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "session/rollout_log.h"
#include "tests/temp_dir.h"

namespace arlo::session {
namespace {

using orch::Group;
using orch::TimePoint;

Group scored_group(std::uint64_t id) {
  Group g;
  g.id = id;
  g.target_step = 12;
  g.dispatch_version = 10;
  g.worker = "http://127.0.0.1:8001";
  auto task = std::make_shared<Task>();
  task->id = "t7";
  task->env = "arithmetic";
  task->prompt = "3+4=";
  task->answer = "7";
  g.task = task;
  g.prompt_tokens = {1, 2, 3, 4};
  g.dispatched_at = TimePoint{} + std::chrono::seconds(1);
  g.finished_at = g.dispatched_at + std::chrono::milliseconds(250);
  Sample a;
  a.text = "7";
  a.completion_tokens = {5, 6};
  a.version_spans = {{10, 0}, {11, 1}};
  a.finish_reason = FinishReason::kStop;
  Sample b;
  b.text = "\xff";  // not UTF-8: replaced, never a broken line
  b.completion_tokens = {9};
  b.finish_reason = FinishReason::kLength;
  g.completions = {a, b};
  g.scores.rewards = {1.0, 0.0};
  g.scores.advantages = {0.5, -0.5};
  g.scores.metrics = {{{"exact_match", 1.0}}, {{"exact_match", 0.0}}};
  return g;
}

std::vector<nlohmann::json> lines(const std::filesystem::path& p) {
  std::vector<nlohmann::json> out;
  std::ifstream in(p);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(RolloutLog, AGroupsLineHoldsThePromptAndEverySample) {
  const auto j = rollout_record(scored_group(40));
  EXPECT_EQ(j["step"], 12);
  EXPECT_EQ(j["group"], 40);
  EXPECT_EQ(j["env"], "arithmetic");
  EXPECT_EQ(j["task_id"], "t7");
  EXPECT_EQ(j["prompt"], "3+4=");
  EXPECT_EQ(j["answer"], "7");
  EXPECT_EQ(j["dispatch_version"], 10);
  EXPECT_EQ(j["worker"], "http://127.0.0.1:8001");
  EXPECT_EQ(j["prompt_tokens"], 4);
  EXPECT_DOUBLE_EQ(j["seconds"].get<double>(), 0.25);
  ASSERT_EQ(j["samples"].size(), 2u);
  const auto& s = j["samples"][0];
  EXPECT_EQ(s["completion"], "7");
  EXPECT_EQ(s["tokens"], 2);
  EXPECT_EQ(s["finish_reason"], "stop");
  EXPECT_EQ(s["versions"], nlohmann::json::parse("[[10, 0], [11, 1]]"));
  EXPECT_EQ(s["reward"], 1.0);
  EXPECT_EQ(s["advantage"], 0.5);
  EXPECT_EQ(s["scores"]["exact_match"], 1.0);
  EXPECT_EQ(j["samples"][1]["finish_reason"], "length");
}

TEST(RolloutLog, WritesEveryNthGroupByIdAndAResumeDropsAPartialLine) {
  test_files::TempDir dir;
  {
    RolloutLog log;
    ASSERT_TRUE(log.open(dir.path().string(), 3));
    for (std::uint64_t id = 1; id <= 7; ++id) log.add(scored_group(id), 100.0);
  }
  const auto path = dir.path() / "rollouts.jsonl";
  auto got = lines(path);
  ASSERT_EQ(got.size(), 2u);  // groups 3 and 6
  EXPECT_EQ(got[0]["group"], 3);
  EXPECT_EQ(got[1]["group"], 6);
  EXPECT_EQ(got[1]["time"], 100.0);
  EXPECT_EQ(got[1]["samples"][1]["completion"], "\xef\xbf\xbd");
  {
    std::ofstream(path, std::ios::app) << "{\"group\": 9, \"prom";  // a kill mid-line
  }
  {
    RolloutLog log;
    ASSERT_TRUE(log.open(dir.path().string(), 3));
    log.add(scored_group(9), 101.0);
  }
  got = lines(path);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[2]["group"], 9);
}

TEST(RolloutLog, OffWithoutARunDirOrWithEveryZero) {
  test_files::TempDir dir;
  RolloutLog log;
  ASSERT_TRUE(log.open(dir.path().string(), 0));
  log.add(scored_group(3), 1.0);
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "rollouts.jsonl"));
}

}  // namespace
}  // namespace arlo::session
