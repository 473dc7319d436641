#pragma once
// Everything the orchestrator's components are configured by, as plain data. options_from_config()
// (config_options.h) fills it from the `orchestrator`, `sampling`, `eval`, `weight_sync`, `log`,
// `ckpt` and `status` config sections; tests fill it by hand.
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/result.h"
#include "orchestrator/types.h"

namespace arlo::orch {

struct Options {
  // --- orchestrator: the pipeline ---
  int batch_size = 64;                     // samples per training step; a multiple of group_size
  int group_size = 8;                      // samples per prompt, dispatched and dropped together
  int max_inflight = 256;                  // rollouts (samples) in flight at most
  int max_async_level = 1;                 // dispatch gate: (s-1) - version <= this; 0 = synchronous
  int max_off_policy_steps = 2;            // drop when oldest token version < s-1-this at batch cut
  std::int64_t max_steps = 100;            // trainer steps in total, warm-up included
  int sft_warmup_steps = 0;                // steps 1..this are supervised batches from reference answers
  int queue_capacity = 0;                  // finished rollouts awaiting a batch; 0 = auto
  bool filter_equal_reward_groups = true;  // drop groups whose rewards are all equal (no signal)
  int max_filtered_groups_per_step = 0;    // past this, equal-reward groups are kept; 0 = auto
  std::uint64_t seed = 0;                  // request seeds
  SamplingParams sampling;
  // Training sampling per task env (an env.sources item's name) where that source overrides the
  // sampling section (env.sources[].sampling); the others use `sampling`. Eval uses eval_sampling.
  std::map<std::string, SamplingParams> source_sampling;
  Duration request_timeout = std::chrono::minutes(10);
  Duration score_timeout = std::chrono::seconds(60);
  Duration trainer_timeout{};  // a batch not accepted by the trainer within this is fatal; 0 = no bound
  Duration trainer_alarm{};    // a warning every this while the trainer has not accepted (or is silent); 0 = none
  Duration trainer_silence_timeout{};  // a trainer not heard from (TrainerPort::on_alive) this long is fatal; 0 = wait
  Version initial_version = 0;         // the version workers hold at start; kNoVersion = wait for v0

  // --- multi-turn trajectories (env.max_turns ...; used only for tasks EnvironmentPort::multi_turn) ---
  // This many rollouts in a row rejected by the servers (HTTP 4xx: a prompt longer than the model's
  // context, a bad parameter, a wrong token) with none completed between them stop the run with the
  // last rejection: it cannot make progress. 0: never.
  int max_rejected_in_a_row = 1024;
  int max_turns = 8;                          // model turns per trajectory at most; then it ends (finish "length")
  std::int64_t max_trajectory_tokens = 1024;  // completion + environment tokens at most (then "length")
  Duration env_timeout = std::chrono::seconds(30);  // per reset / step call

  // --- weight updates ---
  PauseMode update_mode = PauseMode::kKeep;
  Duration admin_timeout = std::chrono::seconds(60);  // per admin call attempt
  int admin_attempts = 3;
  int version_attempts = 3;  // updates of one version a worker may fail before it is out of date for it
  Duration admin_backoff = std::chrono::milliseconds(500);  // doubled per attempt
  // Every worker pauses before any update of a round starts (weight_sync.topology chain: a relay
  // that does not answer is out of the round before anyone pulls from it); else each worker pauses,
  // updates and resumes on its own.
  bool pause_all_first = false;
  Duration drain_timeout = std::chrono::minutes(5);       // wait mode: in-flight drain bound
  Duration final_sync_timeout = std::chrono::minutes(5);  // at the end: wait for v max_steps

  // --- eval ---
  int eval_interval = 0;      // steps; 0 = only at start and end
  bool eval_at_start = true;  // the policy RL starts from (after the warm-up)
  bool eval_at_end = true;
  int eval_samples = 1;  // samples per eval task (n of pass@k)
  std::vector<int> eval_pass_k = {1};
  double eval_correct_threshold = 1.0;  // reward >= this counts as correct for pass@k
  SamplingParams eval_sampling{.temperature = 0.0};

  // --- log / ckpt / status ---
  double log_interval_s = 10.0;
  std::string run_name;               // shown on the status page
  std::string run_dir;                // metrics.jsonl and checkpoints; empty = write nothing
  bool console = true;                // a line per step
  bool progress = true;               // progress bar and ETA toward max_steps when stdout is a terminal
  double step_line_interval_s = 0.0;  // at most one console step line per this many seconds; 0 = every step
  int rollouts_every = 0;             // rollouts.jsonl: every n-th scored train group; 0 = none
  int ckpt_interval = 0;              // steps; 0 = never
  bool resume = false;
  int status_port = -1;  // Prometheus /metrics; -1 = off, 0 = any free port
  std::string status_bind = "127.0.0.1";
  std::string status_token;  // bearer token of the status server except /health (empty: open)
  Duration status_linger{};  // the status port stays open this long after the end

  int groups_per_step() const { return batch_size / group_size; }
  int queue_capacity_groups() const;
  int filter_budget_groups() const;  // max_filtered_groups_per_step, auto resolved
  // kInvalidArgument naming the first inconsistent option.
  Status validate() const;
};

}  // namespace arlo::orch
