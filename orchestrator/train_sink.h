#pragma once
// TrainSink: scores finished train groups off the loop, filters them, keeps them in one bounded
// FIFO, and cuts the batch for each step in turn:
//   - steps 1..sft_warmup_steps: supervised batches built from the tasks' reference answers;
//   - later steps s: the first groups_per_step queued groups whose oldest token version is at least
//     s-1-max_off_policy_steps. The check runs when the batch is cut, so time spent queued counts;
//     stale groups are dropped whole.
// Each batch goes to the TrainerPort; its send() completing is the back-pressure.
//
// Threading: the io_context thread only; scoring runs wherever the ScorerPort puts it.
#include <boost/asio/any_io_executor.hpp>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/async/coro.h"
#include "orchestrator/group.h"
#include "orchestrator/ledger.h"
#include "orchestrator/options.h"
#include "orchestrator/ports.h"

namespace arlo::orch {

// What happened at one batch cut: the per-step figures of the console line and metrics.jsonl.
struct StepReport {
  std::int64_t step = 0;
  bool supervised = false;
  int samples = 0;           // in the batch and in the loss (train/samples/trainable)
  int masked_samples = 0;    // in the batch, out of the loss (orchestrator.overlong: mask)
  int filtered_samples = 0;  // dropped by the zero-variance filter since the previous cut
  int stale_samples = 0;     // dropped by the staleness bound at this cut
  double reward_mean = 0.0;
  double reward_std = 0.0;
  double off_policy_mean = 0.0;  // (s-1) - oldest token version, per sample
  double off_policy_max = 0.0;
  std::vector<int> off_policy_histogram;  // samples of the batch by off-policy distance 0, 1, 2, ...
  // Batch means of what the reward modules reported per sample ("<module>", "<module>/<metric>",
  // "reward/failed"); a sample that lacks a key counts as 0 for it.
  std::map<std::string, double> reward_metrics;
  std::uint64_t batch_tokens = 0;
  double wait_for_rollouts_seconds = 0.0;  // how long the cut waited for enough groups
  double send_seconds = 0.0;               // how long the trainer took to accept (back-pressure)
};

struct TrainSinkHooks {
  std::function<void(std::int64_t)> on_cut;        // the batch for a step was formed (groups consumed)
  std::function<void(const StepReport&)> on_step;  // after the batch was accepted by the trainer
  std::function<void(const Group&)> on_scored;     // a group's scores arrived (before any filter)
  std::function<void()> backlog_changed;           // a group left the backlog (dispatcher may refill)
  std::function<void(Error)> on_fatal;
};

class TrainSink {
 public:
  TrainSink(asio::any_io_executor ex, Clock& clock, ScorerPort& scorer, TrainerPort& trainer, TaskSource& tasks,
            Ledger& ledger, const Options& options, TrainSinkHooks hooks);

  // A complete train group (all samples completed). Scoring starts at once, off the loop.
  void add(GroupPtr group);
  // Train groups finished but not yet in a batch: being scored or queued.
  std::int64_t backlog_groups() const { return scoring_ + static_cast<std::int64_t>(ready_.size()); }
  std::int64_t queued_groups() const { return static_cast<std::int64_t>(ready_.size()); }
  std::int64_t scoring_groups() const { return scoring_; }
  std::int64_t steps_cut() const { return steps_cut_; }
  // Warnings so far that the trainer was slow to accept a batch (Options::trainer_alarm).
  std::uint64_t trainer_alarms() const { return trainer_alarms_; }
  // Oldest token version among queued groups (kNoVersion when empty), for the pipeline view.
  Version oldest_queued_version() const;

  // Cuts batches for steps start_step+1 .. max_steps. Returns after the last one is accepted, on
  // stop(), or on a fatal error (reported through on_fatal).
  Awaitable<void> run(std::int64_t start_step);
  // Stops run() and disposes of everything queued (unused_at_drain); groups still being scored
  // are disposed of when their scores arrive.
  void stop();
  // stop(), and a batch the trainer has not accepted yet is given up with `why` (the run ends on a
  // fatal error: a trainer that went silent would never take it; the journal keeps it for a resume).
  void abandon(const Error& why);
  // Tasks of queued and scoring groups (checkpoint: re-dispatched on resume).
  std::vector<Task> unbatched_tasks() const;

 private:
  Awaitable<void> score(GroupPtr group);
  std::size_t take_out_dropped(GroupPtr& group);
  Awaitable<Result<TrainBatch>> cut_rl(std::int64_t step, StepReport& report);
  Result<TrainBatch> cut_sft(std::int64_t step, StepReport& report);
  Awaitable<void> alarm_while_waiting(std::int64_t step, TimePoint since, std::shared_ptr<bool> waiting);

  asio::any_io_executor ex_;
  Clock& clock_;
  ScorerPort& scorer_;
  TrainerPort& trainer_;
  TaskSource& tasks_;
  Ledger& ledger_;
  const Options& opt_;
  TrainSinkHooks hooks_;
  Signal ready_signal_;

  std::deque<GroupPtr> ready_;
  std::vector<GroupPtr> in_scoring_;
  std::int64_t scoring_ = 0;
  std::int64_t steps_cut_ = 0;
  int filtered_since_cut_ = 0;         // samples, for the step report
  int filtered_groups_since_cut_ = 0;  // against Options::filter_budget_groups()
  bool stopped_ = false;
  std::optional<Promise<Status>> sending_;  // the send in flight (abandon() completes it)
  std::uint64_t trainer_alarms_ = 0;
};

}  // namespace arlo::orch
