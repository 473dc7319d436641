// Reward plugins loaded with dlopen and run by RewardScorer: the version check, and the failure
// policy for plugins that throw, fail, return NaN or hang past their timeout.
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <chrono>
#include <cmath>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>

#include "common/async/fake_clock.h"
#include "rollout/reward_plugin_loader.h"
#include "rollout/reward_scorer.h"
#include "tests/unit/rollout/rollout_test_util.h"

namespace arlo::rollout {
namespace {

using test::run;

// The test plugin's hooks, looked up in the already-loaded library (RTLD_NOLOAD keeps one copy).
template <typename Fn>
Fn hook(const char* name) {
  void* h = dlopen(ARLO_TEST_PLUGIN_PATH, RTLD_NOW | RTLD_NOLOAD);
  if (!h) return nullptr;
  auto fn = reinterpret_cast<Fn>(dlsym(h, name));
  dlclose(h);
  return fn;
}

using test::group;
using test::task;

std::shared_ptr<RewardModule> load(const std::string& mode) {
  auto m = make_reward_module({{"kind", "plugin"}, {"path", ARLO_TEST_PLUGIN_PATH}, {"config", mode}});
  EXPECT_TRUE(m) << (m ? "" : m.error().what());
  return m ? std::shared_ptr<RewardModule>(std::move(*m)) : nullptr;
}

TEST(RewardPlugin, ScoresThroughTheCAbi) {
  auto m = load("ok");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->name(), "test_plugin");
  auto s = m->score(task(), group({"68"})[0]);
  ASSERT_TRUE(s) << s.error().what();
  EXPECT_EQ(s->reward, 1.0);
  EXPECT_EQ(s->metrics.at("len"), 2.0);
  EXPECT_EQ(m->score(task(), group({"67"})[0])->reward, 0.0);
}

TEST(RewardPlugin, VersionMismatchAndLoadErrorsAreClear) {
  auto r = load_reward_plugin(ARLO_TEST_PLUGIN_ABI99_PATH, "ok");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kMismatch);
  EXPECT_NE(r.error().what().find("ABI version 99"), std::string::npos) << r.error().what();
  EXPECT_NE(r.error().what().find("rebuild"), std::string::npos);

  r = load_reward_plugin("/nonexistent/libnothing.so", "");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kNotFound);

  r = load_reward_plugin(ARLO_TEST_PLUGIN_PATH, "reject");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find("refuses to start"), std::string::npos) << r.error().what();
}

// Runs one group of three through a scorer with `policy` and returns the status.
Status score_with(const std::string& mode, FailurePolicy policy, std::vector<Rollout>& g, ScorerStats* stats = nullptr,
                  Duration timeout = std::chrono::seconds(10)) {
  boost::asio::io_context io;
  Status result = ok();
  {
    RewardScorer scorer(
        io, load(mode),
        {.timeout = timeout, .on_failure = policy, .assign_value = -1.0, .threads = 2, .max_abandoned = 16});
    run(io, [&]() -> boost::asio::awaitable<void> { result = co_await scorer.score_group(task(), g); }());
    if (stats) *stats = scorer.stats();
  }
  test::drain(io);
  return result;
}

TEST(RewardScorer, ThrowingPluginFollowsEachPolicy) {
  auto g = group({"68", "1"});
  ScorerStats st;
  ASSERT_TRUE(score_with("throw", FailurePolicy::kAssign, g, &st));
  EXPECT_EQ(g[0].reward, -1.0);
  EXPECT_EQ(g[0].metrics.at("reward/failed"), 1.0);
  EXPECT_EQ(st.failed, 2u);
  EXPECT_EQ(st.assigned, 2u);

  g = group({"68", "1"});
  ASSERT_TRUE(score_with("throw", FailurePolicy::kDrop, g, &st));
  EXPECT_FALSE(g[0].reward.has_value());
  EXPECT_FALSE(g[1].reward.has_value());
  EXPECT_EQ(st.dropped, 2u);

  g = group({"68"});
  auto s = score_with("throw", FailurePolicy::kFail, g);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().what().find("plugin exploded on purpose"), std::string::npos) << s.error().what();
  EXPECT_NE(s.error().what().find("task t-7 sample 0"), std::string::npos) << s.error().what();
}

TEST(RewardScorer, ErrorAndNanResultsAreFailures) {
  auto g = group({"68"});
  ScorerStats st;
  ASSERT_TRUE(score_with("nan", FailurePolicy::kAssign, g, &st));
  EXPECT_EQ(g[0].reward, -1.0);
  EXPECT_EQ(st.non_finite, 1u);
  g = group({"68"});
  auto s = score_with("nan", FailurePolicy::kFail, g);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().what().find("non-finite"), std::string::npos);

  g = group({"68"});
  s = score_with("error", FailurePolicy::kFail, g);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().what().find("cannot score task t-7"), std::string::npos) << s.error().what();
  g = group({"68"});
  ASSERT_TRUE(score_with("error", FailurePolicy::kDrop, g));
  EXPECT_FALSE(g[0].reward);
}

TEST(RewardScorer, OkPluginScoresTheWholeGroup) {
  auto g = group({"68", "67", "68"});
  ScorerStats st;
  ASSERT_TRUE(score_with("ok", FailurePolicy::kFail, g, &st));
  EXPECT_EQ(g[0].reward, 1.0);
  EXPECT_EQ(g[1].reward, 0.0);
  EXPECT_EQ(g[2].reward, 1.0);
  EXPECT_EQ(st.scored, 3u);
}

// Keep last: leaves hung threads until the release hook lets them go.
TEST(RewardScorer, HangingPluginTimesOutWithoutBlockingTheLoopOrShutdown) {
  // Hold our own reference so the hooks stay callable after arlo closes its handle.
  void* keep = dlopen(ARLO_TEST_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_TRUE(keep);
  auto hung = hook<int (*)()>("arlo_test_plugin_hung");
  ASSERT_TRUE(hung);
  boost::asio::io_context io;
  // The 300 ms timeout runs on a FakeClock: once `n` calls are inside the plugin (the test waits for
  // that, bounded), it moves time past the timeout. So the timeout fires on calls that really hang,
  // however slowly a starved machine starts them, and no real-time window is waited out.
  FakeClock clock;
  auto time_out_once_hung = [&](int n) {
    boost::asio::co_spawn(
        io,
        [&, n]() -> boost::asio::awaitable<void> {
          EXPECT_TRUE(co_await test::eventually([&] { return hung() >= n; }, std::chrono::seconds(30)));
          boost::asio::post(io, [&] { clock.advance(std::chrono::milliseconds(300)); });
        },
        boost::asio::detached);
  };
  int ticks = 0;  // proves the loop kept running while the plugin hung
  auto g = group({"68", "68"});
  Status result = ok();
  ScorerStats st;
  std::size_t abandoned = 0;
  {
    RewardScorer scorer(io, load("hang"),
                        {.timeout = std::chrono::milliseconds(300),
                         .on_failure = FailurePolicy::kAssign,
                         .assign_value = 0.25,
                         .threads = 2,
                         .max_abandoned = 16,
                         .clock = &clock});
    run(io, [&]() -> boost::asio::awaitable<void> {
      boost::asio::co_spawn(
          io,
          [&]() -> boost::asio::awaitable<void> {
            for (int i = 0; i < 1000 && !st.calls; ++i) {
              ++ticks;
              co_await test::sleep_for(std::chrono::milliseconds(10));
            }
          },
          boost::asio::detached);
      time_out_once_hung(2);
      result = co_await scorer.score_group(task(), g);
      st = scorer.stats();
    }());
    // The group ends on the timeout: the plugin is still stuck.
    EXPECT_EQ(hung(), 2);
    // A second group still gets service: stuck threads were replaced.
    auto g2 = group({"68"});
    run(io, [&]() -> boost::asio::awaitable<void> {
      time_out_once_hung(3);
      co_await scorer.score_group(task(), g2);
    }());
    EXPECT_EQ(hung(), 3);
    EXPECT_EQ(g2[0].reward, 0.25);
    abandoned = scorer.stats().timeouts;
  }  // scorer destroyed while three calls still hang: must return, not join
  ASSERT_TRUE(result) << result.error().what();
  EXPECT_EQ(g[0].reward, 0.25);
  EXPECT_EQ(g[1].reward, 0.25);
  EXPECT_EQ(st.timeouts, 2u);
  EXPECT_EQ(abandoned, 3u);
  EXPECT_GT(ticks, 0);

  // Let the stuck calls return late: their results are discarded, then the instance is destroyed.
  auto returned = hook<int (*)()>("arlo_test_plugin_returned");
  auto destroyed = hook<int (*)()>("arlo_test_plugin_destroyed");
  const auto before = destroyed();
  EXPECT_EQ(returned(), 0);
  hook<void (*)()>("arlo_test_plugin_release")();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while ((returned() < 3 || destroyed() == before) && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(returned(), 3);
  EXPECT_EQ(destroyed(), before + 1);  // the hung instance is destroyed only after its last call returned
  test::drain(io);
  dlclose(keep);
}

}  // namespace
}  // namespace arlo::rollout
