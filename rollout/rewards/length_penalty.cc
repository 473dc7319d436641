// length_penalty: -coef * min(1, (tokens - free_tokens) / (max_tokens - free_tokens)), at most 0.
#include <algorithm>

#include "rollout/reward.h"

namespace arlo::rollout {

namespace {
class LengthPenalty : public NamedModule {
 public:
  LengthPenalty(std::string name, double max_tokens, double free_tokens, double coef)
      : NamedModule(std::move(name)), max_(max_tokens), free_(free_tokens), coef_(coef) {}
  Result<Score> score(const Task&, const Rollout& r) override {
    const double n = static_cast<double>(r.completion_tokens.size());
    const double over = std::max(0.0, n - free_);
    const double span = std::max(1.0, max_ - free_);
    return Score{-coef_ * std::min(1.0, over / span), {{"tokens", n}}};
  }

 private:
  double max_, free_, coef_;
};

Result<std::unique_ptr<RewardModule>> make(const RewardSpec& s) {
  const double max_tokens = s.options["max_tokens"].get<double>(), free_tokens = s.options["free_tokens"].get<double>();
  if (max_tokens <= free_tokens)
    return make_error(ErrorCode::kInvalidArgument, "reward 'length_penalty': max_tokens must exceed free_tokens");
  return std::make_unique<LengthPenalty>(s.name, max_tokens, free_tokens, s.options["coef"].get<double>());
}
}  // namespace

RewardKind length_penalty_reward() {
  return {"length_penalty",
          "a penalty growing from 0 at free_tokens to -coef at max_tokens (metric tokens)",
          {float_option("max_tokens", 256.0, "tokens where the penalty is full"),
           float_option("free_tokens", 0.0, "tokens without penalty"), float_option("coef", 1.0, "the full penalty")},
          true,
          make};
}

}  // namespace arlo::rollout
