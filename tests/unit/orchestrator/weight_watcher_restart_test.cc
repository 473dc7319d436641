// WeightWatcher::restarted(), what `arlo run` calls once a restarted worker answers: the worker
// holds no weights, so the current version is synced to it at once, whether it was left out of the
// updates yet or not (a probe would take up to probe_interval; a worker never left out would get
// nothing until the next version). Real orchestrator, fake ports, fake clock.
#include <gtest/gtest.h>

#include <algorithm>

#include "orchestrator/orchestrator.h"
#include "tests/unit/orchestrator/fakes.h"

namespace arlo::orch {
namespace {

using namespace testing;

struct Loop {
  FakeClock clock;
  asio::io_context io;
  FakeInference inf{io.get_executor()};
  FakeTasks tasks;
  FakeScorer scorer;
  FakeTrainer trainer{io.get_executor()};
  Options opt;
  std::unique_ptr<Orchestrator> orch;

  Loop() {
    opt.batch_size = 4;
    opt.group_size = 2;
    opt.max_steps = 10;
    opt.log_interval_s = 1000;
    opt.console = false;
    opt.eval_at_start = false;
    opt.eval_at_end = false;
    opt.admin_timeout = std::chrono::seconds(5);
    opt.admin_attempts = 2;
    opt.admin_backoff = std::chrono::seconds(1);
    orch = std::make_unique<Orchestrator>(io, Ports{&inf, &tasks, &scorer, &trainer, &clock, {}}, opt);
    auto st = orch->start();
    EXPECT_TRUE(st) << (st ? "" : st.error().what());
    settle();
  }
  ~Loop() { orch.reset(); }
  void settle() {
    do {
      io.restart();
    } while (io.poll() > 0);
  }
  bool run_until(const std::function<bool()>& pred, int max_rounds = 200000) {
    for (int i = 0; i < max_rounds; ++i) {
      settle();
      if (pred()) return true;
      if (!clock.fire_next()) return pred();
    }
    return pred();
  }
  long calls(const std::string& what) const { return std::count(inf.log.begin(), inf.log.end(), what); }
  WeightWatcher& watcher() { return orch->weight_watcher(); }
};

TEST(WeightWatcherRestart, AWorkerThatWasNotLeftOutIsSyncedTheCurrentVersionAgain) {
  Loop r;
  r.trainer.publish(1);
  ASSERT_TRUE(r.run_until([&] { return r.watcher().synced() == 1 && !r.watcher().syncing(); }, 1000));
  ASSERT_EQ(r.calls("update(v1) w1"), 1);
  ASSERT_TRUE(r.watcher().left_out().empty());
  r.watcher().restarted("w1");
  r.settle();  // no time passes: the resync starts at once
  EXPECT_EQ(r.calls("update(v1) w1"), 2);
  EXPECT_EQ(r.calls("pause(keep) w1"), 2);
  EXPECT_EQ(r.calls("resume w1"), 2);
  EXPECT_EQ(r.watcher().synced(), 1);
  EXPECT_FALSE(r.watcher().syncing());
}

TEST(WeightWatcherRestart, ALeftOutWorkerRejoinsAtOnceAndItsProbeEnds) {
  Loop r;
  r.inf.hang_pause = {"w1"};  // dead: it answers nothing
  r.trainer.publish(1);
  ASSERT_TRUE(r.run_until([&] { return r.watcher().synced() == 1 && !r.watcher().syncing(); }, 1000));
  ASSERT_EQ(r.watcher().left_out(), (std::set<std::string>{"w1"}));
  // Restarted: it answers again and arlo run says so before any probe came.
  r.inf.hang_pause.clear();
  const auto probes = r.calls("weights w1");
  r.watcher().restarted("w1");
  r.settle();
  EXPECT_TRUE(r.watcher().left_out().empty());
  EXPECT_EQ(r.calls("update(v1) w1"), 1) << "synced without waiting for a probe";
  EXPECT_EQ(r.calls("weights w1"), probes);
  // Its probe ends instead of probing a worker that is back.
  r.run_until([] { return false; }, 50);
  EXPECT_EQ(r.calls("weights w1"), probes);
  EXPECT_EQ(r.calls("update(v1) w1"), 1);
}

}  // namespace
}  // namespace arlo::orch
