// lcs_ratio: 2*LCS/(|completion|+|answer|) of the trimmed texts.
#include "rollout/reward.h"

namespace arlo::rollout {

namespace {
class LcsRatio : public NamedModule {
 public:
  using NamedModule::NamedModule;
  Result<Score> score(const Task& task, const Rollout& r) override {
    const std::string a = trim(r.text), b = trim(task.answer);
    if (a.empty() && b.empty()) return Score{1.0, {}};
    return Score{2.0 * static_cast<double>(lcs_length(a, b)) / static_cast<double>(a.size() + b.size()), {}};
  }
};
}  // namespace

RewardKind lcs_ratio_reward() {
  return {
      "lcs_ratio",
      "2*LCS/(|completion|+|answer|)",
      {},
      true,
      [](const RewardSpec& s) -> Result<std::unique_ptr<RewardModule>> { return std::make_unique<LcsRatio>(s.name); }};
}

}  // namespace arlo::rollout
