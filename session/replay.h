#pragma once
// `arlo replay RUN_DIR`: scores the samples a run stored in rollouts.jsonl again with a reward
// configuration (to debug a reward: what would this change have given on these very samples?),
// without generating anything. Each line's task and samples are read back (parse_rollout_record),
// scored group by group through rollout::RewardScorer (timeouts and reward.on_failure as in a run),
// and compared per reward module with the scores the run stored. replay.jsonl gets one line per
// sample with its old and new reward and module scores.
//
// The run's configuration: `arlo run` writes it resolved to RUN_DIR/resolved_config.yaml
// (write_run_config), which replay reads unless given another.
//
// Thread-safety: one replay per call, on the caller's thread (the scorer's threads run the modules).
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "config/config.h"
#include "rollout/reward.h"
#include "rollout/reward_scorer.h"

namespace arlo::session {

inline constexpr const char* kRunConfigFile = "resolved_config.yaml";

// Writes `cfg` resolved to <run_dir>/resolved_config.yaml, readable by its owner only (it may hold
// security.token).
Status write_run_config(const std::string& run_dir, const config::Config& cfg);

// reward.timeout_s, reward.on_failure and reward.failure_value as the scorer's options.
rollout::ScorerOptions replay_scorer_options(const config::Config& cfg);

struct ReplayOptions {
  std::string rollouts;  // the rollouts.jsonl to read
  std::string output;    // the replay.jsonl to write (replaced)
  // Called after each group with the groups scored and the total (progress on long replays).
  std::function<void(std::size_t done, std::size_t total)> progress;
};

// Mean of one module's reward (or "reward", the total) over the samples that have one.
struct MeanChange {
  double old_sum = 0;
  std::size_t old_n = 0;
  double new_sum = 0;
  std::size_t new_n = 0;
  double old_mean() const { return old_n ? old_sum / static_cast<double>(old_n) : 0.0; }
  double new_mean() const { return new_n ? new_sum / static_cast<double>(new_n) : 0.0; }
};

struct ReplaySummary {
  std::size_t groups = 0;
  std::size_t samples = 0;
  std::size_t failed = 0;                     // samples whose scoring failed now (reward/failed, or left unscored)
  std::vector<std::string> warnings;          // a partial last line that was skipped
  std::map<std::string, MeanChange> modules;  // "<module>" per module; "reward" the weighted total
};

// Scores every group of options.rollouts with `module` and writes options.output. Errors: the file
// cannot be read, a line that is not a group (kInvalidArgument naming "<file>:<line>"; a partial last
// line, what a killed run leaves, is skipped with a warning instead), the `fail` policy's error (with
// its line). Nothing is scored when a line is bad.
Result<ReplaySummary> replay_rollouts(std::shared_ptr<rollout::RewardModule> module,
                                      const rollout::ScorerOptions& scorer, const ReplayOptions& options);

// The summary as lines for people: per module the old and the new mean, the samples counted.
std::string format_replay_summary(const ReplaySummary& s);

}  // namespace arlo::session
