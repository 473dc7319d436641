#include "rollout/advantages.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "common/enum_names.h"

namespace arlo::rollout {

namespace {

constexpr EnumName<AdvantageKind> kAdvantageKinds[] = {
    {AdvantageKind::kGrpo, "grpo"}, {AdvantageKind::kDrGrpo, "dr_grpo"}, {AdvantageKind::kRloo, "rloo"}};
constexpr EnumName<TruncationPolicy> kTruncationPolicies[] = {
    {TruncationPolicy::kKeep, "keep"}, {TruncationPolicy::kDrop, "drop"}, {TruncationPolicy::kMask, "mask"}};

}  // namespace

Result<AdvantageKind> parse_advantage_kind(std::string_view name) {
  return parse_enum(kAdvantageKinds, "advantage", name);
}

Result<TruncationPolicy> parse_truncation_policy(std::string_view name) {
  return parse_enum(kTruncationPolicies, "truncation policy", name);
}

std::size_t GroupAdvantages::trainable() const {
  if (group_dropped) return 0;
  return static_cast<std::size_t>(std::count(fates.begin(), fates.end(), SampleFate::kTrain));
}

GroupAdvantages compute_advantages(std::span<const SampleInput> samples, const AdvantageOptions& o) {
  GroupAdvantages out;
  const std::size_t n_all = samples.size();
  out.advantages.assign(n_all, 0.0);
  out.fates.assign(n_all, SampleFate::kTrain);

  // Which samples enter the statistics.
  std::vector<std::size_t> kept;
  for (std::size_t i = 0; i < n_all; ++i) {
    if (samples[i].truncated && o.truncated == TruncationPolicy::kDrop) {
      out.fates[i] = SampleFate::kDropped;
    } else {
      if (samples[i].truncated && o.truncated == TruncationPolicy::kMask) out.fates[i] = SampleFate::kMasked;
      kept.push_back(i);
    }
  }
  auto drop_all = [&](std::string reason) {
    out.group_dropped = true;
    out.drop_reason = std::move(reason);
    std::fill(out.advantages.begin(), out.advantages.end(), 0.0);
    std::fill(out.fates.begin(), out.fates.end(), SampleFate::kDropped);
    return out;
  };
  if (kept.empty()) return drop_all("no samples left after filtering truncated ones");

  std::vector<double> r(kept.size());
  double norm = o.length_norm;
  if (o.length_penalty != 0.0 && norm <= 0.0) {
    for (std::size_t i : kept) norm = std::max(norm, static_cast<double>(samples[i].length));
  }
  for (std::size_t k = 0; k < kept.size(); ++k) {
    const auto& s = samples[kept[k]];
    r[k] = s.reward;
    if (o.length_penalty != 0.0 && norm > 0.0) r[k] -= o.length_penalty * static_cast<double>(s.length) / norm;
  }
  const double n = static_cast<double>(r.size());
  double mean = 0;
  for (double x : r) mean += x;
  mean /= n;
  const auto [mn, mx] = std::minmax_element(r.begin(), r.end());
  if (o.filter_equal_reward_groups && (*mx - *mn) <= o.equal_tolerance) return drop_all("all rewards equal");

  std::vector<double> adv(r.size());
  switch (o.kind) {
    case AdvantageKind::kGrpo: {
      double var = 0;
      for (double x : r) var += (x - mean) * (x - mean);
      const double sd = std::sqrt(var / n);
      for (std::size_t k = 0; k < r.size(); ++k) adv[k] = (r[k] - mean) / (sd + o.std_eps);
      break;
    }
    case AdvantageKind::kDrGrpo:
      for (std::size_t k = 0; k < r.size(); ++k) adv[k] = r[k] - mean;
      break;
    case AdvantageKind::kRloo:
      if (r.size() < 2) return drop_all("rloo needs at least 2 samples in a group");
      for (std::size_t k = 0; k < r.size(); ++k) adv[k] = n / (n - 1.0) * (r[k] - mean);
      break;
  }
  for (std::size_t k = 0; k < kept.size(); ++k) {
    const std::size_t i = kept[k];
    out.advantages[i] = out.fates[i] == SampleFate::kMasked ? 0.0 : adv[k];
  }
  return out;
}

Result<double> pass_at_k(std::size_t n, std::size_t c, std::size_t k) {
  if (k < 1 || k > n || c > n)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("pass@k needs 1 <= k <= n and c <= n, got n={} c={} k={}", n, c, k));
  if (n - c < k) return 1.0;
  // C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i), numerically stable.
  double fail = 1.0;
  for (std::size_t i = n - c + 1; i <= n; ++i) fail *= 1.0 - static_cast<double>(k) / static_cast<double>(i);
  return 1.0 - fail;
}

Result<double> mean_pass_at_k(std::span<const std::pair<std::size_t, std::size_t>> tasks, std::size_t k) {
  if (tasks.empty()) return make_error(ErrorCode::kInvalidArgument, "pass@k over no tasks");
  double sum = 0;
  for (const auto& [n, c] : tasks) {
    ARLO_ASSIGN_OR_RETURN(double p, pass_at_k(n, c, k));
    sum += p;
  }
  return sum / static_cast<double>(tasks.size());
}

Result<double> avg_at_k(std::span<const double> rewards) {
  if (rewards.empty()) return make_error(ErrorCode::kInvalidArgument, "avg@k over no samples");
  double sum = 0;
  for (double r : rewards) sum += r;
  return sum / static_cast<double>(rewards.size());
}

}  // namespace arlo::rollout
