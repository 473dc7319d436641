// run_on(): work hops to another io_context's thread and its result comes back to the caller's.
#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>

#include <thread>

#include "common/async/coro.h"
#include "common/async/io_thread.h"

namespace arlo {
namespace {

namespace asio = boost::asio;

TEST(RunOn, RunsElsewhereAndResumesTheCallerOnItsOwnThread) {
  asio::io_context loop;
  IoThread network;
  const auto loop_thread = std::this_thread::get_id();
  std::thread::id ran_on, resumed_on;
  int result = 0;
  spawn(loop.get_executor(), [&]() -> Awaitable<void> {
    auto op = run_on<int>(network.executor(), [&]() -> Awaitable<int> {
      ran_on = std::this_thread::get_id();
      co_return 42;
    });
    result = co_await std::move(op);
    resumed_on = std::this_thread::get_id();
  });
  loop.run();  // returns once the caller finished: the result was posted back to this loop
  EXPECT_EQ(result, 42);
  EXPECT_EQ(ran_on, network.id());
  EXPECT_NE(ran_on, loop_thread);
  EXPECT_EQ(resumed_on, loop_thread);
}

TEST(RunOn, ManyConcurrentCallsAllComeBackOnce) {
  asio::io_context loop;
  IoThread network(kNetworkThreadNice);
  constexpr int kCalls = 2000;
  int done = 0;
  long sum = 0;
  for (int i = 0; i < kCalls; ++i) {
    spawn(loop.get_executor(), [&, i]() -> Awaitable<void> {
      auto op = run_on<int>(network.executor(), [i]() -> Awaitable<int> { co_return i; });
      sum += co_await std::move(op);
      ++done;
    });
  }
  loop.run();
  EXPECT_EQ(done, kCalls);
  EXPECT_EQ(sum, static_cast<long>(kCalls) * (kCalls - 1) / 2);
}

TEST(IoThread, StopLetsPostedWorkFinish) {
  IoThread network;
  bool ran = false;
  asio::post(network.context(), [&] { ran = true; });
  network.stop();
  EXPECT_TRUE(ran);
}

}  // namespace
}  // namespace arlo
