// The Orchestrator's checkpoint and resume (orchestrator/checkpoint.h has the files and the
// protocol): what it saves at each batch cut, what it restores on resume, and the journaled steps it
// sends the trainer again before the steps after its checkpoint.
#include <fmt/format.h>

#include "common/log.h"
#include "orchestrator/checkpoint.h"
#include "orchestrator/orchestrator.h"

namespace arlo::orch {

// The data position after the cut of `step`: the tasks of batches <= step are out of it, every
// other task dispatched is pending (re-dispatched first on resume).
CheckpointState Orchestrator::checkpoint_state(std::int64_t step) const {
  CheckpointState s;
  s.step = step;
  s.version = dispatcher_->version();
  s.task_cursor = ports_.tasks->cursor();
  s.pending_tasks = train_sink_->unbatched_tasks();
  for (auto& t : dispatcher_->unfinished_train_tasks()) s.pending_tasks.push_back(std::move(t));
  s.rng = dispatcher_->rng_state();
  s.ledger = ledger_.to_json();
  return s;
}

Status Orchestrator::save_checkpoint(std::int64_t step) {
  if (opt_.run_dir.empty()) return ok();
  const auto s = checkpoint_state(step);
  ARLO_TRY(write_checkpoint(checkpoint_path(opt_.run_dir), s));
  ARLO_DEBUG("checkpoint: step {} ({} pending tasks)", step, s.pending_tasks.size());
  return ok();
}

Status Orchestrator::restore(std::int64_t& start_step) {
  if (opt_.run_dir.empty()) return make_error(ErrorCode::kInvalidArgument, "resume needs a run directory");
  ARLO_ASSIGN_OR_RETURN(auto state, read_checkpoint(checkpoint_path(opt_.run_dir)));
  if (!state) {
    ARLO_WARN("resume: no checkpoint under {}; starting at step 1", opt_.run_dir);
    return ok();
  }
  ARLO_ASSIGN_OR_RETURN(ledger_, Ledger::from_json_for_resume(state->ledger));
  ARLO_TRY(with_context(ports_.tasks->restore(state->task_cursor), "resume: restoring the task cursor"));
  ARLO_TRY(dispatcher_->restore_rng(state->rng));
  dispatcher_->requeue(std::move(state->pending_tasks));
  dispatcher_->on_step_cut(state->step);
  start_step = state->step;
  // The journaled steps (cut and checkpointed; the trainer may not have them for good): sent again
  // first, unchanged. The bridge and the trainer drop those the trainer has.
  ARLO_ASSIGN_OR_RETURN(resend_, read_journal(journal_dir(opt_.run_dir), state->step));
  if (!resend_.empty())
    ARLO_INFO("resume: sending the journaled steps {}..{} again before step {}", resend_.front().step,
              resend_.back().step, state->step + 1);
  ARLO_INFO("resume: continuing after step {} from {}", state->step, checkpoint_path(opt_.run_dir).string());
  return ok();
}

Awaitable<Status> Orchestrator::resend_journal() {
  auto batches = std::move(resend_);
  resend_.clear();
  for (auto& b : batches) {
    if (stop_requested_ || fatal_) break;
    const auto step = b.step;
    auto op = journal_ ? journal_->resend(std::move(b)) : ports_.trainer->send(std::move(b));
    Status sent = ok();
    if (opt_.trainer_timeout > Duration::zero()) {
      const auto deadline = ports_.clock->now() + opt_.trainer_timeout;
      sent = co_await with_deadline<void>(io_.get_executor(), *ports_.clock, deadline, std::move(op),
                                          "the trainer accepting a journaled batch (trainer.accept_timeout_s)");
    } else {
      sent = co_await std::move(op);
    }
    if (!sent)
      co_return std::unexpected(
          Error(sent.error()).with_context(fmt::format("resume: sending the journaled step {}", step)));
  }
  co_return ok();
}

}  // namespace arlo::orch
