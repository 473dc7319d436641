#include "orchestrator/eval_sink.h"

#include <algorithm>

#include "common/log.h"

namespace arlo::orch {

double pass_at_k(int n, int c, int k) {
  if (n <= 0 || k <= 0 || k > n) return 0.0;
  if (n - c < k) return 1.0;
  // C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
  double ratio = 1.0;
  for (int i = n - c + 1; i <= n; ++i) ratio *= 1.0 - static_cast<double>(k) / static_cast<double>(i);
  return 1.0 - ratio;
}

EvalSink::EvalSink(asio::any_io_executor ex, Clock& clock, ScorerPort& scorer, Ledger& ledger, const Options& options,
                   std::vector<Task> eval_tasks, Enqueue enqueue, std::function<void(const EvalReport&)> on_report)
    : ex_(ex),
      clock_(clock),
      scorer_(scorer),
      ledger_(ledger),
      opt_(options),
      enqueue_(std::move(enqueue)),
      on_report_(std::move(on_report)),
      done_(ex) {
  for (auto& t : eval_tasks) tasks_.push_back(std::make_shared<const Task>(std::move(t)));
}

void EvalSink::start(std::int64_t step) {
  if (tasks_.empty() || stopped_) return;
  if (running_) {
    queued_.push_back(step);
    return;
  }
  begin(step);
}

void EvalSink::begin(std::int64_t step) {
  running_ = true;
  step_ = step;
  ++eval_id_;
  started_ = clock_.now();
  outstanding_ = tasks_.size();
  results_.clear();
  ARLO_INFO("eval: policy v{}: {} tasks x {} samples", step, tasks_.size(), opt_.eval_samples);
  enqueue_(eval_id_, tasks_, opt_.eval_samples);
}

void EvalSink::add(GroupPtr g) {
  if (!running_ || g->eval_id != eval_id_) {
    ledger_.dispose("eval_orphan", g->completions.size());
    return;
  }
  spawn(ex_, score(std::move(g)));
}

void EvalSink::lost(GroupPtr g) {
  if (!running_ || g->eval_id != eval_id_) return;
  record({g->task->env, {}, true});
}

Awaitable<void> EvalSink::score(GroupPtr g) {
  std::shared_ptr<const std::vector<Sample>> completions(g, &g->completions);
  auto op = scorer_.score(g->task, std::move(completions));
  const auto deadline = clock_.now() + opt_.score_timeout;
  auto r = co_await with_deadline<ScoredGroup>(ex_, clock_, deadline, std::move(op), "score eval group");
  const auto n = g->completions.size();
  ledger_.dispose("eval", n);
  if (!r || r->rewards.size() != n) {
    ARLO_WARN_EVERY(5.0, "eval: task {} left out: {}", g->task->id, r ? "reward count mismatch" : r.error().what());
    record({g->task->env, {}, true});
  } else {
    record({g->task->env, std::move(r->rewards), false});
  }
}

void EvalSink::record(TaskResult r) {
  results_.push_back(std::move(r));
  if (--outstanding_ == 0) finish();
}

void EvalSink::finish() {
  EvalReport report;
  report.eval_id = eval_id_;
  report.step = step_;
  report.samples_per_task = opt_.eval_samples;
  report.seconds = std::chrono::duration<double>(clock_.now() - started_).count();
  std::map<std::string, std::pair<double, std::size_t>> reward_sum;
  std::map<std::string, std::map<int, double>> pass_sum;
  for (const auto& r : results_) {
    auto& e = report.envs[r.env];
    if (r.failed) {
      ++e.failed_groups;
      continue;
    }
    ++e.tasks;
    int correct = 0;
    for (double x : r.rewards) {
      reward_sum[r.env].first += x;
      ++reward_sum[r.env].second;
      if (x >= opt_.eval_correct_threshold) ++correct;
    }
    for (int k : opt_.eval_pass_k) pass_sum[r.env][k] += pass_at_k(static_cast<int>(r.rewards.size()), correct, k);
  }
  for (auto& [env, e] : report.envs) {
    const auto& [sum, count] = reward_sum[env];
    e.avg = count ? sum / static_cast<double>(count) : 0.0;
    for (int k : opt_.eval_pass_k) e.pass_at[k] = e.tasks ? pass_sum[env][k] / e.tasks : 0.0;
  }
  reports_.push_back(report);
  running_ = false;
  if (on_report_) on_report_(report);
  if (!queued_.empty() && !stopped_) {
    const auto next = queued_.front();
    queued_.pop_front();
    begin(next);
    return;
  }
  done_.notify();
}

Awaitable<void> EvalSink::wait_done() {
  while (busy()) co_await done_.wait();
}

void EvalSink::stop() {
  stopped_ = true;
  queued_.clear();
  if (!running_) done_.notify();
}

}  // namespace arlo::orch
