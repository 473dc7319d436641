#pragma once
// The rollout-side parts of `arlo run`, built from the configuration: the training task stream
// (tokenized with the built-in character tokenizer), the held-out eval set, and the weighted reward
// module. Only this file knows the `env`, `eval` and `reward` key names for the run command.
#include <memory>
#include <vector>

#include "common/config/config.h"
#include "common/result.h"
#include "orchestrator/adapters/rollout_adapters.h"
#include "orchestrator/ports.h"
#include "rollout/reward.h"

namespace arlo::cli {

// Task source for the orchestrator: the environment's stream, with prompts tokenized as arlo-worker
// tokenizes a text prompt (<bos> + characters) and reference answers as the completion the policy
// should produce (characters + <eos>), so the supervised warm-up teaches the policy to stop.
// Single-threaded: used on the orchestrator's event loop.
class TokenizedTasks final : public orch::TaskSource {
 public:
  explicit TokenizedTasks(std::shared_ptr<rollout::TaskStream> stream);
  Result<orch::Task> next() override;
  nlohmann::json cursor() const override { return inner_.cursor(); }
  Status restore(const nlohmann::json& cursor) override { return inner_.restore(cursor); }
  // Converts one environment task (the eval set) the same way.
  orch::Task convert(const rollout::Task& t, std::uint64_t id) const;

 private:
  orch::adapters::RolloutTasks inner_;
};

// Adds token ids to a converted task (no-op for chat tasks, which go to the server as messages).
void tokenize_task(orch::Task& task);

struct RolloutParts {
  std::shared_ptr<rollout::TaskStream> stream;
  std::vector<orch::Task> eval_tasks;  // empty when eval.interval is 0
  std::shared_ptr<rollout::RewardModule> reward;
};

// kInvalidArgument citing the config location when a part cannot be built (e.g. a missing jsonl).
Result<RolloutParts> build_rollout_parts(const config::Config& cfg);

}  // namespace arlo::cli
