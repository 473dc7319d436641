#pragma once
// rollouts.jsonl in the run directory: samples people can read. One JSON object per line for every
// `every`-th scored train group (by group id, so which groups are logged does not depend on timing):
// the task's prompt, and per sample its completion text, reward, advantage, each reward module's
// scores, token count, finish reason and version spans; the worker that served it, the version it
// was dispatched under and how long it took. The W&B monitor shows these as a table
// (docs/watching-a-run.md). A line is written whole; a resume drops a partial last line first.
//
// Thread-safety: the event loop's thread only.
#include <cstdint>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "orchestrator/group.h"

namespace arlo::session {

// One scored group as its rollouts.jsonl line (without "time").
nlohmann::json rollout_record(const orch::Group& g);

class RolloutLog {
 public:
  RolloutLog() = default;  // off
  ~RolloutLog();
  RolloutLog(const RolloutLog&) = delete;
  RolloutLog& operator=(const RolloutLog&) = delete;

  // Appends to <run_dir>/rollouts.jsonl; `every` 0 (or no run dir) keeps it off.
  Status open(const std::string& run_dir, int every);
  // Writes `g` when its id is a multiple of `every`; `wall_time` is unix seconds.
  void add(const orch::Group& g, double wall_time);

 private:
  std::FILE* file_ = nullptr;
  int every_ = 0;
};

}  // namespace arlo::session
