// RestartPolicy, the supervision rule of `arlo run`'s children, on the fake clock: the backoff
// doubles from 0.5 s to its 10 s cap with each restart within the window, the sixth death within
// the window is past the bound, and a child that stays up longer than the window starts over.
#include <gtest/gtest.h>

#include "session/launcher.h"
#include "common/async/fake_clock.h"

namespace arlo::session {
namespace {

using orch::Duration;
using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(RestartPolicy, BackoffDoublesUpToTheCapAndStopsPastTheBound) {
  FakeClock clock;
  RestartPolicy policy;  // the defaults `arlo run` uses: 5 restarts within 10 minutes, 0.5 s .. 10 s
  const std::vector<Duration> expected = {milliseconds(500), seconds(1), seconds(2), seconds(4), seconds(8)};
  for (std::size_t i = 0; i < expected.size(); ++i) {
    auto delay = policy.on_exit(clock.now());
    ASSERT_TRUE(delay) << "restart " << i + 1;
    EXPECT_EQ(*delay, expected[i]) << "restart " << i + 1;
    clock.advance(*delay + seconds(3));  // restarted, then up for 3 s before it dies again
  }
  EXPECT_EQ(policy.recent(clock.now()), 5);
  EXPECT_FALSE(policy.on_exit(clock.now())) << "a sixth death within the window is past the bound";
  EXPECT_EQ(policy.total(), 5);
}

TEST(RestartPolicy, BackoffIsCappedAtTheMaximum) {
  FakeClock clock;
  RestartPolicy policy({.max_restarts = 8,
                        .window = std::chrono::hours(1),
                        .initial_backoff = milliseconds(500),
                        .max_backoff = seconds(10)});
  Duration last{};
  for (int i = 0; i < 8; ++i) {
    auto delay = policy.on_exit(clock.now());
    ASSERT_TRUE(delay);
    last = *delay;
    clock.advance(seconds(1));
  }
  EXPECT_EQ(last, seconds(10)) << "0.5, 1, 2, 4, 8, then 10 s";
  EXPECT_FALSE(policy.on_exit(clock.now()));
}

TEST(RestartPolicy, RestartsOlderThanTheWindowNoLongerCount) {
  FakeClock clock;
  RestartPolicy policy(
      {.max_restarts = 2, .window = seconds(60), .initial_backoff = milliseconds(500), .max_backoff = seconds(10)});
  EXPECT_EQ(policy.on_exit(clock.now()), Duration(milliseconds(500)));
  clock.advance(seconds(30));
  EXPECT_EQ(policy.on_exit(clock.now()), Duration(seconds(1)));
  clock.advance(seconds(10));
  EXPECT_FALSE(policy.on_exit(clock.now())) << "two restarts in the last 40 s";
  // 31 s later the first restart is 71 s old: one restart in the window, the next waits 1 s.
  clock.advance(seconds(31));
  EXPECT_EQ(policy.recent(clock.now()), 1);
  EXPECT_EQ(policy.on_exit(clock.now()), Duration(seconds(1)));
  // A child that then stays up longer than the window starts over from the initial backoff.
  clock.advance(seconds(61));
  EXPECT_EQ(policy.recent(clock.now()), 0);
  EXPECT_EQ(policy.on_exit(clock.now()), Duration(milliseconds(500)));
  EXPECT_EQ(policy.total(), 4);
}

}  // namespace
}  // namespace arlo::session
