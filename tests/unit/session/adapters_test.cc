// The rollout adapters hand the orchestrator the environment's tasks as they are (one Task type,
// common/vocabulary.h): the task source adds only token ids, and the scorer gives reward modules the
// very task the environment made, id and info untouched.
#include <gtest/gtest.h>

#include <mutex>
#include <set>

#include "session/adapters/rollout_adapters.h"
#include "tests/unit/rollout/rollout_test_util.h"

namespace arlo::session::adapters {
namespace {

using orch::ScoredGroup;

using rollout::test::sample_chat_task;
using rollout::test::sample_completion_task;

std::shared_ptr<rollout::TaskStream> stream() {
  auto source = std::make_shared<rollout::VectorTaskSet>(
      "mixed", std::vector<Task>{sample_completion_task(), sample_chat_task()});
  return std::make_shared<rollout::TaskStream>(source, rollout::TaskStream::Options{.shuffle = false});
}

// Token ids, where a run wants them, are session::RunTasks' (tests/unit/session/run_tasks_test.cc).
TEST(Adapters, TaskSourceHandsOutTheEnvironmentsTasksAsTheyAre) {
  RolloutTasks tasks(stream());
  auto first = tasks.next();
  ASSERT_TRUE(first) << first.error().what();
  EXPECT_EQ(*first, sample_completion_task());
  auto second = tasks.next();
  ASSERT_TRUE(second) << second.error().what();
  EXPECT_EQ(*second, sample_chat_task());
  EXPECT_EQ(tasks.cursor().at("seq"), 2u);
}

TEST(Adapters, TaskSourceResumesFromItsCursor) {
  RolloutTasks tasks(stream());
  ASSERT_TRUE(tasks.next());
  const auto cursor = tasks.cursor();
  RolloutTasks resumed(stream());
  ASSERT_TRUE(resumed.restore(cursor));
  auto next = resumed.next();
  ASSERT_TRUE(next) << next.error().what();
  EXPECT_EQ(next->id, "q-8");
  EXPECT_EQ(resumed.cursor().at("seq"), 2u);
  auto bad = resumed.restore({{"stream", cursor.at("stream")}});
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), ErrorCode::kParse);
}

// Records the tasks and rollouts it is asked to score; reward 1 for the reference answer.
class RecordingModule final : public rollout::RewardModule {
 public:
  const std::string& name() const override { return name_; }
  Result<rollout::Score> score(const Task& task, const rollout::Rollout& r) override {
    std::lock_guard lock(mu);
    tasks.push_back(task);
    task_ids.push_back(r.task_id);
    seen.push_back(&r);
    return rollout::Score{r.text == task.answer ? 1.0 : 0.0, {}};
  }
  std::mutex mu;
  std::vector<Task> tasks;
  std::vector<std::string> task_ids;
  std::vector<const rollout::Rollout*> seen;  // the samples it was handed, by address

 private:
  std::string name_ = "recording";
};

TEST(Adapters, ScorerGivesRewardModulesTheEnvironmentsTask) {
  boost::asio::io_context io;
  auto module = std::make_shared<RecordingModule>();
  Result<ScoredGroup> scored = make_error(ErrorCode::kInternal, "not scored");
  {
    rollout::RewardScorer reward(io, module, {.timeout = std::chrono::seconds(30), .threads = 1});
    RolloutScorer scorer(reward, rollout::AdvantageOptions{});
    auto task = std::make_shared<const Task>(sample_completion_task());
    auto completions = std::make_shared<std::vector<Sample>>(2);
    (*completions)[0].text = "5";
    (*completions)[1].text = "3";
    for (auto& c : *completions) c.task_id = task->id;  // the dispatcher names each sample by its task
    rollout::test::run(io,
                       [&]() -> boost::asio::awaitable<void> { scored = co_await scorer.score(task, completions); }());
  }
  rollout::test::drain(io);
  ASSERT_TRUE(scored) << scored.error().what();
  EXPECT_EQ(scored->rewards, (std::vector<double>{1.0, 0.0}));
  std::lock_guard lock(module->mu);
  ASSERT_EQ(module->tasks.size(), 2u);
  for (const auto& t : module->tasks) EXPECT_EQ(t, sample_completion_task());
  EXPECT_EQ(module->task_ids, (std::vector<std::string>{"arithmetic-7", "arithmetic-7"}));
}

// One sample, no copies: the reward modules read the orchestrator's samples where they lie (the
// scorer's threads share the group), and the scores come back beside them.
TEST(Adapters, ScorerHandsRewardModulesTheSamplesThemselves) {
  boost::asio::io_context io;
  auto module = std::make_shared<RecordingModule>();
  auto completions = std::make_shared<std::vector<Sample>>(3);
  const char* texts[] = {"5", "3", "5"};
  for (int i = 0; i < 3; ++i) (*completions)[i].text = texts[i];
  Result<ScoredGroup> scored = make_error(ErrorCode::kInternal, "not scored");
  {
    rollout::RewardScorer reward(io, module, {.timeout = std::chrono::seconds(30), .threads = 2});
    RolloutScorer scorer(reward, rollout::AdvantageOptions{});
    auto task = std::make_shared<const Task>(sample_completion_task());
    rollout::test::run(io,
                       [&]() -> boost::asio::awaitable<void> { scored = co_await scorer.score(task, completions); }());
  }
  rollout::test::drain(io);
  ASSERT_TRUE(scored) << scored.error().what();
  EXPECT_EQ(scored->rewards, (std::vector<double>{1.0, 0.0, 1.0}));
  std::lock_guard lock(module->mu);
  std::set<const rollout::Rollout*> seen(module->seen.begin(), module->seen.end());
  EXPECT_EQ(seen, (std::set<const rollout::Rollout*>{&(*completions)[0], &(*completions)[1], &(*completions)[2]}));
  for (const auto& c : *completions) EXPECT_FALSE(c.reward.has_value());  // the group itself is left as it was
}

// orchestrator.overlong reaches the orchestrator: a completion cut off by max_tokens is dropped or
// masked as the estimator decided (it used to come back as a trained sample with advantage 0).
TEST(Adapters, ScorerGivesCutOffCompletionsTheirOverlongFate) {
  auto fates = [](rollout::TruncationPolicy policy) {
    boost::asio::io_context io;
    auto module = std::make_shared<RecordingModule>();
    Result<ScoredGroup> scored = make_error(ErrorCode::kInternal, "not scored");
    {
      rollout::RewardScorer reward(io, module, {.timeout = std::chrono::seconds(30), .threads = 1});
      RolloutScorer scorer(reward, rollout::AdvantageOptions{.truncated = policy});
      auto task = std::make_shared<const Task>(sample_completion_task());
      auto completions = std::make_shared<std::vector<Sample>>(3);
      const char* texts[] = {"5", "3", "55555"};
      for (int i = 0; i < 3; ++i) {
        (*completions)[i].text = texts[i];
        (*completions)[i].finish_reason = i == 2 ? FinishReason::kLength : FinishReason::kStop;
      }
      rollout::test::run(
          io, [&]() -> boost::asio::awaitable<void> { scored = co_await scorer.score(task, completions); }());
    }
    rollout::test::drain(io);
    EXPECT_TRUE(scored) << scored.error().what();
    if (scored && policy != rollout::TruncationPolicy::kKeep) {
      EXPECT_EQ(scored->advantages.at(2), 0.0);
    }
    return scored ? scored->fates : std::vector<SampleFate>{};
  };
  using enum SampleFate;
  EXPECT_EQ(fates(rollout::TruncationPolicy::kDrop), (std::vector<SampleFate>{kTrain, kTrain, kDropped}));
  EXPECT_EQ(fates(rollout::TruncationPolicy::kMask), (std::vector<SampleFate>{kTrain, kTrain, kMasked}));
  EXPECT_EQ(fates(rollout::TruncationPolicy::kKeep), (std::vector<SampleFate>{kTrain, kTrain, kTrain}));
}

}  // namespace
}  // namespace arlo::session::adapters
