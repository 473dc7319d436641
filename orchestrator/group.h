#pragma once
// A group: `n` samples of one task, dispatched, scored, batched or dropped together.
// Created by the RolloutDispatcher; shared (read-only once complete) with the sinks.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "orchestrator/types.h"

namespace arlo::orch {

enum class RolloutKind { kTrain, kEval };

struct Group {
  std::uint64_t id = 0;
  RolloutKind kind = RolloutKind::kTrain;
  std::shared_ptr<const Task> task;
  std::int64_t target_step = 0;  // train: the step this group was dispatched to serve
  std::uint64_t eval_id = 0;     // eval: which eval run it belongs to
  Version dispatch_version = kNoVersion;
  TimePoint dispatched_at{};
  TimePoint finished_at{};
  std::vector<std::int32_t> prompt_tokens;  // as the server tokenized it (for continuations, batches)
  std::string worker;                       // the server that answered its first request
  std::vector<Sample> completions;          // index = sample index
  ScoredGroup scores;

  // The oldest policy version that produced any token of any sample (docs/architecture.md, "Versions and staleness").
  Version oldest_version() const {
    Version v = kNoVersion;
    for (const auto& c : completions)
      for (const auto& s : c.version_spans)
        if (v == kNoVersion || s.version < v) v = s.version;
    return v == kNoVersion ? dispatch_version : v;
  }
  std::uint64_t completion_tokens() const {
    std::uint64_t n = 0;
    for (const auto& c : completions) n += c.completion_tokens.size();
    return n;
  }
};

using GroupPtr = std::shared_ptr<Group>;

}  // namespace arlo::orch
