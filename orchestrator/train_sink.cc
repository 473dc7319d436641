#include "orchestrator/train_sink.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/log.h"

namespace arlo::orch {

namespace {
double seconds(Duration d) { return std::chrono::duration<double>(d).count(); }

Version oldest_of(const Completion& c, Version fallback) {
  Version v = kNoVersion;
  for (const auto& s : c.spans)
    if (v == kNoVersion || s.version < v) v = s.version;
  return v == kNoVersion ? fallback : v;
}

std::vector<std::int32_t> per_token_versions(const Completion& c, Version fallback) {
  std::vector<std::int32_t> out(c.tokens.size(), static_cast<std::int32_t>(fallback));
  for (std::size_t i = 0; i < c.spans.size(); ++i) {
    const auto begin = static_cast<std::size_t>(std::max<std::int64_t>(0, c.spans[i].first_token));
    const auto end = i + 1 < c.spans.size() ? static_cast<std::size_t>(c.spans[i + 1].first_token) : out.size();
    for (std::size_t t = begin; t < std::min(end, out.size()); ++t)
      out[t] = static_cast<std::int32_t>(c.spans[i].version);
  }
  return out;
}
}  // namespace

TrainSink::TrainSink(asio::any_io_executor ex, Clock& clock, ScorerPort& scorer, TrainerPort& trainer,
                     TaskSource& tasks, Ledger& ledger, const Options& options, TrainSinkHooks hooks)
    : ex_(ex),
      clock_(clock),
      scorer_(scorer),
      trainer_(trainer),
      tasks_(tasks),
      ledger_(ledger),
      opt_(options),
      hooks_(std::move(hooks)),
      ready_signal_(ex) {}

void TrainSink::add(GroupPtr group) {
  if (stopped_) {
    ledger_.dispose("unused_at_drain", group->completions.size());
    return;
  }
  ++scoring_;
  in_scoring_.push_back(group);
  spawn(ex_, score(std::move(group)));
}

Awaitable<void> TrainSink::score(GroupPtr g) {
  std::shared_ptr<const std::vector<Completion>> completions(g, &g->completions);
  auto op = scorer_.score(g->task, std::move(completions));
  const auto deadline = clock_.now() + opt_.score_timeout;
  auto r = co_await with_deadline<ScoredGroup>(ex_, clock_, deadline, std::move(op), "score group");
  --scoring_;
  std::erase(in_scoring_, g);
  auto n = g->completions.size();
  if (stopped_) {
    ledger_.dispose("unused_at_drain", n);
    co_return;
  }
  if (r && (r->rewards.size() != n || r->advantages.size() != n || (!r->fates.empty() && r->fates.size() != n)))
    r = make_error(ErrorCode::kMismatch,
                   fmt::format("scorer returned {} rewards / {} advantages / {} fates for {} samples",
                               r->rewards.size(), r->advantages.size(), r->fates.size(), n));
  if (!r) {
    ARLO_WARN_EVERY(5.0, "train sink: dropping group {}: {}", g->id, r.error().what());
    ledger_.dispose("score_failed", n);
    // A scorer that cannot go on (kResourceExhausted: a reward plugin's host past its restart bound) stops the run.
    if (r.error().code() == ErrorCode::kResourceExhausted && hooks_.on_fatal) {
      hooks_.on_fatal(r.error());
      co_return;
    }
    if (hooks_.backlog_changed) hooks_.backlog_changed();
    co_return;
  }
  g->scores = std::move(*r);
  if (hooks_.on_scored) hooks_.on_scored(*g);
  if (take_out_dropped(*g) == 0) {
    if (hooks_.backlog_changed) hooks_.backlog_changed();
    co_return;
  }
  n = g->completions.size();
  const auto& rw = g->scores.rewards;
  const bool equal = n > 1 && std::all_of(rw.begin(), rw.end(), [&](double x) { return x == rw[0]; });
  if (opt_.filter_equal_reward_groups && equal) {
    if (filtered_groups_since_cut_ < opt_.filter_budget_groups()) {
      ledger_.dispose("filtered", n);
      filtered_since_cut_ += static_cast<int>(n);
      ++filtered_groups_since_cut_;
      if (hooks_.backlog_changed) hooks_.backlog_changed();
      co_return;
    }
    // Budget spent: keep it (zero advantage, no gradient) so the step is not starved of groups.
    ARLO_WARN_EVERY(30.0,
                    "train sink: {} equal-reward groups dropped since the last step "
                    "(orchestrator.max_filtered_groups_per_step); training on further ones with zero advantage. "
                    "Are the tasks too easy or too hard for the policy?",
                    filtered_groups_since_cut_);
    std::fill(g->scores.advantages.begin(), g->scores.advantages.end(), 0.0);
  }
  ready_.push_back(std::move(g));
  ready_signal_.notify();
}

// orchestrator.overlong: drop. The samples the scorer dropped leave the group before the filter and
// the batch see it, counted "overlong" in the ledger: never sent to the trainer. Returns how many are left.
std::size_t TrainSink::take_out_dropped(Group& g) {
  auto& s = g.scores;
  if (s.fates.empty()) return g.completions.size();
  const bool per_sample_metrics = s.metrics.size() == s.fates.size();
  std::size_t kept = 0;
  for (std::size_t i = 0; i < s.fates.size(); ++i) {
    if (s.fates[i] == SampleFate::kDropped) continue;
    if (kept != i) {
      g.completions[kept] = std::move(g.completions[i]);
      s.rewards[kept] = s.rewards[i];
      s.advantages[kept] = s.advantages[i];
      s.fates[kept] = s.fates[i];
      if (per_sample_metrics) s.metrics[kept] = std::move(s.metrics[i]);
    }
    ++kept;
  }
  if (const auto dropped = s.fates.size() - kept; dropped > 0) ledger_.dispose("overlong", dropped);
  g.completions.resize(kept);
  s.rewards.resize(kept);
  s.advantages.resize(kept);
  s.fates.resize(kept);
  if (per_sample_metrics) s.metrics.resize(kept);
  return kept;
}

Version TrainSink::oldest_queued_version() const {
  Version v = kNoVersion;
  for (const auto& g : ready_) {
    const auto o = g->oldest_version();
    if (v == kNoVersion || o < v) v = o;
  }
  return v;
}

Awaitable<Result<TrainBatch>> TrainSink::cut_rl(std::int64_t step, StepReport& report) {
  const Version min_ok = step - 1 - opt_.max_off_policy_steps;
  const auto gps = static_cast<std::size_t>(opt_.groups_per_step());
  const auto t0 = clock_.now();
  while (true) {
    // Staleness is judged now, at the cut: a group that waited in the queue is as old as its tokens.
    bool dropped = false;
    for (auto it = ready_.begin(); it != ready_.end();) {
      if ((*it)->oldest_version() < min_ok) {
        ledger_.dispose("stale", (*it)->completions.size());
        report.stale_samples += static_cast<int>((*it)->completions.size());
        it = ready_.erase(it);
        dropped = true;
      } else {
        ++it;
      }
    }
    if (dropped && hooks_.backlog_changed) hooks_.backlog_changed();
    if (ready_.size() >= gps) break;
    if (stopped_) co_return make_error(ErrorCode::kCancelled, "train sink stopped");
    co_await ready_signal_.wait();
  }
  report.wait_for_rollouts_seconds = seconds(clock_.now() - t0);

  TrainBatch batch;
  batch.step = step;
  double sum = 0, sumsq = 0, off_sum = 0, off_max = 0;
  std::uint64_t trained = 0, masked = 0;
  Version vmin = kNoVersion, vmax = kNoVersion;
  for (std::size_t gi = 0; gi < gps; ++gi) {
    auto g = std::move(ready_.front());
    ready_.pop_front();
    for (std::size_t i = 0; i < g->completions.size(); ++i) {
      const auto& c = g->completions[i];
      TrainSample s;
      s.prompt_tokens = g->prompt_tokens;
      s.completion_tokens = c.tokens;
      s.logprobs = c.logprobs;
      s.logprobs.resize(c.tokens.size(), 0.0f);
      s.token_versions = per_token_versions(c, g->dispatch_version);
      s.reward = g->scores.rewards[i];
      s.advantage = g->scores.advantages[i];
      s.loss_masked = i < g->scores.fates.size() && g->scores.fates[i] == SampleFate::kMasked;
      (s.loss_masked ? masked : trained) += 1;
      const auto oldest = oldest_of(c, g->dispatch_version);
      const double off = static_cast<double>(std::max<Version>(0, (step - 1) - oldest));
      off_sum += off;
      off_max = std::max(off_max, off);
      const auto d = static_cast<std::size_t>(off);
      if (report.off_policy_histogram.size() <= d) report.off_policy_histogram.resize(d + 1, 0);
      ++report.off_policy_histogram[d];
      if (i < g->scores.metrics.size())
        for (const auto& [k, val] : g->scores.metrics[i]) report.reward_metrics[k] += val;
      vmin = vmin == kNoVersion ? oldest : std::min(vmin, oldest);
      vmax = std::max(vmax, oldest);
      sum += s.reward;
      sumsq += s.reward * s.reward;
      report.batch_tokens += c.tokens.size() + g->prompt_tokens.size();
      batch.samples.push_back(std::move(s));
    }
  }
  ledger_.dispose("trained", trained);
  if (masked > 0) ledger_.dispose("masked", masked);
  const double n = static_cast<double>(batch.samples.size());
  report.samples = static_cast<int>(trained);
  report.masked_samples = static_cast<int>(masked);
  report.reward_mean = sum / n;
  report.reward_std = std::sqrt(std::max(0.0, sumsq / n - report.reward_mean * report.reward_mean));
  report.off_policy_mean = off_sum / n;
  report.off_policy_max = off_max;
  for (auto& [k, total] : report.reward_metrics) total /= n;
  batch.metadata = {{"step", step},
                    {"samples", batch.samples.size()},
                    {"reward_mean", report.reward_mean},
                    {"oldest_version", vmin},
                    {"newest_oldest_version", vmax},
                    {"off_policy_mean", report.off_policy_mean},
                    {"off_policy_max", report.off_policy_max}};
  co_return batch;
}

Result<TrainBatch> TrainSink::cut_sft(std::int64_t step, StepReport& report) {
  TrainBatch batch;
  batch.step = step;
  report.supervised = true;
  for (int i = 0; i < opt_.batch_size; ++i) {
    ARLO_ASSIGN_OR_RETURN(auto task, tasks_.next());
    if (task.prompt_tokens.empty() || task.answer_tokens.empty())
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("sft warm-up: task {} has no prompt or answer token ids; the task source must "
                                    "tokenize reference answers when orchestrator.sft_warmup_steps > 0",
                                    task.id));
    TrainSample s;
    s.prompt_tokens = std::move(task.prompt_tokens);
    s.completion_tokens = std::move(task.answer_tokens);
    s.logprobs.assign(s.completion_tokens.size(), 0.0f);
    s.token_versions.assign(s.completion_tokens.size(), static_cast<std::int32_t>(step - 1));
    s.supervised = true;
    report.batch_tokens += s.prompt_tokens.size() + s.completion_tokens.size();
    batch.samples.push_back(std::move(s));
  }
  report.samples = static_cast<int>(batch.samples.size());
  batch.metadata = {{"step", step}, {"samples", batch.samples.size()}, {"supervised", true}};
  return batch;
}

Awaitable<void> TrainSink::run(std::int64_t start_step) {
  steps_cut_ = start_step;
  for (std::int64_t step = start_step + 1; step <= opt_.max_steps && !stopped_; ++step) {
    StepReport report;
    report.step = step;
    Result<TrainBatch> batch = make_error(ErrorCode::kInternal, "unset");
    if (step <= opt_.sft_warmup_steps) {
      batch = cut_sft(step, report);
    } else {
      batch = co_await cut_rl(step, report);
    }
    if (!batch) {
      if (batch.error().code() != ErrorCode::kCancelled && hooks_.on_fatal) hooks_.on_fatal(batch.error());
      co_return;
    }
    report.filtered_samples = filtered_since_cut_;
    filtered_since_cut_ = 0;
    filtered_groups_since_cut_ = 0;
    // The groups are consumed now: the gate counts this step as cut before the trainer accepts it,
    // so back-pressure cannot make the dispatcher run ahead.
    steps_cut_ = step;
    if (hooks_.on_cut) hooks_.on_cut(step);
    const auto t0 = clock_.now();
    auto waiting = std::make_shared<bool>(true);
    if (opt_.trainer_alarm > Duration::zero()) spawn(ex_, alarm_while_waiting(step, t0, waiting));
    // Accepted, past the deadline, or abandoned (abandon()): whichever comes first.
    Promise<Status> done(ex_);
    sending_ = done;
    std::unique_ptr<Timer> deadline;
    if (opt_.trainer_timeout > Duration::zero())
      deadline = clock_.schedule(t0 + opt_.trainer_timeout, [done]() mutable {
        done.set(make_error(ErrorCode::kTimeout,
                            "the trainer accepting the batch (trainer.accept_timeout_s): deadline expired"));
      });
    spawn(ex_, [done, op = trainer_.send(std::move(*batch))]() mutable -> Awaitable<void> {
      auto r = co_await std::move(op);
      done.set(std::move(r));
    });
    Status sent = co_await done.get();
    sending_.reset();
    if (deadline) deadline->cancel();
    *waiting = false;
    report.send_seconds = seconds(clock_.now() - t0);
    if (!sent) {
      if (hooks_.on_fatal) hooks_.on_fatal(Error(sent.error()).with_context(fmt::format("sending batch {}", step)));
      co_return;
    }
    if (hooks_.on_step) hooks_.on_step(report);
  }
}

// A trainer that takes long to accept a batch is back-pressure or a trainer gone silent: say so
// every trainer_alarm while it lasts.
Awaitable<void> TrainSink::alarm_while_waiting(std::int64_t step, TimePoint since, std::shared_ptr<bool> waiting) {
  while (*waiting && !stopped_) {
    co_await sleep_until(ex_, clock_, clock_.now() + opt_.trainer_alarm);
    if (!*waiting || stopped_) break;
    ++trainer_alarms_;
    ARLO_WARN(
        "train sink: the trainer has not accepted the batch for step {} for {:.0f} s (it is slow, or gone silent; "
        "the run stops after trainer.accept_timeout_s)",
        step, seconds(clock_.now() - since));
  }
}

void TrainSink::abandon(const Error& why) {
  stop();
  if (sending_) sending_->set(std::unexpected(why));
}

void TrainSink::stop() {
  if (stopped_) return;
  stopped_ = true;
  for (auto& g : ready_) ledger_.dispose("unused_at_drain", g->completions.size());
  ready_.clear();
  ready_signal_.notify();
}

std::vector<Task> TrainSink::unbatched_tasks() const {
  std::vector<Task> out;
  for (const auto& g : ready_) out.push_back(*g->task);
  for (const auto& g : in_scoring_) out.push_back(*g->task);
  return out;
}

}  // namespace arlo::orch
