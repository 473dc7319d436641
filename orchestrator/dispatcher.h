#pragma once
// RolloutDispatcher: keeps up to `max_inflight` rollouts in flight as whole groups, obeying the
// dispatch gate (docs/architecture.md, "Versions and staleness"):
//   a train group serving step s is dispatched only while (s - 1) - version <= max_async_level,
// where s = max(steps_cut, sft_warmup_steps) + 1 + (train groups in flight + finished but not yet
// batched) / groups_per_step. Eval groups go first and bypass the gate (not the in-flight bound).
//
// It owns every rollout from dispatch until it ends (completed / failed / cancelled, recorded in
// the Ledger exactly once), merges continuations after an abort-mode weight update, and hands
// complete groups to the sinks through hooks. Event-driven: pump() dispatches what is allowed now
// and is called after every change that can open the gate.
//
// Multi-turn trajectories (a task EnvironmentPort::multi_turn says so): the environment's reset
// runs before the group's first request; after each model turn of a sample its step runs, and the
// next turn is a continuation (prompt = the group's prompt ids + every token of the sample so far:
// token-in/token-out), until the environment says done, max_turns or max_trajectory_tokens. An
// environment that fails or times out fails that sample ("env_<code>"), never the run.
//
// Threading: the io_context thread only. Lifetime: must outlive the io_context's pending handlers
// (the Orchestrator destroys the io_context's work first).
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/async/coro.h"
#include "orchestrator/group.h"
#include "orchestrator/ledger.h"
#include "orchestrator/options.h"
#include "orchestrator/ports.h"

namespace arlo::orch {

struct DispatcherHooks {
  std::function<void(GroupPtr)> on_train_group;      // a complete train group (all samples completed)
  std::function<void(GroupPtr)> on_eval_group;       // a complete eval group
  std::function<void(GroupPtr)> on_eval_group_lost;  // an eval group that failed or was cancelled
  std::function<std::int64_t()> backlog_groups;      // train groups finished but not yet batched
  std::function<void(Error)> on_fatal;               // e.g. the task source failed
};

class RolloutDispatcher {
 public:
  // `environment` may be null: every task is single-turn.
  RolloutDispatcher(asio::any_io_executor ex, Clock& clock, InferencePort& inference, TaskSource& tasks, Ledger& ledger,
                    const Options& options, DispatcherHooks hooks, EnvironmentPort* environment = nullptr);

  // Dispatches everything allowed now: continuations, then eval groups, then train groups.
  void pump();

  void on_version(Version v);           // the version all workers now serve
  void on_step_cut(std::int64_t step);  // the batch for `step` has been cut
  void hold(bool on);                   // weight update in progress: dispatch nothing new
  void start_draining();                // max_steps reached: no new train groups
  // Ends every unfinished rollout of the matching groups as cancelled(reason) and cancels their
  // requests. Late results are ignored.
  void cancel_train(const std::string& reason);
  void cancel_all(const std::string& reason);

  void enqueue_eval(std::uint64_t eval_id, const std::vector<std::shared_ptr<const Task>>& tasks, int samples);
  // Resume: these tasks are dispatched before new ones are drawn from the source.
  void requeue(std::vector<Task> tasks);
  // Tasks of train groups not yet complete (for the checkpoint: they are re-dispatched on resume).
  std::vector<Task> unfinished_train_tasks() const;

  // Completes when no request is outstanding (wait mode drains before swapping weights).
  Awaitable<void> wait_idle();

  std::int64_t inflight_samples() const { return inflight_samples_; }
  std::int64_t inflight_train_groups() const { return inflight_train_groups_; }
  std::int64_t outstanding_requests() const { return outstanding_requests_; }
  Version version() const { return version_; }
  std::int64_t steps_cut() const { return steps_cut_; }
  bool held() const { return held_; }
  // The step the next train group would serve.
  std::int64_t next_target_step() const;
  // Whether the version gate (alone) currently stops train dispatch.
  bool blocked_by_version() const;
  std::uint64_t completion_tokens_total() const { return completion_tokens_; }
  // Multi-turn trajectories: model turns completed so far, trajectories ended (completed, failed or
  // cancelled), and samples failed by their environment (reset or step error or timeout).
  std::uint64_t model_turns_total() const { return model_turns_; }
  std::uint64_t trajectories_total() const { return trajectories_; }
  std::uint64_t env_failed_total() const { return env_failed_; }
  // Trajectories their environment ended early, by its reason (EnvReply::ended_because), so far.
  const std::map<std::string, std::uint64_t>& ended_because_total() const { return ended_because_; }
  // Seconds the version gate alone kept dispatch stopped (time/wait_for_policy_seconds).
  double wait_for_policy_seconds() const;

  std::string rng_state() const;
  Status restore_rng(const std::string& state);

 private:
  // kAwaitingEnv: a multi-turn sample whose environment call (the group's reset, or its step) is out.
  enum class SampleState { kInFlight, kAwaitingContinuation, kAwaitingEnv, kCompleted, kFailed, kCancelled };
  // Where a multi-turn sample stands: its model turns so far and where the current one began in
  // its completion_tokens (the per-turn max_tokens counts from there). A split trajectory's current
  // piece (EnvReply::restart_prompt) has its own `prompt` (empty: the group's), and `extra` counts
  // the tokens that prompt holds beyond the group's (max_trajectory_tokens counts them).
  struct TurnState {
    int model_turns = 0;
    std::size_t turn_start = 0;
    std::vector<std::int32_t> prompt;
    std::size_t extra = 0;
  };
  struct Record {
    GroupPtr group;
    std::vector<SampleState> states;
    int open = 0;  // samples not yet ended
    // Requests and environment calls out, by id (cancelled together).
    std::unordered_map<std::uint64_t, std::shared_ptr<asio::cancellation_signal>> requests;
    bool multi_turn = false;
    std::shared_ptr<const Task> source_task;  // as drawn (checkpoints), before a reset replaced its prompt
    std::vector<TurnState> turns;             // multi-turn only, per sample
  };
  static constexpr int kWholeGroup = -1;
  struct Continuation {
    std::uint64_t group_id;
    int sample;             // kWholeGroup: a multi-turn group's first turn, after its reset
    bool new_turn = false;  // multi-turn: the next model turn (else an aborted turn goes on)
  };
  struct EvalItem {
    std::uint64_t eval_id;
    std::shared_ptr<const Task> task;
    int samples;
  };

  bool train_allowed() const;
  Result<std::shared_ptr<const Task>> next_train_task();
  Record& create_group(RolloutKind kind, std::shared_ptr<const Task> task, int samples);
  void launch(Record& rec, std::vector<int> samples, std::vector<std::int32_t> prompt, std::int64_t max_tokens);
  Awaitable<void> run_request(std::uint64_t group_id, std::uint64_t request_id, std::vector<int> samples,
                              Version launch_version, GenerateRequest request,
                              std::shared_ptr<asio::cancellation_signal> cancel);
  void on_result(std::uint64_t group_id, std::uint64_t request_id, const std::vector<int>& samples,
                 Version launch_version, Result<GenerateResult> result);
  void launch_continuation(const Continuation& c);
  // A new group's first requests: at once, or after the environment's reset for a multi-turn task.
  void start_group(Record& rec, std::int64_t max_tokens);
  Awaitable<void> run_reset(std::uint64_t group_id, std::uint64_t call_id, std::shared_ptr<const Task> task,
                            std::shared_ptr<asio::cancellation_signal> cancel);
  void on_reset(std::uint64_t group_id, std::uint64_t call_id, Result<EnvReply> reply);
  void launch_group_turn(Record& rec);
  // A multi-turn sample's model turn ended (not aborted): record it and call the environment.
  void end_model_turn(Record& rec, int sample);
  Awaitable<void> run_step(std::uint64_t group_id, std::uint64_t call_id, int sample, std::shared_ptr<const Task> task,
                           std::shared_ptr<const Sample> trajectory, std::vector<std::int32_t> prompt,
                           std::shared_ptr<asio::cancellation_signal> cancel);
  void on_step(std::uint64_t group_id, std::uint64_t call_id, int sample, Result<EnvReply> reply);
  void apply_step(Record& rec, int sample, EnvReply&& reply);
  // The template did not extend the trajectory: its piece so far moves to Sample::split_segments
  // and it goes on from `restart_prompt`. False: no room left in max_trajectory_tokens.
  bool split(Record& rec, int sample, std::vector<std::int32_t> restart_prompt);
  // The prompt of a multi-turn sample's current piece: the group's, or its own after a split.
  const std::vector<std::int32_t>& prompt_of(const Record& rec, int sample) const;
  void complete_trajectory(Record& rec, int sample, FinishReason reason);
  std::int64_t turn_budget(const Record& rec, int sample) const;
  // Counts rejected rollouts; past Options::max_rejected_in_a_row, stops the run with `e`.
  void count_rejected(std::size_t samples, const Error& e);
  // The group's sampling: eval's, its source's (Options::source_sampling) or the run's.
  const SamplingParams& sampling_of(const Group& g) const;
  void end_sample(Record& rec, int sample, SampleState state, const std::string& reason = {});
  void maybe_finish(std::uint64_t group_id);
  void cancel_where(const std::string& reason, bool train_only);
  void update_wait_for_policy();

  asio::any_io_executor ex_;
  Clock& clock_;
  InferencePort& inference_;
  TaskSource& tasks_;
  Ledger& ledger_;
  const Options& opt_;
  DispatcherHooks hooks_;
  EnvironmentPort* environment_;
  Signal idle_;

  std::unordered_map<std::uint64_t, Record> groups_;
  std::deque<Continuation> continuations_;
  std::deque<EvalItem> eval_queue_;
  std::deque<Task> requeued_;
  std::mt19937_64 rng_;
  std::uint64_t next_group_id_ = 1;
  std::uint64_t next_request_id_ = 1;
  std::int64_t inflight_samples_ = 0;
  std::int64_t inflight_train_groups_ = 0;
  std::int64_t outstanding_requests_ = 0;
  std::uint64_t completion_tokens_ = 0;
  std::uint64_t model_turns_ = 0;
  int rejected_in_a_row_ = 0;  // rollouts the servers rejected (kInvalidArgument) since one completed
  std::uint64_t trajectories_ = 0;
  std::uint64_t env_failed_ = 0;
  std::map<std::string, std::uint64_t> ended_because_;
  Version version_;
  std::int64_t steps_cut_ = 0;
  bool held_ = false;
  bool draining_ = false;
  bool pumping_ = false;
  bool pump_posted_ = false;
  bool failed_source_ = false;
  bool version_blocked_ = false;
  TimePoint version_blocked_since_{};
  Duration version_blocked_total_{};
};

}  // namespace arlo::orch
