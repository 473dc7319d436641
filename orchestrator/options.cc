#include "orchestrator/options.h"

#include <fmt/format.h>

#include <algorithm>

namespace arlo::orch {

int Options::queue_capacity_groups() const {
  // At least one batch: the sink queues whole groups.
  if (queue_capacity > 0) return std::max(groups_per_step(), queue_capacity / std::max(1, group_size));
  // Enough for every step the gate lets run ahead, plus one to absorb filtering.
  return groups_per_step() * (max_async_level + 2);
}

int Options::filter_budget_groups() const {
  return max_filtered_groups_per_step > 0 ? max_filtered_groups_per_step : 4 * groups_per_step();
}

Status Options::validate() const {
  auto bad = [](std::string msg) { return make_error(ErrorCode::kInvalidArgument, std::move(msg)); };
  if (group_size < 1) return bad(fmt::format("orchestrator.group_size: must be >= 1, got {}", group_size));
  if (batch_size < group_size || batch_size % group_size != 0)
    return bad(fmt::format("orchestrator.batch_size: must be a positive multiple of group_size ({}), got {}",
                           group_size, batch_size));
  if (max_inflight < group_size)
    return bad(fmt::format("orchestrator.max_inflight: must be >= group_size ({}), got {}", group_size, max_inflight));
  if (max_async_level < 0) return bad("orchestrator.max_async_level: must be >= 0");
  if (max_off_policy_steps < 0) return bad("orchestrator.max_off_policy_steps: must be >= 0");
  if (max_steps < 1) return bad("run.max_steps: must be >= 1");
  if (sft_warmup_steps < 0 || sft_warmup_steps >= max_steps)
    return bad(fmt::format("orchestrator.sft_warmup_steps: must be in [0, run.max_steps={}), got {}", max_steps,
                           sft_warmup_steps));
  if (queue_capacity < 0)
    return bad(
        fmt::format("orchestrator.queue_capacity: must be >= 0 (0: enough for every step the gate lets run "
                    "ahead), got {}",
                    queue_capacity));
  if (max_filtered_groups_per_step < 0) return bad("orchestrator.max_filtered_groups_per_step: must be >= 0");
  if (eval_samples < 1) return bad("eval.k: must be >= 1");
  for (int k : eval_pass_k)
    if (k < 1 || k > eval_samples)
      return bad(fmt::format("eval.pass_k: each k must be in [1, eval.k={}], got {}", eval_samples, k));
  if (admin_attempts < 1) return bad("orchestrator Options::admin_attempts (no config key): must be >= 1");
  if (version_attempts < 1) return bad("orchestrator Options::version_attempts (no config key): must be >= 1");
  if (log_interval_s <= 0) return bad("log.interval_s: must be > 0");
  if (ckpt_interval < 0) return bad("ckpt.interval: must be >= 0");
  if (sampling.max_tokens < 1) return bad("sampling.max_tokens: must be >= 1");
  if (max_turns < 1) return bad(fmt::format("env.max_turns: must be >= 1, got {}", max_turns));
  if (max_trajectory_tokens < 1)
    return bad(fmt::format("env.max_trajectory_tokens: must be >= 1, got {}", max_trajectory_tokens));
  if (env_timeout <= Duration::zero()) return bad("env.step_timeout_s: must be > 0");
  return ok();
}

}  // namespace arlo::orch
