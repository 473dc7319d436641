#pragma once
// What the orchestrator integration tests share: the small run they make, and running a started
// Orchestrator on its io_context to the end, with a deadline that turns a hang into a test failure.
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <functional>

#include "common/async/coro.h"
#include "orchestrator/orchestrator.h"

namespace arlo::orch::test {

// A small run of `steps` steps: two groups of four samples of 8 tokens a step, 16 requests in flight,
// generation one version ahead at most.
inline Options small_run_options(std::int64_t steps) {
  Options opt;
  opt.batch_size = 8;
  opt.group_size = 4;
  opt.max_inflight = 16;
  opt.max_async_level = 1;
  opt.max_steps = steps;
  opt.sampling.max_tokens = 8;
  return opt;
}

// Runs `io` until `orchestrator`'s run ended (wait() returned), then calls `after` (stops what the
// run used: pool, bridge, servers) and stops the loop. A run still going after `limit` is asked to
// stop ("test timeout"); returns whether that happened.
inline bool run_to_the_end(boost::asio::io_context& io, Orchestrator& orchestrator, std::chrono::seconds limit,
                           const std::function<void()>& after) {
  bool timed_out = false;
  boost::asio::steady_timer guard(io, limit);
  guard.async_wait([&](boost::system::error_code ec) {
    if (!ec) {
      timed_out = true;
      orchestrator.request_stop("test timeout");
    }
  });
  spawn(io.get_executor(), [&]() -> Awaitable<void> {
    co_await orchestrator.wait();
    guard.cancel();
    after();
    io.stop();
  });
  io.run();
  return timed_out;
}

}  // namespace arlo::orch::test
