// numeric_match: 1 when the last number in the completion equals the answer's, within tolerances.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "rollout/reward.h"

namespace arlo::rollout {

namespace {
class NumericMatch : public NamedModule {
 public:
  NumericMatch(std::string name, double rel_tol, double abs_tol)
      : NamedModule(std::move(name)), rel_tol_(rel_tol), abs_tol_(abs_tol) {}
  Result<Score> score(const Task& task, const Rollout& r) override {
    auto expected = last_number(task.answer);
    if (!expected)
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("numeric_match: task '{}' answer '{}' has no number", task.id, task.answer));
    auto got = last_number(r.text);
    Score s;
    s.metrics["parsed"] = got ? 1.0 : 0.0;
    if (got) {
      const double diff = std::fabs(*got - *expected);
      s.reward = diff <= std::max(abs_tol_, rel_tol_ * std::fabs(*expected)) ? 1.0 : 0.0;
    }
    return s;
  }

 private:
  double rel_tol_, abs_tol_;
};
}  // namespace

RewardKind numeric_match_reward() {
  return {"numeric_match",
          "1 when the last number in the completion equals the answer's (metric parsed)",
          {float_option("rel_tol", 1e-6, "relative tolerance"), float_option("abs_tol", 1e-9, "absolute tolerance")},
          true,
          [](const RewardSpec& s) -> Result<std::unique_ptr<RewardModule>> {
            return std::make_unique<NumericMatch>(s.name, s.options["rel_tol"].get<double>(),
                                                  s.options["abs_tol"].get<double>());
          }};
}

}  // namespace arlo::rollout
