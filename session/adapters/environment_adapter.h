#pragma once
// The orchestrator's EnvironmentPort over rollout's multi-turn environments (rollout/multi_turn.h),
// with token-in/token-out: what an environment adds to a trajectory becomes token ids that extend
// the trajectory's ids exactly, made by the worker that served the trajectory (its own tokenizer and
// chat template, through its POST /tokenize), never by re-tokenizing the conversation here.
//
//   - completion-style task (Task::prompt): the environment's message contents, concatenated, are
//     tokenized alone without special tokens ({"prompt", "add_special_tokens": false}) and appended;
//   - chat task: the whole conversation (the task's messages, the trajectory's turns, the
//     environment's messages) is rendered with the generation prompt ({"messages",
//     "add_generation_prompt": true}); the result must start with the trajectory's ids (the group's
//     prompt ids, then its completion ids), and what follows them is appended. When it does not (the
//     template does not extend what the model saw: the "extension property" fails, e.g. a template
//     that drops earlier reasoning, or arlo-worker's, which closes an assistant turn with '\n' where
//     the model ended it with <eos>), the trajectory splits: the reply carries the rendering as
//     EnvReply::restart_prompt (the trajectory goes on as a new piece from it, sharing the reward;
//     the dispatcher keeps the earlier piece), and the split is counted (EnvironmentStats::splits;
//     metric multi_turn/split).
//
// Errors (the dispatcher fails the sample with "env_<code>"): the environment's own (kTimeout for a
// missed deadline, kUnavailable, kParse ...), and the tokenize call's: kTimeout, kUnavailable for a
// worker that cannot be reached or answers 5xx, kInvalidArgument for a 4xx, kParse for a body
// without "tokens".
//
// Threading: called on the orchestrator's loop; the environments run there (rollout/multi_turn.h),
// the tokenize calls on the pool's network thread when one is given (their results come back to the
// loop), through the pool's HTTP client (its token, keep-alive connections).
#include <boost/asio/any_io_executor.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/http.h"
#include "orchestrator/ports.h"
#include "rollout/multi_turn.h"

namespace arlo::session::adapters {

namespace asio = boost::asio;

// POST <worker>/tokenize (vLLM's and arlo-worker's route) through `client`, on `network`'s thread
// when given. `worker` is the base url the pool knows the worker by (Sample::worker).
class WorkerTokenizer {
 public:
  explicit WorkerTokenizer(http::Client& client, std::optional<asio::any_io_executor> network = std::nullopt)
      : client_(client), network_(std::move(network)) {}
  // `text` alone, no special tokens.
  Awaitable<Result<std::vector<std::int32_t>>> text(std::string worker, std::string text, orch::TimePoint deadline);
  // The conversation through the worker's chat template, with the generation prompt.
  // `tools`: the task's OpenAI tool schemas (null: none), sent so the rendering matches the model's.
  Awaitable<Result<std::vector<std::int32_t>>> chat(std::string worker, std::vector<ChatMessage> messages,
                                                    orch::TimePoint deadline, nlohmann::json tools = nullptr);

 private:
  Awaitable<Result<std::vector<std::int32_t>>> call(std::string worker, nlohmann::json body, orch::TimePoint deadline);
  Awaitable<Result<std::vector<std::int32_t>>> call_here(std::string worker, nlohmann::json body,
                                                         orch::TimePoint deadline);
  http::Client& client_;
  std::optional<asio::any_io_executor> network_;
};

struct EnvironmentStats {
  std::uint64_t resets = 0;
  std::uint64_t steps = 0;
  std::uint64_t splits = 0;  // chat trajectories split because the template did not extend them
};

class EnvironmentAdapter final : public orch::EnvironmentPort {
 public:
  // The run's environments by the env name of the tasks they run (Task::env: the kind's name for the
  // built-in kinds; nullptr: a single-turn kind); a task whose env is not a key runs in the one under
  // "" (a dataset's tasks), or single-turn. `tokenizer` must outlive this adapter and its calls.
  EnvironmentAdapter(std::map<std::string, std::shared_ptr<rollout::MultiTurnEnvironment>> environments,
                     WorkerTokenizer& tokenizer);

  bool multi_turn(const Task& task) const override;
  Awaitable<Result<orch::EnvReply>> reset(std::shared_ptr<const Task> task, orch::TimePoint deadline) override;
  Awaitable<Result<orch::EnvReply>> step(std::shared_ptr<const Task> task, const Sample& trajectory,
                                         std::vector<std::int32_t> prompt_tokens, orch::TimePoint deadline) override;

  const EnvironmentStats& stats() const { return stats_; }
  // Called on the loop each time a chat trajectory splits because the template did not extend it.
  void on_split(std::function<void()> callback) { on_split_ = std::move(callback); }

 private:
  rollout::MultiTurnEnvironment* find(const Task& task) const;  // nullptr: single-turn
  Result<rollout::MultiTurnEnvironment*> environment(const Task& task) const;
  // The ids of what `turn` adds to `trajectory`; or, where the extension property failed, the
  // worker's rendering of the whole conversation (`extends` false).
  struct TurnIds {
    std::vector<std::int32_t> ids;
    bool extends = true;
  };
  Awaitable<Result<TurnIds>> tokens_of(const Task& task, const Sample& trajectory,
                                       const std::vector<std::int32_t>& prompt, const rollout::EnvTurn& turn,
                                       orch::TimePoint deadline);

  std::map<std::string, std::shared_ptr<rollout::MultiTurnEnvironment>> environments_;
  WorkerTokenizer& tokenizer_;
  EnvironmentStats stats_;
  std::function<void()> on_split_;
};

// Whether `ids` starts with `prefix` followed by `more` (the trajectory's ids: prompt, completion);
// the rest of `ids` after them when it does.
std::optional<std::vector<std::int32_t>> extension_of(const std::vector<std::int32_t>& ids,
                                                      const std::vector<std::int32_t>& prefix,
                                                      const std::vector<std::int32_t>& more);

}  // namespace arlo::session::adapters
