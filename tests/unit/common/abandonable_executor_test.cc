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

TEST(AbandonableExecutor, ResultBeforeTheTimeoutIsDelivered) {
  asio::io_context io;
  FakeClock clock;
  AbandonableExecutor executor({.threads = 1, .max_abandoned = 4, .clock = &clock});
  std::optional<Result<int>> out;
  start(
      io, executor, [] { return Result<int>(7); }, 300ms, out);
  ASSERT_TRUE(eventually(io, [&] { return out.has_value(); }));
  ASSERT_TRUE(*out) << out->error().what();
  EXPECT_EQ(**out, 7);
  EXPECT_EQ(clock.pending(), 0u);  // the timeout was cancelled with the result
  EXPECT_EQ(executor.timeouts(), 0u);
}

TEST(AbandonableExecutor, HungCallIsAbandonedWhenTheClockPassesItsTimeout) {
  asio::io_context io;
  FakeClock clock;
  AbandonableExecutor executor({.threads = 1, .max_abandoned = 4, .clock = &clock});
  std::atomic<bool> inside{false};
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::optional<Result<int>> hung;
  start(
      io, executor,
      [&inside, released] {
        inside = true;
        released.wait();
        return Result<int>(1);
      },
      300ms, hung);
  ASSERT_TRUE(eventually(io, [&] { return inside.load(); }));

  clock.advance(299ms);
  io.poll();
  io.restart();
  EXPECT_FALSE(hung.has_value()) << "abandoned before its timeout";
  clock.advance(1ms);
  ASSERT_TRUE(eventually(io, [&] { return hung.has_value(); }));
  ASSERT_FALSE(*hung);
  EXPECT_EQ(hung->error().code(), ErrorCode::kTimeout);
  EXPECT_NE(hung->error().message().find("300 ms"), std::string::npos) << hung->error().message();
  EXPECT_EQ(executor.abandoned(), 1u);
  EXPECT_EQ(executor.timeouts(), 1u);

  // The stuck thread was replaced: the one-thread executor still serves a call.
  std::optional<Result<int>> next;
  start(
      io, executor, [] { return Result<int>(2); }, 300ms, next);
  ASSERT_TRUE(eventually(io, [&] { return next.has_value(); }));
  ASSERT_TRUE(*next) << next->error().what();
  EXPECT_EQ(**next, 2);

  // The stuck call returns late: its result is discarded and its thread leaves.
  release.set_value();
  ASSERT_TRUE(eventually(io, [&] { return executor.abandoned() == 0; }));
  EXPECT_EQ(hung->error().code(), ErrorCode::kTimeout);
}

TEST(AbandonableExecutor, TooManyStuckCallsFailFast) {
  asio::io_context io;
  FakeClock clock;
  AbandonableExecutor executor({.threads = 1, .max_abandoned = 1, .clock = &clock});
  std::atomic<bool> inside{false};
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::optional<Result<int>> hung;
  start(
      io, executor,
      [&inside, released] {
        inside = true;
        released.wait();
        return Result<int>(1);
      },
      1s, hung);
  ASSERT_TRUE(eventually(io, [&] { return inside.load(); }));
  clock.advance(1s);
  ASSERT_TRUE(eventually(io, [&] { return hung.has_value(); }));
  ASSERT_EQ(executor.abandoned(), 1u);

  std::optional<Result<int>> refused;
  start(
      io, executor, [] { return Result<int>(3); }, 1s, refused);
  ASSERT_TRUE(eventually(io, [&] { return refused.has_value(); }));
  ASSERT_FALSE(*refused);
  EXPECT_EQ(refused->error().code(), ErrorCode::kResourceExhausted) << refused->error().message();

  release.set_value();
  ASSERT_TRUE(eventually(io, [&] { return executor.abandoned() == 0; }));
}

}  // namespace
}  // namespace arlo
