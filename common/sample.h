#pragma once
// One sample, from dispatch to the trainer batch (docs/architecture.md, "A sample's path"). The
// same value is filled as it goes: the inference adapter moves the server's tokens, logprobs,
// version spans, finish reason and text into it; the dispatcher appends a continuation's tokens
// after an abort; the scorer's reward modules read it (rollout::Rollout is this type); the train
// sink sets the prompt, rewards, advantage and fate when it cuts the batch; the trainer bridge packs
// it into the batch tensors. Nothing on the way copies its tokens into another type.
//
// A multi-turn trajectory fits without another type: `completion_tokens` then holds every token after
// the first prompt, the model's turns and the environment's replies in order, and `loss_mask` marks
// the model's tokens 1 and the environment's 0 (logprobs of environment tokens are 0; version spans
// cover all of them). Single-turn samples leave `loss_mask` empty: every completion token is the
// model's.
//
// Plain data: copyable, cheap to move, no hidden sharing.
#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/vocabulary.h"

namespace arlo {

// What becomes of a sample at the batch: the advantage estimator's verdict (orchestrator.overlong
// for a completion cut off by sampling.max_tokens).
// One earlier piece of a split trajectory (docs/environments.md, "When a trajectory splits"): its
// prompt (the group's prompt, or the worker's rendering of the conversation where the previous piece
// ended), what followed it (the model's and the environment's tokens), their logprobs, loss mask
// (empty: every token is the model's) and version spans. Trains as a row of its own with the
// trajectory's reward, advantage and fate.
struct TrajectorySegment {
  std::vector<std::int32_t> prompt_tokens;
  std::vector<std::int32_t> completion_tokens;
  std::vector<float> logprobs;
  std::vector<std::uint8_t> loss_mask;
  std::vector<VersionSpan> version_spans;
};

enum class SampleFate {
  kTrain,    // in the batch and in the loss
  kMasked,   // in the batch, out of the loss: loss mask 0 on every token (ledger: "masked")
  kDropped,  // never in a batch (ledger: "overlong")
};

struct Sample {
  // Where it came from: the task's id and its index in its group (reward modules, logs).
  std::string task_id;
  int sample_index = 0;

  // Tokens. The prompt as the server tokenized it (set when the batch is cut: a group's samples
  // share one prompt until then); the completion, per-token logprobs from the inference engine (one
  // per completion token; missing ones count as 0) and the policy versions that produced them.
  std::vector<std::int32_t> prompt_tokens;
  std::vector<std::int32_t> completion_tokens;
  std::vector<float> logprobs;
  std::vector<VersionSpan> version_spans;  // sorted by first_token; empty: the server reported none
  // Empty, or one per completion token: 1 in the loss, 0 out of it (a multi-turn trajectory's
  // environment tokens). fate kMasked keeps every token out whatever this says.
  std::vector<std::uint8_t> loss_mask;

  FinishReason finish_reason = FinishReason::kUnknown;  // kAbort: continued later from its tokens
  // The completion as text; of a multi-turn trajectory, its last model turn (what answer-checking
  // reward modules read).
  std::string text;
  std::string worker;  // the server that answered (a trajectory's turns all go to it while it is up)

  // A multi-turn trajectory (docs/environments.md); all empty or unset for a single-turn sample.
  // `turns`: what followed the prompt, in order: the model's turns (role "assistant", its text) and
  // the environment's messages (role "user" or "tool"). `env_state`: the environment's opaque state
  // of this trajectory (from reset, then each step). `env_reward`: the reward the environment gave
  // when it ended the trajectory (read by the `env` reward module). `turn_versions`: the version the
  // workers served when each model turn was requested.
  std::vector<ChatMessage> turns;
  nlohmann::json env_state;
  std::optional<double> env_reward;
  std::vector<Version> turn_versions;
  // A split trajectory's earlier pieces, in order (empty for all others): where the worker's chat
  // template did not extend the trajectory's ids, the trajectory went on from a fresh rendering of
  // the conversation. The sample's own prompt and completion are then its last piece; every piece
  // trains as its own row sharing the reward (the ledger counts the trajectory once).
  std::vector<TrajectorySegment> split_segments;

  // Scores: the reward (unset until scored, and when the failure policy `drop` left it unscored),
  // what the reward modules reported ("<module>", "<module>/<metric>", "reward/failed"), the
  // advantage and the estimator's fate.
  std::optional<double> reward;
  std::map<std::string, double> metrics;
  double advantage = 0.0;
  SampleFate fate = SampleFate::kTrain;
  bool supervised = false;  // SFT warm-up sample: cross-entropy weight 1 on its completion tokens

  // Whether the sample counts in the loss at all (a masked one is in the batch, out of the loss).
  bool in_loss() const { return fate != SampleFate::kMasked; }

  // The oldest version among its spans; `fallback` when it has none.
  Version oldest_version(Version fallback) const {
    Version v = kNoVersion;
    for (const auto& s : version_spans)
      if (v == kNoVersion || s.version < v) v = s.version;
    return v == kNoVersion ? fallback : v;
  }

  // The version of each completion token (the trainer batch's token_versions): each span's version
  // from its first token to the next span's; `fallback` where no span covers a token.
  std::vector<std::int32_t> token_versions(Version fallback = kNoVersion) const {
    std::vector<std::int32_t> out(completion_tokens.size(), static_cast<std::int32_t>(fallback));
    for (std::size_t i = 0; i < version_spans.size(); ++i) {
      const auto begin = static_cast<std::size_t>(std::max<std::int64_t>(0, version_spans[i].first_token));
      const auto end =
          i + 1 < version_spans.size() ? static_cast<std::size_t>(version_spans[i + 1].first_token) : out.size();
      for (std::size_t t = begin; t < std::min(end, out.size()); ++t)
        out[t] = static_cast<std::int32_t>(version_spans[i].version);
    }
    return out;
  }
};

// The spans of per-token versions (the inverse of Sample::token_versions for a list without gaps).
inline std::vector<VersionSpan> spans_of(const std::vector<std::int32_t>& token_versions) {
  std::vector<VersionSpan> out;
  for (std::size_t t = 0; t < token_versions.size(); ++t)
    if (out.empty() || out.back().version != token_versions[t])
      out.push_back({token_versions[t], static_cast<std::int64_t>(t)});
  return out;
}

}  // namespace arlo
