// env: the reward the multi-turn environment gave the trajectory (Sample::env_reward), with the
// trajectory's model turns as the metric `turns` (train/reward/<name>/turns: the batch's mean).
#include <algorithm>

#include "rollout/reward.h"

namespace arlo::rollout {

namespace {
class EnvReward : public NamedModule {
 public:
  explicit EnvReward(std::string name) : NamedModule(std::move(name)) {}
  Result<Score> score(const Task&, const Rollout& r) override {
    if (!r.env_reward.has_value()) {
      return make_error(ErrorCode::kNotFound,
                        "reward 'env': the sample has no environment reward (a single-turn sample, or its "
                        "environment ended the trajectory without one)");
    }
    const auto turns =
        std::count_if(r.turns.begin(), r.turns.end(), [](const ChatMessage& m) { return m.role == "assistant"; });
    return Score{r.env_reward.value(), {{"turns", static_cast<double>(turns)}}};
  }
};

Result<std::unique_ptr<RewardModule>> make_env_reward(const RewardSpec& spec) {
  std::unique_ptr<RewardModule> module = std::make_unique<EnvReward>(spec.name);
  return module;
}
}  // namespace

RewardKind env_reward() {
  RewardKind kind;
  kind.name = "env";
  kind.doc = "the reward the multi-turn environment gave the trajectory (a sample without one fails scoring)";
  kind.make = make_env_reward;
  return kind;
}

}  // namespace arlo::rollout
