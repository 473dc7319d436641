#pragma once
// EvalSink: runs the eval set (every task, `eval_samples` samples each, eval sampling) when asked,
// scores the groups off the loop, and reports per environment avg@n (mean reward over all
// samples) and unbiased pass@k (1 - C(n-c, k) / C(n, k), averaged over tasks; a sample is correct
// when its reward >= eval_correct_threshold). One eval runs at a time; a request made while one is
// running is queued. Groups that fail are left out of the figures and counted.
//
// Threading: the io_context thread only.
#include <boost/asio/any_io_executor.hpp>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/async/coro.h"
#include "orchestrator/group.h"
#include "orchestrator/ledger.h"
#include "orchestrator/options.h"
#include "orchestrator/ports.h"

namespace arlo::orch {

struct EnvEval {
  int tasks = 0;                  // tasks scored
  int failed_groups = 0;          // tasks left out (generation or scoring failed)
  double avg = 0.0;               // mean reward over all samples (avg@n)
  std::map<int, double> pass_at;  // k -> pass@k
};

struct EvalReport {
  std::uint64_t eval_id = 0;
  std::int64_t step = 0;  // the policy version evaluated
  int samples_per_task = 0;
  std::map<std::string, EnvEval> envs;
  double seconds = 0.0;
};

// Unbiased pass@k of one task with n samples of which c are correct.
double pass_at_k(int n, int c, int k);

class EvalSink {
 public:
  using Enqueue = std::function<void(std::uint64_t eval_id, const std::vector<std::shared_ptr<const Task>>&, int)>;
  EvalSink(asio::any_io_executor ex, Clock& clock, ScorerPort& scorer, Ledger& ledger, const Options& options,
           std::vector<Task> eval_tasks, Enqueue enqueue, std::function<void(const EvalReport&)> on_report);

  // Evaluates the policy of version `step` (the caller starts it once workers serve that version).
  void start(std::int64_t step);
  void add(GroupPtr group);   // a complete eval group
  void lost(GroupPtr group);  // an eval group that failed or was cancelled
  bool busy() const { return running_ || !queued_.empty(); }
  bool has_tasks() const { return !tasks_.empty(); }
  // Completes when no eval is running or queued.
  Awaitable<void> wait_done();
  // Abandons queued evals (the running one finishes as its groups are cancelled).
  void stop();
  const std::vector<EvalReport>& reports() const { return reports_; }

 private:
  struct TaskResult {
    std::string env;
    std::vector<double> rewards;
    bool failed = false;
  };
  void begin(std::int64_t step);
  Awaitable<void> score(GroupPtr group);
  void record(TaskResult r);
  void finish();

  asio::any_io_executor ex_;
  Clock& clock_;
  ScorerPort& scorer_;
  Ledger& ledger_;
  const Options& opt_;
  std::vector<std::shared_ptr<const Task>> tasks_;
  Enqueue enqueue_;
  std::function<void(const EvalReport&)> on_report_;
  Signal done_;

  bool running_ = false;
  bool stopped_ = false;
  std::deque<std::int64_t> queued_;
  std::uint64_t eval_id_ = 0;
  std::int64_t step_ = 0;
  TimePoint started_{};
  std::size_t outstanding_ = 0;
  std::vector<TaskResult> results_;
  std::vector<EvalReport> reports_;
};

}  // namespace arlo::orch
