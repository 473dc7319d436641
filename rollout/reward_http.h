#pragma once
// The `http` reward module: posts each rollout (or group) to a user's reward server.
//
// Wire format (JSON over POST to `url`):
//   per sample: {"task": {...}, "rollout": {...}}              -> {"reward": 0.5, "metrics": {"k": 1.0}}
//   per group (group: true): {"task": {...}, "rollouts": [...]} -> {"scores": [{"reward", "metrics"}, ...]}
// Non-2xx answers, malformed bodies and missing "reward" are errors (the scorer's failure policy
// applies). Calls are blocking on the scorer's worker thread, each with its own short-lived
// io_context; the timeout bounds the whole call.
#include <memory>
#include <string>

#include "common/result.h"
#include "rollout/reward.h"

namespace arlo::rollout {

struct HttpRewardOptions {
  std::string url;
  Duration timeout = std::chrono::seconds(10);
  bool group = false;
};

Result<std::unique_ptr<RewardModule>> make_http_reward(std::string name, HttpRewardOptions options);

}  // namespace arlo::rollout
