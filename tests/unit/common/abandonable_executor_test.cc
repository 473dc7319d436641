// AbandonableExecutor on a FakeClock: a call that overruns its timeout is abandoned exactly when the
// test moves time past it (never by a real-time window), its thread is replaced, and a late result
// is discarded. The calls themselves run on real threads; the test waits for them on conditions
// with a generous bound, never for time to pass.
#include "common/async/abandonable_executor.h"

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <optional>
#include <thread>
#include <utility>

#include "common/async/fake_clock.h"
#include "common/result.h"

namespace arlo {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;

// Polls `cond` (running the loop's ready handlers in between) until it holds or 30 s pass.
bool eventually(asio::io_context& io, const std::function<bool()>& cond) {
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (!cond()) {
    io.poll();
    io.restart();
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// Starts executor.run(fn) on `io`; the result lands in `out` on the loop's thread.
template <typename F>
void start(asio::io_context& io, AbandonableExecutor& executor, F fn, Clock::duration timeout,
           std::optional<Result<int>>& out) {
  asio::co_spawn(io, executor.run<int>(io, std::move(fn), timeout), [&out](std::exception_ptr e, Result<int> r) {
    if (e) std::rethrow_exception(e);
    out.emplace(std::move(r));
  });
}

// A one-thread executor whose timeouts run on a FakeClock, driven from this thread's io_context.
struct OneThread {
  asio::io_context io;
  FakeClock clock;
  AbandonableExecutor executor;
  explicit OneThread(std::size_t max_abandoned)
      : executor({.threads = 1, .max_abandoned = max_abandoned, .clock = &clock}) {}

  // Runs a call that returns `value` at once: its result, or nullopt when none came within 30 s.
  std::optional<Result<int>> call(int value, Clock::duration timeout) {
    std::optional<Result<int>> out;
    start(
        io, executor, [value] { return Result<int>(value); }, timeout, out);
    if (!eventually(io, [&] { return out.has_value(); })) return std::nullopt;
    return out;
  }
};

// A call that holds its executor thread until release(): hold() starts it and returns once it runs.
// Released at the latest when it goes out of scope, so a failed assertion leaves no thread stuck.
struct StuckCall {
  std::atomic<bool> inside{false};
  std::promise<void> releaser;
  std::shared_future<void> released = releaser.get_future().share();
  bool was_released = false;
  std::optional<Result<int>> out;

  ~StuckCall() { release(); }

  [[nodiscard]] bool hold(OneThread& t, Clock::duration timeout) {
    start(
        t.io, t.executor,
        [&inside = inside, released = released] {
          inside = true;
          released.wait();
          return Result<int>(1);
        },
        timeout, out);
    return eventually(t.io, [this] { return inside.load(); });
  }
  void release() {
    if (!std::exchange(was_released, true)) releaser.set_value();
  }
};

TEST(AbandonableExecutor, ResultBeforeTheTimeoutIsDelivered) {
  OneThread t(4);
  const auto out = t.call(7, 300ms);
  ASSERT_TRUE(out.has_value()) << "no result within 30 s";
  ASSERT_TRUE(*out) << out->error().what();
  EXPECT_EQ(**out, 7);
  EXPECT_EQ(t.clock.pending(), 0u);  // the timeout was cancelled with the result
  EXPECT_EQ(t.executor.timeouts(), 0u);
}

TEST(AbandonableExecutor, HungCallIsAbandonedWhenTheClockPassesItsTimeout) {
  OneThread t(4);
  StuckCall stuck;
  ASSERT_TRUE(stuck.hold(t, 300ms));
  const std::optional<Result<int>>& hung = stuck.out;

  t.clock.advance(299ms);
  t.io.poll();
  t.io.restart();
  EXPECT_FALSE(hung.has_value()) << "abandoned before its timeout";
  t.clock.advance(1ms);
  ASSERT_TRUE(eventually(t.io, [&] { return hung.has_value(); }));
  ASSERT_FALSE(*hung);
  EXPECT_EQ(hung->error().code(), ErrorCode::kTimeout);
  EXPECT_NE(hung->error().message().find("300 ms"), std::string::npos) << hung->error().message();
  EXPECT_EQ(t.executor.abandoned(), 1u);
  EXPECT_EQ(t.executor.timeouts(), 1u);

  // The stuck thread was replaced: the one-thread executor still serves a call.
  const auto next = t.call(2, 300ms);
  ASSERT_TRUE(next.has_value()) << "no result within 30 s";
  ASSERT_TRUE(*next) << next->error().what();
  EXPECT_EQ(**next, 2);

  // The stuck call returns late: its result is discarded and its thread leaves.
  stuck.release();
  ASSERT_TRUE(eventually(t.io, [&] { return t.executor.abandoned() == 0; }));
  EXPECT_EQ(hung->error().code(), ErrorCode::kTimeout);
}

TEST(AbandonableExecutor, TooManyStuckCallsFailFast) {
  OneThread t(1);
  StuckCall stuck;
  ASSERT_TRUE(stuck.hold(t, 1s));
  t.clock.advance(1s);
  ASSERT_TRUE(eventually(t.io, [&] { return stuck.out.has_value(); }));
  ASSERT_EQ(t.executor.abandoned(), 1u);

  const auto refused = t.call(3, 1s);
  ASSERT_TRUE(refused.has_value()) << "no answer within 30 s";
  ASSERT_FALSE(*refused);
  EXPECT_EQ(refused->error().code(), ErrorCode::kResourceExhausted) << refused->error().message();

  stuck.release();
  ASSERT_TRUE(eventually(t.io, [&] { return t.executor.abandoned() == 0; }));
}

}  // namespace
}  // namespace arlo
