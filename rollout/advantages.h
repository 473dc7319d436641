#pragma once
// From rewards to advantages for one complete prompt group, plus the group/sample filters that go
// with them, and the unbiased pass@k estimator used by evaluation.
//
// Definitions (n = samples kept in the group, r = rewards after the optional length penalty):
//   grpo     A_i = (r_i - mean(r)) / (std(r) + std_eps)    std is the population std (divide by n)
//   dr_grpo  A_i = r_i - mean(r)                            (no std normalisation)
//   rloo     A_i = r_i - mean_{j != i}(r_j) = n/(n-1) * (r_i - mean(r)); needs n >= 2
// Length penalty: r_i <- r_i - length_penalty * len_i / norm. With the default length_norm = 1 the
// penalty is per generated token (orchestrator.length_penalty); length_norm = 0 normalises by the
// longest completion in the group.
// Truncated samples (finish_reason == length): keep (as is), drop (removed before statistics, not
// trained on), or mask (kept in the statistics, advantage 0, loss-masked).
// A group whose kept rewards are all equal carries no signal; with filter_equal_reward_groups it is
// dropped as a whole.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "rollout/types.h"

namespace arlo::rollout {

enum class AdvantageKind { kGrpo, kDrGrpo, kRloo };
enum class TruncationPolicy { kKeep, kDrop, kMask };

Result<AdvantageKind> parse_advantage_kind(std::string_view name);        // grpo | dr_grpo | rloo
Result<TruncationPolicy> parse_truncation_policy(std::string_view name);  // keep | drop | mask

struct AdvantageOptions {
  AdvantageKind kind = AdvantageKind::kGrpo;
  double std_eps = 1e-6;
  double length_penalty = 0.0;  // 0 = off
  double length_norm = 1.0;     // tokens; 1 = per token, 0 = longest completion in the group
  bool filter_equal_reward_groups = true;
  TruncationPolicy truncated = TruncationPolicy::kKeep;
  double equal_tolerance = 1e-12;  // rewards closer than this count as equal
};

struct SampleInput {
  double reward = 0;
  std::size_t length = 0;  // completion tokens
  bool truncated = false;
};

using arlo::SampleFate;  // the sample's own (common/sample.h): train, masked, dropped

struct GroupAdvantages {
  std::vector<double> advantages;  // one per input sample (0 for dropped and masked)
  std::vector<SampleFate> fates;   // one per input sample
  bool group_dropped = false;
  std::string drop_reason;  // "all rewards equal", "fewer than 2 samples for rloo", ...
  std::size_t trainable() const;
};

// Pure function over one group; deterministic.
GroupAdvantages compute_advantages(std::span<const SampleInput> samples, const AdvantageOptions& options);

// Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k).
// Requires 1 <= k <= n and 0 <= c <= n (kInvalidArgument otherwise).
Result<double> pass_at_k(std::size_t n, std::size_t c, std::size_t k);
// Mean over tasks of pass@k, each task given as (n, c).
Result<double> mean_pass_at_k(std::span<const std::pair<std::size_t, std::size_t>> tasks, std::size_t k);
// avg@k: mean reward over all samples (k per task); empty input -> kInvalidArgument.
Result<double> avg_at_k(std::span<const double> rewards);

}  // namespace arlo::rollout
