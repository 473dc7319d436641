// exact_match: 1 when the trimmed completion equals the trimmed answer.
#include <algorithm>
#include <cctype>

#include "rollout/reward.h"

namespace arlo::rollout {

namespace {
class ExactMatch : public NamedModule {
 public:
  ExactMatch(std::string name, bool case_sensitive) : NamedModule(std::move(name)), case_sensitive_(case_sensitive) {}
  Result<Score> score(const Task& task, const Rollout& r) override {
    std::string a = trim(r.text), b = trim(task.answer);
    if (!case_sensitive_) {
      for (auto* s : {&a, &b})
        std::transform(s->begin(), s->end(), s->begin(), [](unsigned char c) { return std::tolower(c); });
    }
    return Score{a == b ? 1.0 : 0.0, {}};
  }

 private:
  bool case_sensitive_;
};
}  // namespace

RewardKind exact_match_reward() {
  return {"exact_match",
          "1 when the trimmed completion equals the answer",
          {bool_option("case_sensitive", true, "compare case-sensitively")},
          true,
          [](const RewardSpec& s) -> Result<std::unique_ptr<RewardModule>> {
            return std::make_unique<ExactMatch>(s.name, s.options["case_sensitive"].get<bool>());
          }};
}

}  // namespace arlo::rollout
