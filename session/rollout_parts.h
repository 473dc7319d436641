#pragma once
// The rollout-side parts of `arlo run`, built from the configuration: the training task stream,
// the held-out eval set, and the weighted reward module. Only this file knows the `env`, `eval`
// and `reward` key names for the run command; environments and reward modules come from rollout's
// registries, and whether the servers get token ids from arlo from their admin dialect's entry.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "common/result.h"
#include "session/adapters/rollout_adapters.h"
#include "orchestrator/ports.h"
#include "rollout/multi_turn.h"
#include "rollout/reward.h"
#include "rollout/task_mix.h"

namespace arlo::session {

// Whether arlo tokenizes prompts itself, with the built-in character tokenizer: only for servers
// whose dialect says they serve that tokenizer's policy (ServerCapabilities::builtin_tokenizer:
// arlo-worker). Every other server (vllm, sglang) gets text prompts and chat messages as they are,
// and its response reports the ids its own tokenizer and chat template produced (rollout/openai.h).
bool uses_builtin_tokenizer(const config::Config& cfg);

// Task source for the orchestrator: the environment's task mix (one stream, or env.sources in their
// ratio). The cursor is {"stream": the mix's cursor, "seq": tasks served}. With `tokenize`, prompts are
// tokenized as arlo-worker tokenizes a text prompt (<bos> + characters) and reference answers as
// the completion the policy should produce (characters + <eos>), so the supervised warm-up teaches
// the policy to stop; without, tasks carry text only. Single-threaded: used on the orchestrator's
// event loop.
class RunTasks final : public orch::TaskSource {
 public:
  RunTasks(std::shared_ptr<rollout::TaskMix> mix, bool tokenize);
  Result<arlo::Task> next() override;
  nlohmann::json cursor() const override { return inner_.cursor(); }
  Status restore(const nlohmann::json& cursor) override { return inner_.restore(cursor); }
  // Prepares one environment task (the eval set) the same way.
  arlo::Task prepare(arlo::Task t) const;

 private:
  adapters::RolloutTasks inner_;
  bool tokenize_;
};

// Adds built-in token ids to a task (no-op for chat tasks, which go to the server as messages).
void tokenize_task(arlo::Task& task);

struct RolloutParts {
  // The training tasks: env.kind's stream alone, or the mix of env.sources (tasks named by source).
  std::shared_ptr<rollout::TaskMix> stream;
  bool tokenize = true;                // uses_builtin_tokenizer(): how RunTasks prepares the stream's tasks
  std::vector<arlo::Task> eval_tasks;  // empty when eval.interval is 0; with env.sources, eval.size of each
  // reward.modules weighted; with env.sources, each task scored by its source's own modules (else
  // reward.modules), and metrics source/<name>/share and source/<name>/reward added.
  std::shared_ptr<rollout::RewardModule> reward;
  // The environments of env.kind and eval's kind by kind name (a single-turn kind: nullptr), and
  // under "" the one of tasks whose env names no kind (a dataset's lines): see EnvironmentAdapter.
  std::map<std::string, std::shared_ptr<rollout::MultiTurnEnvironment>> environments;
};

// kInvalidArgument citing the config location when a part cannot be built (e.g. a missing jsonl).
Result<RolloutParts> build_rollout_parts(const config::Config& cfg);
// The run's reward module alone (RolloutParts::reward: reward.modules, per source with env.sources;
// `arlo replay` scores with it).
Result<std::shared_ptr<rollout::RewardModule>> build_reward(const config::Config& cfg);

}  // namespace arlo::session
