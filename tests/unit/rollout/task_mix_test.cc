// TaskMix (rollout/task_mix.h): the ratio held exactly over time, the pattern it makes, the resume
// cursor of every source, and a one-source mix that is its stream.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include <fmt/format.h>

#include "rollout/task_mix.h"

namespace arlo::rollout {
namespace {

std::shared_ptr<TaskStream> stream(const std::string& env, std::size_t size, std::uint64_t seed = 1,
                                   std::optional<std::uint64_t> epochs = std::nullopt) {
  auto tasks = generated_tasks(env, size, [](Task& t) { t.prompt = t.id; });
  return std::make_shared<TaskStream>(tasks, TaskStream::Options{.seed = seed, .shuffle = true, .epochs = epochs});
}

std::shared_ptr<TaskMix> mix(std::vector<double> ratios, std::uint64_t seed = 1) {
  std::vector<TaskMix::Source> sources;
  for (std::size_t i = 0; i < ratios.size(); ++i)
    sources.push_back({fmt::format("s{}", i), stream(fmt::format("e{}", i), 7 + i, seed + i), ratios[i]});
  auto m = TaskMix::make(std::move(sources));
  EXPECT_TRUE(m) << m.error().message();
  return *m;
}

std::string pattern(TaskMix& m, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += m.next()->env.back();
  return out;
}

TEST(TaskMix, Patterns) {
  EXPECT_EQ(pattern(*mix({1, 1}), 6), "010101");
  EXPECT_EQ(pattern(*mix({2, 1}), 6), "010010");
  EXPECT_EQ(pattern(*mix({0.5, 0.25, 0.25}), 8), "01200120");
}

TEST(TaskMix, EverySourceWithinOneTaskOfItsShareAtAllTimes) {
  for (const auto& ratios : std::vector<std::vector<double>>{{3, 2, 1}, {0.7, 0.2, 0.1}, {1, 1e-3}, {5, 7, 11, 13}}) {
    auto m = mix(ratios);
    double total = 0;
    for (double r : ratios) total += r;
    for (int n = 1; n <= 20000; ++n) {
      ASSERT_TRUE(m->next());
      for (std::size_t i = 0; i < ratios.size(); ++i)
        ASSERT_LT(std::abs(static_cast<double>(m->served()[i]) - n * ratios[i] / total), 1.0)
            << fmt::format("source {} after {} tasks", i, n);
    }
  }
}

TEST(TaskMix, TasksCarryTheirSourceName) {
  auto m = mix({1, 1});
  auto a = m->next();
  auto b = m->next();
  EXPECT_EQ(a->env, "s0");
  EXPECT_EQ(b->env, "s1");
  EXPECT_EQ(a->id.rfind("e0-", 0), 0u);  // ids stay the source's own
}

TEST(TaskMix, ResumeContinuesEverySource) {
  auto a = mix({3, 1, 2});
  for (int i = 0; i < 41; ++i) ASSERT_TRUE(a->next());
  const Json saved = a->cursor();
  auto b = mix({3, 1, 2});
  ASSERT_TRUE(b->restore(saved)) << saved.dump();
  EXPECT_EQ(b->served(), a->served());
  for (int i = 0; i < 100; ++i) {
    auto x = a->next(), y = b->next();
    ASSERT_EQ(x->id, y->id);
    ASSERT_EQ(x->env, y->env);
  }
}

TEST(TaskMix, RestoreRefusesOtherSources) {
  auto a = mix({1, 1});
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(a->next());
  auto other_ratio = mix({1, 2});
  auto st = other_ratio->restore(a->cursor());
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), ErrorCode::kMismatch);
  EXPECT_EQ(other_ratio->served(), (std::vector<std::uint64_t>{0, 0}));
  auto three = mix({1, 1, 1});
  EXPECT_EQ(three->restore(a->cursor()).error().code(), ErrorCode::kMismatch);
  // A source whose own stream differs (another seed): nothing moves.
  auto reseeded = mix({1, 1}, 9);
  auto st2 = reseeded->restore(a->cursor());
  ASSERT_FALSE(st2);
  EXPECT_NE(st2.error().what().find("env.sources[0]"), std::string::npos) << st2.error().what();
  EXPECT_EQ(reseeded->served(), (std::vector<std::uint64_t>{0, 0}));
  // A single-source cursor is not a mix's.
  EXPECT_EQ(a->restore(stream("e0", 7)->cursor()).error().code(), ErrorCode::kMismatch);
  EXPECT_FALSE(a->restore(Json{{"mix", Json::array({1, 2})}}));
}

TEST(TaskMix, OneSourceIsItsStream) {
  auto s = stream("arithmetic", 5);
  TaskMix m(s);
  auto t = m.next();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->env, "arithmetic");
  EXPECT_EQ(m.cursor(), s->cursor());  // checkpoints of single-source runs are unchanged
  TaskMix again(stream("arithmetic", 5));
  ASSERT_TRUE(again.restore(m.cursor()));
  EXPECT_EQ(again.next()->id, m.next()->id);
}

TEST(TaskMix, ExhaustedSourcesLeaveTheMix) {
  std::vector<TaskMix::Source> sources = {{"a", stream("a", 2, 1, 1), 1}, {"b", stream("b", 6, 1, 1), 1}};
  auto m = TaskMix::make(std::move(sources));
  ASSERT_TRUE(m);
  std::map<std::string, int> count;
  while (!(*m)->exhausted()) ++count[(*m)->next()->env];
  EXPECT_EQ(count["a"], 2);
  EXPECT_EQ(count["b"], 6);
  EXPECT_EQ((*m)->next().error().code(), ErrorCode::kNotFound);
}

TEST(TaskMix, RefusesBadSources) {
  EXPECT_FALSE(TaskMix::make({}));
  EXPECT_FALSE(TaskMix::make({{"a", stream("a", 2), 0}}));
  EXPECT_FALSE(TaskMix::make({{"a", stream("a", 2), std::nan("")}}));
  EXPECT_FALSE(TaskMix::make({{"a", nullptr, 1}}));
  auto dup = TaskMix::make({{"a", stream("a", 2), 1}, {"a", stream("b", 2), 1}});
  ASSERT_FALSE(dup);
  EXPECT_NE(dup.error().message().find("two sources are named 'a'"), std::string::npos);
}

}  // namespace
}  // namespace arlo::rollout
