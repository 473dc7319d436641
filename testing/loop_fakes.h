#pragma once
// Fakes for the orchestrator's ports. They store what they are asked and complete only when the
// test says so (or at once in auto mode), so tests step the io_context deterministically.
#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include <fmt/format.h>
#include <string>
#include <vector>

#include "common/async/coro.h"
#include "common/async/fake_clock.h"
#include "orchestrator/ports.h"
#include "orchestrator/train_sink.h"
#include "rollout/advantages.h"

namespace arlo::orch::testing {

// Inference workers. Sample j of a group answers tokens {j % 2, 10 + j, 20 + j} (so rewards by
// FakeScorer alternate 0/1 and groups are not filtered) unless `answer` is replaced.
class FakeInference final : public InferencePort {
 public:
  struct Pending {
    GenerateRequest request;
    Version version_at_submit;
    Promise<Result<GenerateResult>> promise;
    bool done = false;
  };
  explicit FakeInference(asio::any_io_executor ex, std::vector<std::string> workers = {"w0", "w1"})
      : ex_(ex), workers_(std::move(workers)) {}

  Awaitable<Result<GenerateResult>> generate(GenerateRequest request) override {
    Promise<Result<GenerateResult>> p(ex_);
    pending_.push_back(Pending{std::move(request), version_, p});
    requests_.push_back(pending_.back().request);
    if (auto_complete) complete(pending_.size() - 1);
    co_return co_await p.get();
  }
  std::vector<std::string> workers() const override { return workers_; }
  Awaitable<Status> pause(std::string worker, PauseMode mode, TimePoint) override {
    log.push_back(fmt::format("pause({}) {}", to_string(mode), worker));
    if (hang_pause.count(worker) || slow_pause.count(worker)) {
      Promise<Status> never(ex_);
      hung_.push_back(never);
      co_return co_await never.get();
    }
    if (mode == PauseMode::kAbort) abort_all();
    co_return ok();
  }
  Awaitable<Status> update_weights(std::string worker, WeightRound round, TimePoint) override {
    const Version v = round.version;
    log.push_back(fmt::format("update(v{}) {}", v, worker));
    if (on_update) on_update(worker, round);
    if (dark.count(worker)) {  // its link went down after the pause: nothing answers
      Promise<Status> never(ex_);
      hung_.push_back(never);
      co_return co_await never.get();
    }
    if (refuse_update.count(worker))
      co_return make_error(ErrorCode::kInvalidArgument, fmt::format("{} refuses v{} (test)", worker, v));
    version_ = v;
    co_return ok();
  }
  Awaitable<Status> resume(std::string worker, TimePoint) override {
    log.push_back(fmt::format("resume {}", worker));
    if (dark.count(worker)) {
      Promise<Status> never(ex_);
      hung_.push_back(never);
      co_return co_await never.get();
    }
    co_return ok();
  }
  Awaitable<Result<WorkerWeights>> weights(std::string worker, TimePoint) override {
    log.push_back(fmt::format("weights {}", worker));
    if (hang_pause.count(worker) || dark.count(worker)) {  // a stopped worker answers nothing
      Promise<Result<WorkerWeights>> never(ex_);
      hung_weights_.push_back(never);
      co_return co_await never.get();
    }
    const auto it = holds.find(worker);
    const Version held = it == holds.end() ? version_ : it->second;
    co_return WorkerWeights{held, fmt::format("fake-{}", held)};
  }
  Awaitable<std::vector<std::string>> silent_workers() override {
    co_return std::vector<std::string>(silent.begin(), silent.end());
  }
  Awaitable<std::vector<std::string>> unreachable_workers() override {
    std::set<std::string> all = unreachable;
    all.insert(silent.begin(), silent.end());
    co_return std::vector<std::string>(all.begin(), all.end());
  }
  void on_worker_back(std::function<void(std::string)> callback) override { back_ = std::move(callback); }
  // The pool saw `worker` answer again after its circuit opened (InferencePort::on_worker_back).
  void worker_back(const std::string& worker) {
    if (back_) back_(worker);
  }

  std::function<Sample(const GenerateRequest&, int sample)> answer = [](const GenerateRequest&, int j) {
    Sample c;
    c.completion_tokens = {j % 2, 10 + j, 20 + j};
    c.logprobs = {-0.5f, -0.5f, -0.5f};
    c.finish_reason = FinishReason::kStop;
    return c;
  };

  // Completes request i; tokens after the midpoint carry the current version when it changed
  // since submission (keep mode: a completion spanning two versions).
  void complete(std::size_t i) {
    auto& p = pending_.at(i);
    if (p.done) return;
    p.done = true;
    GenerateResult r;
    r.worker = workers_[p.request.group_id % workers_.size()];
    r.prompt_tokens = p.request.prompt_tokens.empty() ? std::vector<std::int32_t>{1, 2} : p.request.prompt_tokens;
    for (int j = 0; j < p.request.n; ++j) {
      auto c = answer(p.request, j);
      c.version_spans = {{p.version_at_submit, 0}};
      if (version_ != p.version_at_submit && c.completion_tokens.size() > 1)
        c.version_spans.push_back({version_, static_cast<std::int64_t>(c.completion_tokens.size() / 2)});
      r.completions.push_back(std::move(c));
    }
    p.promise.set(std::move(r));
  }
  void fail(std::size_t i, ErrorCode code = ErrorCode::kUnavailable) {
    auto& p = pending_.at(i);
    if (p.done) return;
    p.done = true;
    p.promise.set(make_error(code, "worker died"));
  }
  void complete_all() {
    for (std::size_t i = 0; i < pending_.size(); ++i) complete(i);
  }
  // Abort mode: every open request returns one token per sample with finish_reason "abort".
  void abort_all() {
    for (auto& p : pending_) {
      if (p.done) continue;
      p.done = true;
      GenerateResult r;
      r.prompt_tokens = p.request.prompt_tokens.empty() ? std::vector<std::int32_t>{1, 2} : p.request.prompt_tokens;
      for (int j = 0; j < p.request.n; ++j) {
        Sample c;
        c.completion_tokens = {j % 2};
        c.logprobs = {-0.1f};
        c.version_spans = {{p.version_at_submit, 0}};
        c.finish_reason = FinishReason::kAbort;
        r.completions.push_back(std::move(c));
      }
      p.promise.set(std::move(r));
    }
  }
  std::vector<std::size_t> open() const {
    std::vector<std::size_t> v;
    for (std::size_t i = 0; i < pending_.size(); ++i)
      if (!pending_[i].done) v.push_back(i);
    return v;
  }
  const std::vector<Pending>& pending() const { return pending_; }
  const std::vector<GenerateRequest>& requests() const { return requests_; }
  Version version() const { return version_; }
  void set_version(Version v) { version_ = v; }  // the version the workers hold at start

  bool auto_complete = false;
  std::set<std::string> hang_pause;     // stopped: pause and weights calls hang
  std::set<std::string> slow_pause;     // pause calls hang, but it answers weights calls (busy, not dead)
  std::set<std::string> dark;           // update, resume and weights calls hang (a link down after the pause)
  std::set<std::string> refuse_update;  // these workers answer every update with an error
  std::set<std::string> silent;         // what silent_workers() reports (the pool's open, silent circuits)
  std::set<std::string> unreachable;    // also in unreachable_workers(): silent, circuit closed (idle or paused)
  std::function<void(const std::string& worker, const WeightRound& round)>
      on_update;                         // called as each update call starts
  std::map<std::string, Version> holds;  // what weights() reports for these workers (others: the last update's)
  std::vector<std::string> log;

 private:
  std::function<void(std::string)> back_;
  asio::any_io_executor ex_;
  std::vector<std::string> workers_;
  std::vector<Pending> pending_;
  std::vector<GenerateRequest> requests_;
  std::vector<Promise<Status>> hung_;
  std::vector<Promise<Result<WorkerWeights>>> hung_weights_;
  Version version_ = 0;
};

// Tasks numbered 0, 1, 2, ... as `make` builds them; the cursor is the next number. `drawn` lists
// the numbers handed out.
class NumberedTasks : public TaskSource {
 public:
  explicit NumberedTasks(std::function<Task(std::uint64_t n)> make) : make_(std::move(make)) {}
  Result<Task> next() override {
    drawn.push_back(next_);
    return make_(next_++);
  }
  nlohmann::json cursor() const override { return {{"next", next_}}; }
  Status restore(const nlohmann::json& c) override {
    next_ = c.at("next").get<std::uint64_t>();
    return ok();
  }
  std::vector<std::uint64_t> drawn;

 private:
  std::function<Task(std::uint64_t)> make_;
  std::uint64_t next_ = 0;
};

// Arithmetic-like tasks: task n has the prompt "task n" (tokens {n, 5}) and the answer "1".
class FakeTasks final : public NumberedTasks {
 public:
  FakeTasks()
      : NumberedTasks([](std::uint64_t n) {
          Task t;
          t.id = std::to_string(n);
          t.env = "arith";
          t.prompt = fmt::format("task {}", n);
          t.prompt_tokens = {static_cast<std::int32_t>(n), 5};
          t.answer = "1";
          t.answer_tokens = {1, 0};
          return t;
        }) {}
};

// GRPO advantages of one group's rewards (rollout's implementation, as in production).
inline std::vector<double> grpo_advantages(const std::vector<double>& rewards) {
  std::vector<rollout::SampleInput> in;
  for (double r : rewards) in.push_back({.reward = r});
  return rollout::compute_advantages(in, {.filter_equal_reward_groups = false}).advantages;  // GRPO is the default
}

// reward = 1 when the first token is 1, else 0; GRPO advantages. A completion that finished by
// length gets the fate `overlong` gives it (rollout's estimator, as RolloutScorer does).
class FakeScorer final : public ScorerPort {
 public:
  Awaitable<Result<ScoredGroup>> score(std::shared_ptr<const Task>,
                                       std::shared_ptr<const std::vector<Sample>> cs) override {
    ScoredGroup g;
    std::vector<rollout::SampleInput> in;
    for (const auto& c : *cs) {
      g.rewards.push_back(!c.completion_tokens.empty() && c.completion_tokens[0] == 1 ? 1.0 : 0.0);
      // What a reward module reports: its reward and one figure of its own.
      g.metrics.push_back(
          {{"fake", g.rewards.back()}, {"fake/tokens", static_cast<double>(c.completion_tokens.size())}});
      in.push_back({g.rewards.back(), c.completion_tokens.size(), c.finish_reason == FinishReason::kLength});
    }
    auto adv = rollout::compute_advantages(in, {.filter_equal_reward_groups = false, .truncated = overlong});
    g.advantages = std::move(adv.advantages);
    if (overlong != rollout::TruncationPolicy::kKeep) g.fates = std::move(adv.fates);
    ++scored;
    co_return g;
  }
  int scored = 0;
  rollout::TruncationPolicy overlong = rollout::TruncationPolicy::kKeep;
};

// Accepts up to max_pending unacknowledged batches; with auto_publish, acknowledges each batch at
// once and publishes its version (a trainer that is never the bottleneck).
class FakeTrainer final : public TrainerPort {
 public:
  explicit FakeTrainer(asio::any_io_executor ex) : ex_(ex), space_(ex) {}
  Awaitable<Status> send(TrainBatch batch) override {
    while (static_cast<int>(batches.size()) - acked_ >= max_pending) co_await space_.wait();
    batches.push_back(std::move(batch));
    if (auto_publish) {
      const auto step = batches.back().step;
      asio::post(ex_, [this, step] {
        ack(step);
        publish(step);
      });
    }
    co_return ok();
  }
  void on_version(std::function<void(VersionNotice)> cb) override { cb_ = std::move(cb); }
  void on_alive(std::function<void()> cb) override { alive_ = std::move(cb); }
  void heartbeat() {
    if (alive_) alive_();
  }
  void publish(Version v) {
    // Each version is announced where it lies (the announcement a real trainer sends with it).
    if (cb_)
      cb_({v,
           {{"loss", 0.5}, {"lr", 1e-3}, {"step", v}, {"note", "not a number"}},
           {{"version", v}, {"address", fmt::format("trainer:{}", v)}}});
  }
  void ack(std::int64_t step) {
    acked_ = static_cast<int>(std::max<std::int64_t>(acked_, step - first_step_offset));
    space_.notify();
  }
  std::vector<TrainBatch> batches;
  int max_pending = 1 << 30;
  bool auto_publish = false;
  std::int64_t first_step_offset = 0;  // resume: steps before the first batch this trainer saw

 private:
  asio::any_io_executor ex_;
  Signal space_;
  int acked_ = 0;
  std::function<void(VersionNotice)> cb_;
  std::function<void()> alive_;
};

}  // namespace arlo::orch::testing
