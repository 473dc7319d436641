// weighted: sum(weight_i * reward_i) over sub-modules, each reported as "<name_i>" and "<name_i>/<metric>".
#include <fmt/format.h>

#include "rollout/reward.h"

namespace arlo::rollout {

namespace {
class Weighted : public NamedModule {
 public:
  Weighted(std::string name, std::vector<WeightedPart> parts) : NamedModule(std::move(name)), parts_(std::move(parts)) {
    for (const auto& p : parts_) groups_ = groups_ || p.module->scores_groups();
  }
  bool scores_groups() const override { return groups_; }
  Status usable() const override {
    for (const auto& p : parts_) ARLO_TRY(p.module->usable());
    return ok();
  }
  Result<Score> score(const Task& task, const Rollout& r) override {
    Score out;
    for (const auto& p : parts_) {
      auto s = p.module->score(task, r);
      if (!s) return std::unexpected(std::move(s).error().with_context(p.module->name()));
      add(out, p, *s);
    }
    return out;
  }
  Result<std::vector<Score>> score_group(const Task& task, std::span<const Rollout> group) override {
    std::vector<Score> out(group.size());
    for (const auto& p : parts_) {
      auto scores = p.module->score_group(task, group);
      if (!scores) return std::unexpected(std::move(scores).error().with_context(p.module->name()));
      if (scores->size() != group.size())
        return make_error(ErrorCode::kMismatch, fmt::format("{}: returned {} scores for a group of {}",
                                                            p.module->name(), scores->size(), group.size()));
      for (std::size_t i = 0; i < group.size(); ++i) add(out[i], p, (*scores)[i]);
    }
    return out;
  }

 private:
  static void add(Score& out, const WeightedPart& p, const Score& s) {
    out.reward += p.weight * s.reward;
    out.metrics[p.module->name()] = s.reward;
    for (const auto& [k, v] : s.metrics) out.metrics[p.module->name() + "/" + k] = v;
  }
  std::vector<WeightedPart> parts_;
  bool groups_ = false;
};

Result<std::unique_ptr<RewardModule>> make(const RewardSpec& s) {
  const Json& modules = s.options.contains("modules") ? s.options["modules"] : Json();
  if (!modules.is_array() || modules.empty())
    return make_error(ErrorCode::kInvalidArgument, "reward 'weighted': needs a non-empty 'modules' list");
  std::vector<WeightedPart> parts;
  for (std::size_t i = 0; i < modules.size(); ++i) {
    const Json& sub = modules[i];
    auto m = make_reward_module(sub);
    if (!m) return std::unexpected(std::move(m).error().with_context(fmt::format("reward modules[{}]", i)));
    double w = 1.0;
    if (sub.is_object() && sub.contains("weight")) {
      if (!sub["weight"].is_number())
        return make_error(ErrorCode::kInvalidArgument, fmt::format("reward modules[{}]: 'weight' must be a number", i));
      w = sub["weight"].get<double>();
    }
    parts.push_back({std::move(*m), w});
  }
  return make_weighted(s.name, std::move(parts));
}
}  // namespace

std::unique_ptr<RewardModule> make_weighted(std::string name, std::vector<WeightedPart> parts) {
  return std::make_unique<Weighted>(std::move(name), std::move(parts));
}

RewardKind weighted_reward() {
  return {"weighted",
          "the weighted sum of its modules (reward.modules is one)",
          {any_option("modules", "the parts: specs, each with an optional weight")},
          false,
          make};
}

}  // namespace arlo::rollout
