// ThreadPool: work runs on pool threads, results come back on the io_context's thread, both as a
// callback (run_then) and as a coroutine (co_await run), and the loop stays alive while results
// are on their way.
#include "common/async/thread_pool.h"

#include <gtest/gtest.h>

#include <boost/asio/detached.hpp>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "common/result.h"

namespace arlo {
namespace {

namespace asio = boost::asio;

TEST(ThreadPool, SizeIsAtLeastOne) {
  EXPECT_EQ(ThreadPool(0).size(), 1u);
  EXPECT_EQ(ThreadPool(3).size(), 3u);
}

TEST(ThreadPool, RunThenRunsWorkOnPoolAndDoneOnLoop) {
  ThreadPool pool(2);
  asio::io_context loop;
  const auto loop_thread = std::this_thread::get_id();
  std::thread::id work_thread, done_thread;
  int result = 0;
  pool.run_then(
      loop,
      [&] {
        work_thread = std::this_thread::get_id();
        return 6 * 7;
      },
      [&](int r) {
        done_thread = std::this_thread::get_id();
        result = r;
      });
  // No other work keeps `loop` alive: run() must still wait for the posted result.
  loop.run();
  EXPECT_EQ(result, 42);
  EXPECT_NE(work_thread, loop_thread);
  EXPECT_EQ(done_thread, loop_thread);
}

TEST(ThreadPool, VoidWorkAndMoveOnlyResults) {
  ThreadPool pool(1);
  asio::io_context loop;
  bool void_done = false;
  std::unique_ptr<int> moved;
  pool.run_then(
      loop, [] {}, [&] { void_done = true; });
  pool.run_then(
      loop, [] { return std::make_unique<int>(7); }, [&](std::unique_ptr<int> p) { moved = std::move(p); });
  loop.run();
  EXPECT_TRUE(void_done);
  ASSERT_NE(moved, nullptr);
  EXPECT_EQ(*moved, 7);
}

TEST(ThreadPool, ManyTasksAllReportBackOnTheLoopThread) {
  ThreadPool pool(4);
  asio::io_context loop;
  const auto loop_thread = std::this_thread::get_id();
  long long sum = 0;
  int callbacks = 0;
  bool all_on_loop = true;
  for (int i = 1; i <= 500; ++i) {
    pool.run_then(
        loop, [i] { return static_cast<long long>(i) * i; },
        [&](long long sq) {
          // Only the loop thread touches these: no locks needed, which is the point.
          all_on_loop = all_on_loop && std::this_thread::get_id() == loop_thread;
          sum += sq;
          ++callbacks;
        });
  }
  loop.run();
  EXPECT_EQ(callbacks, 500);
  EXPECT_EQ(sum, 500LL * 501 * 1001 / 6);
  EXPECT_TRUE(all_on_loop);
}

TEST(ThreadPool, CoroutineRunResumesOnTheLoop) {
  ThreadPool pool(2);
  asio::io_context loop;
  const auto loop_thread = std::this_thread::get_id();
  std::vector<int> results;
  bool resumed_on_loop = true;
  asio::co_spawn(
      loop,
      [&]() -> asio::awaitable<void> {
        for (int i = 0; i < 5; ++i) {
          std::thread::id worker;
          int r = co_await pool.run(loop, [i, &worker] {
            worker = std::this_thread::get_id();
            return i * 10;
          });
          resumed_on_loop = resumed_on_loop && std::this_thread::get_id() == loop_thread && worker != loop_thread;
          results.push_back(r);
        }
        // Errors travel as values through the pool too.
        Result<int> bad = co_await pool.run(
            loop, []() -> Result<int> { return make_error(ErrorCode::kInvalidArgument, "bad input"); });
        EXPECT_FALSE(bad);
        EXPECT_EQ(bad.error().message(), "bad input");
        auto owned = co_await pool.run(loop, [] { return std::make_unique<int>(5); });
        results.push_back(*owned);
      },
      asio::detached);
  loop.run();
  EXPECT_EQ(results, (std::vector<int>{0, 10, 20, 30, 40, 5}));
  EXPECT_TRUE(resumed_on_loop);
}

TEST(ThreadPool, StopWaitsForQueuedWorkAndIsIdempotent) {
  std::atomic<int> done{0};
  ThreadPool pool(2);
  for (int i = 0; i < 50; ++i) pool.post([&done] { done.fetch_add(1); });
  pool.stop();
  EXPECT_EQ(done.load(), 50);
  pool.stop();  // second call is a no-op, and so is the destructor's
}

}  // namespace
}  // namespace arlo
