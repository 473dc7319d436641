#pragma once
// Runs a RewardModule for whole groups off the event loop, each call under a timeout, and applies
// the failure policy when a call fails, throws, hangs past its timeout or returns a non-finite value:
//   assign: the sample gets `assign_value` and metric "reward/failed" = 1
//   drop:   the sample's reward stays unset (callers treat it as dropped, not trained on)
//   fail:   score_group returns the error; the orchestrator stops the run with it
// Whatever the policy, score_group returns an error when a call ended with kCancelled (no verdict:
// a process-isolated plugin's host died under it; the caller drops the group) or when the module is
// no longer usable() (kResourceExhausted; the caller stops the run).
// Thread-safety: construct and call on the loop's thread. The module runs on worker threads.
#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/async/abandonable_executor.h"
#include "common/async/clock.h"
#include "common/result.h"
#include "rollout/reward.h"

namespace arlo::rollout {

enum class FailurePolicy { kAssign, kDrop, kFail };
Result<FailurePolicy> parse_failure_policy(std::string_view name);  // assign | drop | fail

struct ScorerOptions {
  Duration timeout = std::chrono::seconds(30);  // per call (per sample, or per group for group modules)
  FailurePolicy on_failure = FailurePolicy::kAssign;
  double assign_value = 0.0;
  std::size_t threads = 2;
  std::size_t max_abandoned = 16;  // stuck calls tolerated before new calls fail fast
  arlo::Clock* clock = nullptr;    // the clock `timeout` runs on (the loop's); null: real time
};

struct ScorerStats {
  std::uint64_t calls = 0;
  std::uint64_t scored = 0;  // samples that got a module reward
  std::uint64_t failed = 0;  // samples whose call failed (any reason)
  std::uint64_t timeouts = 0;
  std::uint64_t non_finite = 0;
  std::uint64_t assigned = 0;     // failed samples given assign_value
  std::uint64_t dropped = 0;      // failed samples left unscored
  std::uint64_t groups_lost = 0;  // groups failed whole: a call ended without a verdict (kCancelled)
};

// What the scorer made of one sample: its reward (the sample's own until scored; unset when the
// `drop` policy left it unscored or its group was lost) and the metrics to add to the sample's.
struct SampleScore {
  std::optional<double> reward;
  std::map<std::string, double> metrics;
};

class RewardScorer {
 public:
  RewardScorer(boost::asio::io_context& loop, std::shared_ptr<RewardModule> module, ScorerOptions options);

  // Scores a complete group in place (reward, metrics). Samples are scored
  // concurrently. Returns an error only under the `fail` policy.
  boost::asio::awaitable<Status> score_group(const Task& task, std::vector<Rollout>& group);
  // The same for a group the caller shares: the modules read its samples where they are, on their
  // threads (no copy), and `out` gets one SampleScore per sample. A call abandoned past its timeout
  // holds `group` until it returns: the caller changes the samples only once it holds them alone.
  boost::asio::awaitable<Status> score_shared(std::shared_ptr<const Task> task,
                                              std::shared_ptr<const std::vector<Rollout>> group,
                                              std::vector<SampleScore>& out);

  const ScorerStats& stats() const { return stats_; }
  const RewardModule& module() const { return *module_; }

 private:
  boost::asio::awaitable<Status> score_whole_group(std::shared_ptr<const Task> task,
                                                   std::shared_ptr<const std::vector<Rollout>> group,
                                                   std::vector<SampleScore>& out);
  Status handle_failure(const Rollout& r, const Error& e, SampleScore& out);
  Status apply(const std::vector<Rollout>& group, std::vector<Result<Score>>& results, std::vector<SampleScore>& out);
  Status apply_shared(const std::vector<Rollout>& group, Result<std::shared_ptr<std::vector<Score>>>& shared,
                      std::vector<SampleScore>& out);
  Status apply_group(const std::vector<Rollout>& group, Result<std::vector<Score>>& scores,
                     std::vector<SampleScore>& out);

  boost::asio::io_context& loop_;
  std::shared_ptr<RewardModule> module_;
  ScorerOptions options_;
  AbandonableExecutor executor_;
  ScorerStats stats_;
};

}  // namespace arlo::rollout
