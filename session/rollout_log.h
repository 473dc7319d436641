#pragma once
// rollouts.jsonl in the run directory: samples people can read. One JSON object per line for every
// `every`-th scored train group (by group id, so which groups are logged does not depend on timing):
// the task (id, env, prompt as text, its chat messages, answer and info: what reward modules read,
// so that `arlo replay` can score the line again), and per sample its completion text, reward,
// advantage, each reward module's scores, token count, finish reason, version spans and worker; of a
// multi-turn trajectory also its turns as text, the model's and the environment's token counts, each
// model turn's version and the environment's reward. The group's line also holds the worker that
// served it, the version it was dispatched under and how long it took. The W&B monitor shows these as
// a table (docs/watching-a-run.md). A line is written whole; a resume drops a partial last line first.
//
// The newest samples of every scored group (logged or not) are also kept in memory for the live
// page's table (GET /api/samples).
//
// Thread-safety: the event loop's thread only.
#include <cstdint>
#include <cstdio>
#include <deque>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "orchestrator/group.h"

namespace arlo::session {

// One scored group as its rollouts.jsonl line (without "time").
nlohmann::json rollout_record(const orch::Group& g);

// One sample of `g` as a row of the live page's table: step, group, sample, version, worker, prompt,
// completion (or turns), reward, finish reason; texts cut to `max_chars` (marked with "...").
nlohmann::json sample_row(const orch::Group& g, std::size_t sample, std::size_t max_chars);

// A rollouts.jsonl line read back (`arlo replay`): the task (id, env, prompt or chat messages, answer,
// info) and each sample as reward modules see it (task id, index, completion text, finish reason,
// version spans, worker, turns, turn versions, env reward). The line keeps token counts, not ids:
// completion_tokens holds that many 0 ids, loss_mask and logprobs stay empty. kInvalidArgument naming
// the field when one is missing or of the wrong type.
struct StoredGroup {
  Task task;
  std::vector<Sample> samples;
};
Result<StoredGroup> parse_rollout_record(const nlohmann::json& rec);

class RolloutLog {
 public:
  static constexpr std::size_t kRecentSamples = 20;  // rows the live page shows
  static constexpr std::size_t kRowChars = 600;      // per text cell

  RolloutLog() = default;  // off
  ~RolloutLog();
  RolloutLog(const RolloutLog&) = delete;
  RolloutLog& operator=(const RolloutLog&) = delete;

  // Appends to <run_dir>/rollouts.jsonl; `every` 0 (or no run dir) keeps it off.
  Status open(const std::string& run_dir, int every);
  // Writes `g` when its id is a multiple of `every`; `wall_time` is unix seconds. Keeps its samples
  // among the newest (on or off).
  void add(const orch::Group& g, double wall_time);
  // The newest kRecentSamples samples' rows, newest first (GET /api/samples).
  nlohmann::json recent() const;

 private:
  std::FILE* file_ = nullptr;
  int every_ = 0;
  std::deque<nlohmann::json> recent_;  // oldest at the front
};

}  // namespace arlo::session
