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

// A chat task's three-turn trajectory: model, environment, model.
Group multi_turn_group(std::uint64_t id) {
  Group g = scored_group(id);
  auto task = std::make_shared<Task>();
  task->id = "c1";
  task->env = "arithmetic_retry";
  task->messages = {{"system", "add"}, {"user", "3+4="}};
  task->answer = "7";
  task->info = {{"tries", 2}};
  g.task = task;
  auto& a = g.completions[0];
  a.text = "7";
  a.completion_tokens = {5, 6, 7, 8, 9, 10};
  a.loss_mask = {1, 1, 0, 0, 0, 1};
  a.turns = {{"assistant", "8"}, {"user", "wrong, try again"}, {"assistant", "7"}};
  a.turn_versions = {10, 11};
  a.env_reward = 1.0;
  a.worker = "http://127.0.0.1:8002";
  return g;
}

TEST(RolloutLog, AMultiTurnSamplesLineHoldsItsTurnsTokenSplitVersionsAndEnvReward) {
  const auto j = rollout_record(multi_turn_group(5));
  EXPECT_EQ(j["messages"], nlohmann::json::parse(R"([{"role": "system", "content": "add"},
                                                     {"role": "user", "content": "3+4="}])"));
  EXPECT_EQ(j["prompt"], "system: add\nuser: 3+4=");
  EXPECT_EQ(j["info"]["tries"], 2);
  const auto& s = j["samples"][0];
  ASSERT_EQ(s["turns"].size(), 3u);
  EXPECT_EQ(s["turns"][1], nlohmann::json::parse(R"({"role": "user", "content": "wrong, try again"})"));
  EXPECT_EQ(s["tokens"], 6);
  EXPECT_EQ(s["model_tokens"], 3);
  EXPECT_EQ(s["env_tokens"], 3);
  EXPECT_EQ(s["turn_versions"], nlohmann::json::parse("[10, 11]"));
  EXPECT_EQ(s["env_reward"], 1.0);
  EXPECT_EQ(s["worker"], "http://127.0.0.1:8002");  // differs from the group's
  // A single-turn sample has none of these.
  const auto& b = j["samples"][1];
  for (const char* key : {"turns", "model_tokens", "env_tokens", "turn_versions", "env_reward", "worker"})
    EXPECT_FALSE(b.contains(key)) << key;
  EXPECT_FALSE(rollout_record(scored_group(1)).contains("messages"));
  EXPECT_FALSE(rollout_record(scored_group(1)).contains("info"));
}

TEST(RolloutLog, ASplitTrajectorysLineSaysSoWithEachPiecesTokenCounts) {
  auto g = multi_turn_group(5);
  auto& c = g.completions[0];
  TrajectorySegment first;
  first.prompt_tokens = {1, 2, 3, 4};
  first.completion_tokens = {7, 8, 9, 10};
  first.loss_mask = {1, 1, 0, 0};
  c.split_segments = {first};
  c.prompt_tokens = {1, 2, 3, 4, 7, 8, 9, 10, 11};
  const auto j = rollout_record(g);
  const auto& s = j["samples"][0];
  ASSERT_TRUE(s.contains("segments"));
  EXPECT_EQ(s["segments"], nlohmann::json::parse(R"([{"prompt_tokens": 4, "tokens": 4},
                                                     {"prompt_tokens": 9, "tokens": 6}])"));
  EXPECT_EQ(s["tokens"], 10);  // the whole trajectory's
  EXPECT_EQ(s["model_tokens"], 5);
  EXPECT_EQ(s["env_tokens"], 5);
  EXPECT_FALSE(j["samples"][1].contains("segments"));  // an unsplit one says nothing
}

TEST(RolloutLog, ALineReadsBackAsTheTaskAndTheSamplesRewardModulesSee) {
  const auto back = parse_rollout_record(nlohmann::json::parse(
      rollout_record(multi_turn_group(5)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
  ASSERT_TRUE(back) << back.error().what();
  EXPECT_EQ(back->task.id, "c1");
  EXPECT_EQ(back->task.env, "arithmetic_retry");
  EXPECT_TRUE(back->task.is_chat());
  EXPECT_EQ(back->task.messages.size(), 2u);
  EXPECT_EQ(back->task.answer, "7");
  EXPECT_EQ(back->task.info["tries"], 2);
  ASSERT_EQ(back->samples.size(), 2u);
  const auto& a = back->samples[0];
  EXPECT_EQ(a.task_id, "c1");
  EXPECT_EQ(a.sample_index, 0);
  EXPECT_EQ(a.text, "7");
  EXPECT_EQ(a.completion_tokens.size(), 6u);  // the count; the ids are not stored
  EXPECT_EQ(a.finish_reason, FinishReason::kStop);
  EXPECT_EQ(a.version_spans, (std::vector<VersionSpan>{{10, 0}, {11, 1}}));
  EXPECT_EQ(a.turns.size(), 3u);
  EXPECT_EQ(a.turn_versions, (std::vector<Version>{10, 11}));
  EXPECT_EQ(a.env_reward, 1.0);
  EXPECT_EQ(back->samples[1].sample_index, 1);
  EXPECT_EQ(back->samples[1].finish_reason, FinishReason::kLength);
  EXPECT_FALSE(back->samples[1].env_reward);

  const auto plain = parse_rollout_record(rollout_record(scored_group(3)));
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->task.prompt, "3+4=");

  const auto bad = parse_rollout_record(nlohmann::json::parse(R"({"task_id": "x", "prompt": "p", "samples": [{}]})"));
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().what().find("completion"), std::string::npos) << bad.error().what();
  EXPECT_FALSE(parse_rollout_record(nlohmann::json::parse("[1]")));
}

TEST(RolloutLog, KeepsTheNewestSamplesOfEveryGroupForTheLivePageNewestFirst) {
  RolloutLog log;  // off: the live page's rows are kept anyway
  for (std::uint64_t id = 1; id <= 11; ++id) {
    auto g = scored_group(id);
    g.completions[0].text = std::string(1000, 'x') + "\xc3\xa9";
    log.add(g, 1.0);
  }
  const auto rows = log.recent();
  ASSERT_EQ(rows.size(), RolloutLog::kRecentSamples);
  EXPECT_EQ(rows[0]["group"], 11);  // newest first: group 11's second sample, then its first
  EXPECT_EQ(rows[0]["sample"], 1);
  EXPECT_EQ(rows[1]["sample"], 0);
  EXPECT_EQ(rows.back()["group"], 2);
  const auto& r = rows[1];
  EXPECT_EQ(r["step"], 12);
  EXPECT_EQ(r["version"], 10);
  EXPECT_EQ(r["worker"], "http://127.0.0.1:8001");
  EXPECT_EQ(r["prompt"], "3+4=");
  EXPECT_EQ(r["reward"], 1.0);
  EXPECT_EQ(r["finish_reason"], "stop");
  EXPECT_EQ(r["completion"], std::string(RolloutLog::kRowChars, 'x') + "...");
  EXPECT_FALSE(r.contains("turns"));

  log.add(multi_turn_group(12), 2.0);
  const auto mt = log.recent()[1];
  ASSERT_EQ(mt["turns"].size(), 3u);
  EXPECT_EQ(mt["turns"][2]["content"], "7");
  EXPECT_EQ(mt["worker"], "http://127.0.0.1:8002");
  EXPECT_EQ(mt["prompt"], "system: add\nuser: 3+4=");
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
