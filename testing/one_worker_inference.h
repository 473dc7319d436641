#pragma once
// The benches' orchestrator inference port over one local server: a worker pool on the network
// thread holding the worker at 127.0.0.1:<port> with its arlo admin client, and
// session::adapters::RolloutInference over them (every call hops to that thread, as in arlo run).
// Call network.run_and_wait([&] { pool.start(); }) before use. Also the loop's options for such a
// measurement, and a run of the loop under a lag probe.
#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/async/io_thread.h"
#include "common/async/coro.h"
#include "orchestrator/options.h"
#include "orchestrator/orchestrator.h"
#include "orchestrator/periodic_logger.h"
#include "rollout/admin.h"
#include "rollout/inference_pool.h"
#include "session/adapters/rollout_adapters.h"

namespace arlo::testing {

struct OneWorkerInference {
  // `max_idle`: keep-alive connections the pool's client keeps (the rollouts in flight).
  OneWorkerInference(IoThread& network, std::uint16_t port, std::size_t max_idle)
      : url(fmt::format("http://127.0.0.1:{}", port)),
        pool(network.context(), pool_options(max_idle)),
        inference(pool, add_worker(pool, url), {}, "policy", network.executor()) {}

  std::string url;
  rollout::InferencePool pool;
  session::adapters::RolloutInference inference;

 private:
  static rollout::PoolOptions pool_options(std::size_t max_idle) {
    rollout::PoolOptions po;
    po.client.max_idle_per_host = max_idle;
    return po;
  }
  // Adds the worker to the pool and returns its admin client.
  static std::vector<std::unique_ptr<rollout::AdminClient>> add_worker(rollout::InferencePool& pool,
                                                                       const std::string& url) {
    pool.add_worker(url);
    std::vector<std::unique_ptr<rollout::AdminClient>> admins;
    admins.push_back(rollout::make_admin_client(rollout::AdminDialect::kArlo, pool.client(), url, {}));
    return admins;
  }
};

// The loop's options when what is measured is the loop itself against a free server: one sample per
// request, `inflight` in flight, a gate and a staleness bound that never bind, no eval, no filter,
// no console, enough steps for `rollouts`.
inline orch::Options free_server_loop_options(int inflight, long rollouts, int max_tokens) {
  orch::Options opt;
  opt.group_size = 1;
  opt.batch_size = 256;
  opt.max_inflight = inflight;
  opt.max_async_level = 1 << 20;
  opt.max_off_policy_steps = 1 << 20;
  opt.max_steps = (rollouts + opt.batch_size - 1) / opt.batch_size;
  opt.sampling.max_tokens = max_tokens;
  opt.log_interval_s = 1e6;
  opt.console = false;
  opt.eval_at_start = opt.eval_at_end = false;
  opt.filter_equal_reward_groups = false;
  return opt;
}

// Starts `orchestrator` and runs `io` until the run ends, `probe` sampling the loop's lag meanwhile.
inline Status run_probed(boost::asio::io_context& io, orch::Orchestrator& orchestrator, orch::LagProbe& probe) {
  if (auto st = orchestrator.start(); !st) return st;
  probe.start();
  spawn(io.get_executor(), [&]() -> Awaitable<void> {
    co_await orchestrator.wait();
    probe.stop();
    io.stop();
  });
  io.run();
  return ok();
}

}  // namespace arlo::testing
