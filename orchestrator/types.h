#pragma once
// Value types the orchestrator shares with its ports (docs/architecture.md section 2). They are plain
// data: no behaviour, no I/O, cheap to move. Adapters convert between these and the rollout /
// trainer_bridge types where they differ (requests), so the orchestrator builds and is tested
// without those modules; tasks and samples (common/sample.h) are the shared vocabulary's and need
// no converting.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/sample.h"
#include "common/vocabulary.h"

namespace arlo::orch {

using Clock_ = std::chrono::steady_clock;
using TimePoint = Clock_::time_point;
using Duration = Clock_::duration;

// Tasks, versions, version spans, pause modes, finish reasons and sampling parameters are the shared
// vocabulary's (common/vocabulary.h, namespace arlo); one generated sample is arlo::Sample
// (common/sample.h) from the worker's answer to the trainer batch.

// The weights a worker reports it serves (GET /weights): the version it committed last and the
// checksum of its parameters ("" when the server does not report one).
struct WorkerWeights {
  Version version = kNoVersion;
  std::string checksum;
};

// A task's checkpoint form (pending tasks in orchestrator/checkpoint.json): the fields reward modules
// see (rollout::to_json) plus the token ids. task_from_checkpoint_json also reads what earlier
// versions wrote: a numeric id (a sequence number) with the environment's id in info["task_id"], the
// prompt as text beside the chat messages. Throws nlohmann::json::exception on malformed input;
// callers convert at their edge.
nlohmann::json task_checkpoint_json(const Task& task);
Task task_from_checkpoint_json(const nlohmann::json& j);

// One request to an inference server: `n` samples of one prompt (a group, or a continuation of one
// sample after an abort: prompt_tokens then already hold the sample's partial completion).
struct GenerateRequest {
  std::uint64_t request_id = 0;
  std::uint64_t group_id = 0;  // affinity key: all samples of a group go to one server
  std::shared_ptr<const Task> task;
  std::vector<std::int32_t> prompt_tokens;  // empty: send the task's prompt or messages
  int n = 1;
  SamplingParams sampling;  // its n and seed are the request's own (n above, seed below)
  std::uint64_t seed = 0;
  TimePoint deadline{};
};

struct GenerateResult {
  std::vector<Sample> completions;          // exactly n on success (tokens, logprobs, spans, text, worker)
  std::vector<std::int32_t> prompt_tokens;  // the prompt as the server tokenized it
  std::string worker;                       // who served it
};

// What an environment answers (EnvironmentPort): to reset, a trajectory's first messages; to a step,
// the messages that follow the model's turn (tool results, feedback). `tokens` are those messages as
// token ids that extend the trajectory's ids exactly (token-in/token-out: never a re-tokenization
// of the conversation), from the serving worker's own tokenizer and chat template, ending with what
// opens the model's next turn; empty on reset and when `done`. `done` ends the trajectory, `reward`
// is the environment's reward for it (usually given with done), `state` its opaque state, passed
// back on the next step. `tools` (reset only): the OpenAI-format tool schemas the trajectory's model
// may call (null: the task's own). `ended_because`: when the environment ended the trajectory
// early for a reason worth counting (e.g. "malformed_tool_call"), that reason (counted per reason).
// `restart_prompt` (non-empty, with `tokens` empty): the worker's rendering of the conversation did
// not extend the trajectory's ids; the trajectory goes on as a new piece whose prompt is these ids
// (the whole conversation with the generation prompt), and the earlier piece is kept in
// Sample::split_segments.
struct EnvReply {
  std::vector<ChatMessage> messages;
  std::vector<std::int32_t> tokens;
  bool done = false;
  std::optional<double> reward;
  nlohmann::json state;
  nlohmann::json tools;
  std::string ended_because;
  std::vector<std::int32_t> restart_prompt;
};

// Scores for one whole group, index-aligned with its completions.
struct ScoredGroup {
  std::vector<double> rewards;
  std::vector<double> advantages;
  // Per sample, what the reward modules reported: "<module>" (its reward), "<module>/<metric>",
  // "reward/failed" = 1 for a sample whose scoring failed. May be empty.
  std::vector<std::map<std::string, double>> metrics;
  std::vector<SampleFate> fates;  // empty: every sample trains (SampleFate: common/sample.h)
};

struct TrainBatch {
  std::int64_t step = 0;
  std::vector<Sample> samples;                         // with prompt, scores and fate set (common/sample.h)
  nlohmann::json metadata = nlohmann::json::object();  // version stats, reward stats
};

// "Version v published", pushed by the trainer. `metrics` may carry loss, grad_norm, mismatch_kl
// of the step that produced it.
struct VersionNotice {
  Version version = 0;
  nlohmann::json metrics = nlohmann::json::object();
  // Where `version` is staged and its checksum: the trainer's announcement (weight_sync/wire.h);
  // empty when the trainer said nothing of it (arlo_bridge_announce without one).
  nlohmann::json weight_sync = nlohmann::json::object();
};

// One worker's update call in a weight round, as the WeightWatcher knows it: the version, where
// the trainer said it is (the notice's `weight_sync` announcement the round was started from; empty
// when it said nothing), the workers (admin urls) that receive it in this round (not left out,
// paused, not holding it already) and whether this worker's update already failed once in it. A
// chain (weight_sync.topology chain) routes each worker around relays that are not receiving.
struct WeightRound {
  Version version = 0;
  nlohmann::json weight_sync = nlohmann::json::object();
  std::set<std::string> receivers;
  bool retry = false;
};

}  // namespace arlo::orch
