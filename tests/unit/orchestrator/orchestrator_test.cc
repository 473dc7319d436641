// Deterministic tests of the orchestrator's loop: fakes for every port, the io_context stepped by
// hand, time moved by a fake clock. No sleeps, no real timers.
#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <unistd.h>

#include "common/http.h"
#include "common/metrics.h"
#include "orchestrator/checkpoint.h"
#include "orchestrator/orchestrator.h"
#include "session/reporter.h"
#include "testing/loop_fakes.h"
#include "tests/unit/rollout/rollout_test_util.h"

namespace arlo::orch {
namespace {

using arlo::FakeClock;
using testing::FakeInference;
using testing::FakeScorer;
using testing::FakeTasks;
using testing::FakeTrainer;

// Eval tasks' ids start with "eval-" (training tasks' are numbers).
Task eval_task(std::uint64_t id, std::vector<std::int32_t> prompt) {
  Task t;
  t.id = fmt::format("eval-{}", id);
  t.env = "arith";
  t.prompt_tokens = std::move(prompt);
  return t;
}

// What the loop reported, in order; forwards every report to `next` (the session's Reporter) when set.
struct RecordingObserver : RunObserver {
  RunObserver* next = nullptr;
  std::vector<std::string> order;  // "start", "step 1", "sync v1", "eval v3", "pipeline", "end"
  std::vector<StartObservation> starts;
  std::vector<StepObservation> steps;
  std::vector<SyncObservation> syncs;
  std::vector<EvalReport> evals;
  std::vector<PipelineView> pipelines;
  std::vector<EndObservation> ends;
  std::size_t scored = 0;

  void on_start(const StartObservation& s) override {
    order.push_back("start");
    starts.push_back(s);
    if (next) next->on_start(s);
  }
  void on_scored(const Group& g) override {
    ++scored;
    if (next) next->on_scored(g);
  }
  void on_step(const StepObservation& s) override {
    order.push_back(fmt::format("step {}", s.report.step));
    steps.push_back(s);
    if (next) next->on_step(s);
  }
  void on_sync(const SyncObservation& s) override {
    order.push_back(fmt::format("sync v{}", s.report.version));
    syncs.push_back(s);
    if (next) next->on_sync(s);
  }
  void on_eval(const EvalReport& r) override {
    order.push_back(fmt::format("eval v{}", r.step));
    evals.push_back(r);
    if (next) next->on_eval(r);
  }
  void on_pipeline(const PipelineView& v) override {
    order.push_back("pipeline");
    pipelines.push_back(v);
    if (next) next->on_pipeline(v);
  }
  void on_end(const EndObservation& e) override {
    order.push_back("end");
    ends.push_back(e);
    if (next) next->on_end(e);
  }
};

// Declaration order matters: the clock outlives the io_context (pending frames cancel timers when
// destroyed), and the io_context outlives the fakes, the reporter and the orchestrator.
struct Harness {
  FakeClock clock;
  asio::io_context io;
  FakeInference inf{io.get_executor()};
  FakeTasks tasks;
  FakeScorer scorer;
  FakeTrainer trainer{io.get_executor()};
  Options opt;
  RecordingObserver seen;
  bool report = false;  // the session's Reporter (metrics.jsonl, records, status port) behind `seen`
  metrics::Registry registry;
  std::unique_ptr<session::Reporter> reporter;
  std::unique_ptr<Orchestrator> orch;
  std::vector<std::unique_ptr<Timer>> keep;  // timers a test schedules on the fake clock

  Harness() {
    shape(4, 2, 10, 1);
    opt.max_inflight = 64;
    opt.max_off_policy_steps = 2;
    opt.log_interval_s = 1000;
    opt.console = false;
    opt.eval_at_start = false;
    opt.eval_at_end = false;
    opt.admin_timeout = std::chrono::seconds(5);
    opt.admin_attempts = 2;
    opt.admin_backoff = std::chrono::seconds(1);
  }
  // Batch and group sizes, RL steps and async level of the run.
  void shape(int batch, int group, int steps, int async_level) {
    opt.batch_size = batch;
    opt.group_size = group;
    opt.max_steps = steps;
    opt.max_async_level = async_level;
  }
  // Every run ends with its ledger adding up, whatever the test checked before.
  ~Harness() {
    if (orch) expect_ledger_adds_up();
    orch.reset();
  }

  void start(std::vector<Task> eval = {}) {
    if (report) {
      reporter = std::make_unique<session::Reporter>(io, clock, opt, &registry);
      seen.next = reporter.get();
    }
    orch = std::make_unique<Orchestrator>(io, Ports{&inf, &tasks, &scorer, &trainer, &clock, nullptr, std::move(eval)},
                                          opt, &seen);
    if (reporter) {
      auto rs = reporter->start(*orch);
      ASSERT_TRUE(rs) << rs.error().what();
    }
    auto st = orch->start();
    ASSERT_TRUE(st) << st.error().what();
    settle();
  }
  // Runs every ready handler until none is left.
  void settle() {
    do {
      io.restart();
    } while (io.poll() > 0);
  }
  // Settles, then moves the clock to the next timer, until pred() holds.
  bool run_until(const std::function<bool()>& pred, int max_rounds = 200000) {
    for (int i = 0; i < max_rounds; ++i) {
      settle();
      if (pred()) return true;
      if (!clock.fire_next()) return pred();
    }
    return pred();
  }
  // Publishes version v and runs until the weight watcher's round for it ended.
  bool publish_and_sync(Version v, int max_rounds = 1000) {
    trainer.publish(v);
    return run_until([&] { return orch->weight_watcher().synced() == v; }, max_rounds);
  }
  // Publishes version v and runs until the watcher synced it and runs no round at all (no resync).
  bool publish_and_settle(Version v) {
    trainer.publish(v);
    return run_until([&] { return orch->weight_watcher().synced() == v && !orch->weight_watcher().syncing(); }, 1000);
  }
  std::size_t open() const { return inf.open().size(); }
  long count(const std::string& logged) const { return std::count(inf.log.begin(), inf.log.end(), logged); }
  void expect_ledger_adds_up() {
    const auto& l = orch->ledger();
    auto st = l.check();
    EXPECT_TRUE(st) << st.error().what();
    EXPECT_EQ(l.dispatched_total(), l.completed_total() + l.failed_total() + l.cancelled_total() + l.in_flight());
    EXPECT_EQ(l.completed_total(), l.disposed_total() + l.held());
  }
};

TEST(Gate, AsyncLevelOneRunsOneStepAhead) {
  Harness h;
  h.start();
  // Steps 1 and 2 may be generated by v0: (2-1)-0 <= 1; step 3 may not.
  EXPECT_EQ(h.open(), 4u);
  for (const auto& r : h.inf.requests()) EXPECT_EQ(r.n, 2);
  EXPECT_EQ(h.orch->dispatcher().next_target_step(), 3);
  EXPECT_TRUE(h.orch->dispatcher().blocked_by_version());
  h.inf.complete_all();
  h.settle();
  ASSERT_EQ(h.trainer.batches.size(), 2u);
  EXPECT_EQ(h.trainer.batches[0].step, 1);
  EXPECT_EQ(h.trainer.batches[1].step, 2);
  EXPECT_EQ(h.inf.requests().size(), 4u);  // still v0: nothing for step 3
  h.trainer.publish(1);
  h.settle();
  EXPECT_EQ(h.orch->dispatcher().version(), 1);
  EXPECT_EQ(h.inf.requests().size(), 6u);  // step 3 only
}

TEST(Gate, AsyncLevelZeroIsSynchronous) {
  Harness h;
  h.opt.max_async_level = 0;
  h.start();
  EXPECT_EQ(h.open(), 2u);
  h.inf.complete_all();
  h.settle();
  ASSERT_EQ(h.trainer.batches.size(), 1u);
  EXPECT_EQ(h.inf.requests().size(), 2u);  // step 2 waits for v1
  h.trainer.publish(1);
  h.settle();
  EXPECT_EQ(h.inf.requests().size(), 4u);
  // Every rollout of step s came from v(s-1): the batch for step 2 is fully on-policy.
  h.inf.complete_all();
  h.settle();
  ASSERT_EQ(h.trainer.batches.size(), 2u);
  for (const auto& s : h.trainer.batches[1].samples)
    for (auto v : s.token_versions()) EXPECT_EQ(v, 1);
}

TEST(Gate, InflightBoundCountsSamples) {
  Harness h;
  h.opt.max_inflight = 5;  // room for two groups of 2, not three
  h.opt.max_async_level = 4;
  h.start();
  EXPECT_EQ(h.open(), 2u);
  EXPECT_EQ(h.orch->dispatcher().inflight_samples(), 4);
}

TEST(Filter, EqualRewardGroupsAreReplacedOnlyUpToTheBudget) {
  Harness h;
  h.opt.max_steps = 3;
  h.opt.max_async_level = 0;
  h.opt.max_filtered_groups_per_step = 3;
  h.inf.auto_complete = true;
  h.trainer.auto_publish = true;
  // Every sample solves its task: every group has equal rewards.
  h.inf.answer = [](const GenerateRequest&, int) {
    Sample c;
    c.completion_tokens = {1, 7};
    c.logprobs = {-0.1f, -0.1f};
    c.finish_reason = FinishReason::kStop;
    return c;
  };
  h.start();
  ASSERT_TRUE(h.run_until([&] { return h.orch->finished(); }));
  ASSERT_EQ(h.trainer.batches.size(), 3u);
  // Per step: 3 groups dropped and replaced, then 2 kept with zero advantage (batch 4 / group 2).
  for (const auto& b : h.trainer.batches) {
    ASSERT_EQ(b.samples.size(), 4u);
    for (const auto& s : b.samples) EXPECT_EQ(s.advantage, 0.0);
  }
  EXPECT_EQ(h.orch->ledger().disposed("filtered"), 3u * 3u * 2u);
  EXPECT_EQ(h.inf.requests().size(), 3u * 5u);
}

// orchestrator.overlong. Groups of 4; sample 3 of each (tokens {1, 13, 23}) is cut off by
// max_tokens. Two RL steps of two groups, synchronous.
struct OverlongRun : Harness {
  explicit OverlongRun(rollout::TruncationPolicy policy) {
    shape(8, 4, 2, 0);
    inf.auto_complete = true;
    trainer.auto_publish = true;
    scorer.overlong = policy;
    inf.answer = [](const GenerateRequest&, int j) {
      Sample c;
      c.completion_tokens = {j % 2, 10 + j, 20 + j};
      c.logprobs = {-0.5f, -0.5f, -0.5f};
      c.finish_reason = j == 3 ? FinishReason::kLength : FinishReason::kStop;
      return c;
    };
    start();
  }
  static bool cut_off(const Sample& s) { return s.completion_tokens.at(1) == 13; }
};

// drop: the cut-off samples never reach the trainer; the ledger counts them "overlong", the rest
// "trained", and the step reports count only what is in the batch.
TEST(Overlong, DropKeepsCutOffSamplesOutOfTheBatchAndCountsThemOverlong) {
  OverlongRun h(rollout::TruncationPolicy::kDrop);
  ASSERT_TRUE(h.run_until([&] { return h.orch->finished(); }));
  ASSERT_EQ(h.trainer.batches.size(), 2u);
  for (const auto& b : h.trainer.batches) {
    EXPECT_EQ(b.samples.size(), 6u);  // two groups of 3
    for (const auto& s : b.samples) {
      EXPECT_FALSE(OverlongRun::cut_off(s));
      EXPECT_TRUE(s.in_loss());
      EXPECT_NE(s.advantage, 0.0);  // rewards 0, 1, 0 among the kept samples
    }
  }
  EXPECT_EQ(h.orch->ledger().disposed("overlong"), 4u);
  EXPECT_EQ(h.orch->ledger().disposed("trained"), 12u);
  EXPECT_EQ(h.orch->ledger().disposed("masked"), 0u);
  ASSERT_EQ(h.orch->step_reports().size(), 2u);
  for (const auto& r : h.orch->step_reports()) EXPECT_EQ(r.samples, 6);
}

// A group whose every sample is cut off leaves nothing to train on: it is counted "overlong" whole
// and the dispatcher replaces it.
TEST(Overlong, DropOfAWholeGroupIsReplaced) {
  Harness h;
  h.opt.max_steps = 1;
  h.opt.max_async_level = 0;
  h.inf.auto_complete = true;
  h.scorer.overlong = rollout::TruncationPolicy::kDrop;
  int groups = 0;
  h.inf.answer = [&](const GenerateRequest& r, int j) {
    Sample c;
    c.completion_tokens = {j % 2, 10 + j};
    c.logprobs = {-0.5f, -0.5f};
    c.finish_reason = r.group_id == 1 ? FinishReason::kLength : FinishReason::kStop;  // the first group is cut off
    if (j == 0) ++groups;
    return c;
  };
  h.start();
  ASSERT_TRUE(h.run_until([&] { return h.trainer.batches.size() == 1; }));
  EXPECT_EQ(h.trainer.batches[0].samples.size(), 4u);
  EXPECT_EQ(h.orch->ledger().disposed("overlong"), 2u);
  EXPECT_EQ(groups, 3);
}

// mask: the cut-off samples are in the batch, out of the loss (advantage 0), counted "masked";
// train/samples/trainable counts the others.
TEST(Overlong, MaskSendsCutOffSamplesOutOfTheLossAndCountsThemMasked) {
  OverlongRun h(rollout::TruncationPolicy::kMask);
  ASSERT_TRUE(h.run_until([&] { return h.orch->finished(); }));
  ASSERT_EQ(h.trainer.batches.size(), 2u);
  for (const auto& b : h.trainer.batches) {
    ASSERT_EQ(b.samples.size(), 8u);
    int masked = 0;
    for (const auto& s : b.samples) {
      EXPECT_EQ(!s.in_loss(), OverlongRun::cut_off(s));
      if (!s.in_loss()) {
        EXPECT_EQ(s.advantage, 0.0);
        ++masked;
      }
    }
    EXPECT_EQ(masked, 2);
  }
  EXPECT_EQ(h.orch->ledger().disposed("masked"), 4u);
  EXPECT_EQ(h.orch->ledger().disposed("trained"), 12u);
  EXPECT_EQ(h.orch->ledger().disposed("overlong"), 0u);
  ASSERT_EQ(h.orch->step_reports().size(), 2u);
  for (const auto& r : h.orch->step_reports()) {
    EXPECT_EQ(r.samples, 6);
    EXPECT_EQ(r.masked_samples, 2);
  }
}

// keep (the default): cut-off samples train like any other.
TEST(Overlong, KeepTrainsCutOffSamples) {
  OverlongRun h(rollout::TruncationPolicy::kKeep);
  ASSERT_TRUE(h.run_until([&] { return h.orch->finished(); }));
  ASSERT_EQ(h.trainer.batches.size(), 2u);
  for (const auto& b : h.trainer.batches) {
    EXPECT_EQ(b.samples.size(), 8u);
    for (const auto& s : b.samples) EXPECT_TRUE(s.in_loss());
  }
  EXPECT_EQ(h.orch->ledger().disposed("trained"), 16u);
}

TEST(Staleness, DropCountsTimeSpentQueued) {
  Harness h;
  h.opt.batch_size = 2;  // one group per step
  h.opt.max_async_level = 2;
  h.opt.max_off_policy_steps = 1;
  h.trainer.max_pending = 1;
  h.start();
  ASSERT_EQ(h.open(), 3u);  // steps 1..3 from v0
  h.inf.complete_all();
  h.settle();
  // Step 1 accepted, step 2 cut and waiting on back-pressure; step 3's group (v0) is queued.
  ASSERT_EQ(h.trainer.batches.size(), 1u);
  EXPECT_EQ(h.orch->train_sink().queued_groups(), 1);
  EXPECT_EQ(h.orch->ledger().disposed("stale"), 0u);
  h.trainer.publish(1);
  h.trainer.publish(2);
  h.settle();
  EXPECT_EQ(h.orch->dispatcher().version(), 2);
  // The group finished fresh, but by the time step 3 is cut (bound: version >= 3-1-1 = 1) it has
  // waited long enough to be stale: dropped whole, and a new group replaces it.
  const auto before = h.inf.requests().size();
  h.trainer.ack(1);
  h.settle();
  ASSERT_EQ(h.trainer.batches.size(), 2u);
  EXPECT_EQ(h.orch->ledger().disposed("stale"), 2u);
  EXPECT_GT(h.inf.requests().size(), before);
  h.inf.complete_all();
  h.trainer.ack(2);
  h.settle();
  ASSERT_GE(h.trainer.batches.size(), 3u);
  EXPECT_EQ(h.trainer.batches[2].step, 3);
  for (const auto& s : h.trainer.batches[2].samples)
    for (auto v : s.token_versions()) EXPECT_GE(v, 1);
  ASSERT_GE(h.orch->step_reports().size(), 3u);
  EXPECT_EQ(h.orch->step_reports()[2].stale_samples, 2);
}

TEST(Accounting, WorkerFailingMidGroupFailsTheWholeGroupOnce) {
  Harness h;
  h.opt.max_steps = 3;
  h.start();
  ASSERT_EQ(h.open(), 4u);
  const auto failed_task = h.inf.pending()[1].request.task->prompt_tokens.at(0);
  h.inf.fail(1);
  h.settle();
  EXPECT_EQ(h.orch->ledger().failed_by_reason().at("unavailable"), 2u);
  EXPECT_EQ(h.open(), 4u);  // refilled
  h.inf.auto_complete = true;
  h.trainer.auto_publish = true;
  h.inf.complete_all();
  ASSERT_TRUE(h.run_until([&] { return h.orch->finished(); }));
  ASSERT_EQ(h.trainer.batches.size(), 3u);
  for (const auto& b : h.trainer.batches) {
    EXPECT_EQ(b.samples.size(), 4u);
    for (const auto& s : b.samples) EXPECT_NE(s.prompt_tokens[0], failed_task);
  }
  const auto& l = h.orch->ledger();
  EXPECT_EQ(l.failed_total(), 2u);
  EXPECT_EQ(l.disposed("trained"), 12u);
  EXPECT_EQ(l.in_flight(), 0u);
  EXPECT_TRUE(h.orch->summary().ok) << h.orch->summary().error;
}

// Rollouts the servers keep rejecting (HTTP 4xx: kInvalidArgument) stop the run with the last
// rejection once Options::max_rejected_in_a_row of them came in a row; a completed rollout resets the
// count, and failures of another kind (a worker that died) do not count.
TEST(Accounting, RolloutsRejectedInARowStopTheRunWithTheLastRejection) {
  Harness h;
  h.opt.max_rejected_in_a_row = 6;
  h.start();
  ASSERT_EQ(h.open(), 4u);  // 4 requests of n=2
  h.inf.fail(h.inf.open()[0], ErrorCode::kInvalidArgument);
  h.inf.fail(h.inf.open()[0], ErrorCode::kInvalidArgument);  // 4 rejected
  h.inf.fail(h.inf.open()[0], ErrorCode::kUnavailable);      // not counted
  h.settle();
  h.inf.complete(h.inf.open()[0]);  // completed: the count starts over
  h.settle();
  h.inf.fail(h.inf.open()[0], ErrorCode::kInvalidArgument);
  h.inf.fail(h.inf.open()[0], ErrorCode::kInvalidArgument);
  h.settle();
  EXPECT_FALSE(h.orch->finished());  // 4 in a row since the completion
  h.inf.fail(h.inf.open()[0], ErrorCode::kInvalidArgument);
  ASSERT_TRUE(h.run_until([&] { return h.orch->finished(); }));
  EXPECT_FALSE(h.orch->summary().ok);
  EXPECT_NE(h.orch->summary().error.find("6 rollouts in a row were rejected"), std::string::npos)
      << h.orch->summary().error;
  EXPECT_NE(h.orch->summary().error.find("worker died"), std::string::npos) << h.orch->summary().error;
}

TEST(Accounting, LateResultOfCancelledGroupIsIgnored) {
  Harness h;
  h.opt.ckpt_interval = 0;
  h.start();
  ASSERT_EQ(h.open(), 4u);
  h.orch->request_stop("test");
  h.settle();
  ASSERT_TRUE(h.orch->finished());
  EXPECT_EQ(h.orch->ledger().cancelled_by_reason().at("drain"), 8u);
  const auto before = h.orch->ledger().to_json();
  h.inf.complete_all();  // the workers answer after all
  h.settle();
  EXPECT_EQ(h.orch->ledger().to_json(), before);
}

TEST(WeightUpdate, KeepModeRecordsTokenVersions) {
  Harness h;
  h.opt.update_mode = PauseMode::kKeep;
  h.opt.max_async_level = 0;
  h.start();
  ASSERT_EQ(h.open(), 2u);
  h.trainer.publish(1);  // the trainer got ahead: update while requests are in flight
  h.settle();
  EXPECT_FALSE(h.orch->dispatcher().held());
  EXPECT_EQ(h.orch->dispatcher().version(), 1);
  std::multiset<std::string> log(h.inf.log.begin(), h.inf.log.end());
  EXPECT_EQ(log, (std::multiset<std::string>{"pause(keep) w0", "update(v1) w0", "resume w0", "pause(keep) w1",
                                             "update(v1) w1", "resume w1"}));
  h.inf.complete_all();  // tokens from the midpoint on come from v1
  h.settle();
  ASSERT_GE(h.trainer.batches.size(), 1u);
  for (const auto& s : h.trainer.batches[0].samples)
    EXPECT_EQ(s.token_versions(), (std::vector<std::int32_t>{0, 1, 1}));
}

TEST(WeightUpdate, WaitModeDrainsBeforeSwapping) {
  Harness h;
  h.opt.update_mode = PauseMode::kWait;
  h.start();
  ASSERT_EQ(h.open(), 4u);
  h.trainer.publish(1);
  h.settle();
  EXPECT_TRUE(h.orch->dispatcher().held());
  EXPECT_TRUE(h.inf.log.empty());  // nothing swapped while requests are in flight
  h.inf.complete_all();
  h.settle();
  EXPECT_FALSE(h.orch->dispatcher().held());
  EXPECT_EQ(h.orch->dispatcher().version(), 1);
  EXPECT_EQ(h.inf.log.size(), 6u);
  EXPECT_EQ(h.inf.log[0].rfind("pause(wait)", 0), 0u);
  ASSERT_EQ(h.trainer.batches.size(), 2u);
  for (const auto& b : h.trainer.batches)
    for (const auto& s : b.samples)
      for (auto v : s.token_versions()) EXPECT_EQ(v, 0);  // no sample spans two versions
  EXPECT_EQ(h.inf.requests().size(), 6u);                 // step 3 after the swap
  for (std::size_t i = 4; i < 6; ++i) EXPECT_EQ(h.inf.pending()[i].version_at_submit, 1);
}

// A source's sampling (env.sources[].sampling) replaces the run's for its tasks, continuations included.
TEST(SourceSampling, ASourcesOwnSamplingGoesWithItsRequestsAndContinuations) {
  Harness h;
  SamplingParams arith = h.opt.sampling;
  arith.temperature = 0.25;
  arith.max_tokens = 3;
  arith.stop = {"x"};
  h.opt.source_sampling["arith"] = arith;  // FakeTasks' env
  h.opt.source_sampling["other"].temperature = 9.0;
  h.opt.update_mode = PauseMode::kAbort;
  h.opt.max_async_level = 0;
  h.opt.max_steps = 1;
  h.start();
  ASSERT_EQ(h.open(), 2u);
  for (const auto& r : h.inf.requests()) {
    EXPECT_EQ(r.sampling.temperature, 0.25);
    EXPECT_EQ(r.sampling.max_tokens, 3);
    EXPECT_EQ(r.sampling.stop, std::vector<std::string>{"x"});
  }
  h.trainer.publish(1);
  h.settle();
  ASSERT_EQ(h.inf.requests().size(), 6u);
  for (std::size_t i = 2; i < 6; ++i) {  // continued after one token: the source's budget less that token
    EXPECT_EQ(h.inf.requests()[i].sampling.max_tokens, 2);
    EXPECT_EQ(h.inf.requests()[i].sampling.temperature, 0.25);
  }
}

TEST(WeightUpdate, AbortModeContinuesSamplesFromTheirTokens) {
  Harness h;
  h.opt.update_mode = PauseMode::kAbort;
  h.opt.max_async_level = 0;
  h.opt.max_steps = 1;  // no group beyond step 1, so only continuations and refills are dispatched
  h.start();
  ASSERT_EQ(h.open(), 2u);
  h.trainer.publish(1);
  h.settle();
  // Both group requests were aborted after one token; each sample continues on its own.
  EXPECT_EQ(h.orch->dispatcher().version(), 1);
  ASSERT_EQ(h.inf.requests().size(), 6u);
  for (std::size_t i = 2; i < 6; ++i) {
    const auto& r = h.inf.requests()[i];
    EXPECT_EQ(r.n, 1);
    ASSERT_EQ(r.prompt_tokens.size(), 3u);  // prompt (2 tokens) + the sample's partial token
    EXPECT_EQ(r.sampling.max_tokens, h.opt.sampling.max_tokens - 1);
    EXPECT_EQ(h.inf.pending()[i].version_at_submit, 1);
  }
  EXPECT_EQ(h.orch->ledger().dispatched_total(), 4u);  // continuations are not new rollouts
  // One continuation fails: its sample fails, its group is dropped whole.
  h.inf.fail(2);
  h.inf.complete_all();
  h.settle();
  const auto& l = h.orch->ledger();
  EXPECT_EQ(l.failed_total(), 1u);
  EXPECT_EQ(l.disposed("group_incomplete"), 1u);
  // The other group lacks a partner for a batch of two groups; add one and finish the step.
  h.inf.complete_all();
  h.settle();
  ASSERT_EQ(h.trainer.batches.size(), 1u);
  bool found_continued = false;
  for (const auto& s : h.trainer.batches[0].samples) {
    if (s.completion_tokens.size() == 4) {  // 1 aborted token + 3 continued
      found_continued = true;
      EXPECT_EQ(s.token_versions(), (std::vector<std::int32_t>{0, 1, 1, 1}));
    }
  }
  EXPECT_TRUE(found_continued);
}

// A worker that hangs on a pause but answers a weights query is busy, not dead: the call is retried.
TEST(WeightUpdate, HangingAdminCallIsCutOffAndRetried) {
  Harness h;
  h.inf.slow_pause = {"w1"};
  h.start();
  h.trainer.publish(1);
  h.settle();
  EXPECT_TRUE(h.orch->weight_watcher().syncing());
  ASSERT_TRUE(h.run_until([&] { return !h.orch->weight_watcher().syncing(); }, 1000));
  EXPECT_EQ(std::count(h.inf.log.begin(), h.inf.log.end(), "pause(keep) w1"), 2);  // admin_attempts
  EXPECT_EQ(std::count(h.inf.log.begin(), h.inf.log.end(), "update(v1) w1"), 0);
  EXPECT_EQ(std::count(h.inf.log.begin(), h.inf.log.end(), "resume w1"), 0);  // it did not answer the pause
  EXPECT_EQ(h.orch->weight_watcher().failures(), 1u);
  EXPECT_EQ(h.orch->dispatcher().version(), 1);  // w0 took it
}

// A stopped worker costs one update: it is then left out (v2 does not wait on it), probed, and once
// it answers it rejoins and the current version is synced again so it catches up.
TEST(WeightUpdate, AFailedWorkerIsLeftOutProbedAndRejoins) {
  Harness h;
  h.inf.hang_pause = {"w1"};
  h.start();
  ASSERT_TRUE(h.publish_and_sync(1));
  EXPECT_EQ(h.orch->weight_watcher().left_out(), (std::set<std::string>{"w1"}));
  const auto pauses_of_w1 = std::count(h.inf.log.begin(), h.inf.log.end(), "pause(keep) w1");
  ASSERT_TRUE(h.publish_and_sync(2));
  EXPECT_EQ(std::count(h.inf.log.begin(), h.inf.log.end(), "pause(keep) w1"), pauses_of_w1);  // not asked again
  EXPECT_EQ(std::count(h.inf.log.begin(), h.inf.log.end(), "update(v2) w0"), 1);
  // It comes back: a probe (GET its weights) succeeds and v2 is synced to it.
  h.inf.hang_pause.clear();
  ASSERT_TRUE(h.run_until(
      [&] {
        return std::count(h.inf.log.begin(), h.inf.log.end(), "update(v2) w1") == 1 &&
               !h.orch->weight_watcher().syncing();
      },
      1000));
  EXPECT_TRUE(h.orch->weight_watcher().left_out().empty());
  EXPECT_GE(std::count(h.inf.log.begin(), h.inf.log.end(), "weights w1"), 1);  // the probe
  EXPECT_EQ(h.orch->weight_watcher().synced(), 2);
}

// A worker that answers nothing (its pool circuit opened on silence) is left out of a round
// without an admin call, so the version is synced to the others without waiting out its pause
// deadlines, and no attempt is counted against it. Its probe answering is not enough to rejoin
// while the pool still calls it silent; once it is not, it rejoins and is synced.
TEST(WeightUpdate, ASilentWorkerIsSkippedUnaskedAndRejoinsOnceItAnswers) {
  Harness h;
  h.inf.hang_pause = {"w1"};  // its calls would hang: the round must not make any
  h.inf.silent = {"w1"};
  h.start();
  ASSERT_TRUE(h.publish_and_sync(1));
  EXPECT_EQ(h.count("pause(keep) w1"), 0);
  EXPECT_EQ(h.count("update(v1) w0"), 1);
  EXPECT_EQ(h.orch->weight_watcher().left_out(), (std::set<std::string>{"w1"}));
  EXPECT_EQ(h.orch->weight_watcher().failures(), 1u);
  EXPECT_LT(h.orch->weight_watcher().last_sync_seconds(),
            std::chrono::duration<double>(h.opt.admin_timeout).count());  // the fake clock: no deadline waited out
  // Its link is back but the pool has not heard from it yet: the probe answers, it stays out.
  h.inf.hang_pause.clear();
  ASSERT_TRUE(h.run_until([&] { return h.count("weights w1") >= 2; }, 1000));
  EXPECT_EQ(h.orch->weight_watcher().left_out(), (std::set<std::string>{"w1"}));
  EXPECT_EQ(h.count("pause(keep) w1"), 0);
  // The pool hears from it: it rejoins and is synced v1.
  h.inf.silent.clear();
  ASSERT_TRUE(h.run_until([&] { return h.count("update(v1) w1") == 1 && !h.orch->weight_watcher().syncing(); }, 1000));
  EXPECT_TRUE(h.orch->weight_watcher().left_out().empty());
  EXPECT_TRUE(h.orch->weight_watcher().out_of_date().empty());
  EXPECT_EQ(h.orch->weight_watcher().synced(), 1);
}

// w1's pause hangs, and while it waits the pool's view of w1 changes to `cut_off` (FakeInference's
// `silent` or `unreachable`): the attempt is cut off at its deadline and not made again (admin_attempts
// is 2), and the round ends with w1 left out.
void expect_a_hung_pause_is_not_retried_once_the_worker_is(std::set<std::string> FakeInference::*cut_off) {
  Harness h;
  h.inf.hang_pause = {"w1"};
  h.start();
  h.trainer.publish(1);
  ASSERT_TRUE(h.run_until([&] { return h.count("pause(keep) w1") == 1; }, 1000));
  h.inf.*cut_off = {"w1"};
  ASSERT_TRUE(h.run_until([&] { return h.orch->weight_watcher().synced() == 1; }, 1000));
  EXPECT_EQ(h.count("pause(keep) w1"), 1);
  EXPECT_EQ(h.orch->weight_watcher().left_out(), (std::set<std::string>{"w1"}));
}

// A worker that goes silent while its pause hangs (its link went down mid-round: the pool's circuit
// for it opens while the pause waits) is not asked again after that attempt is cut off: the round
// ends one admin deadline in, not admin_attempts.
TEST(WeightUpdate, AWorkerThatGoesSilentMidRoundIsNotRetried) {
  expect_a_hung_pause_is_not_retried_once_the_worker_is(&FakeInference::silent);
}

// A paused worker whose link goes down holds no requests, so its circuit stays closed; its health
// probe getting no answer is enough for its failed pause not to be retried.
TEST(WeightUpdate, AWorkerWhoseProbeGetsNoAnswerIsNotRetried) {
  expect_a_hung_pause_is_not_retried_once_the_worker_is(&FakeInference::unreachable);
}

// A worker whose link goes down between its pause and its update: the update runs out its deadline
// before any health probe of it did. A weights query that gets no answer either is enough: the update
// is not retried, the worker is not asked to resume (its rejoin round resumes it), and it is left out.
TEST(WeightUpdate, AnUpdateThatTimesOutOnAWorkerThatAnswersNothingIsNotRetriedNorResumed) {
  Harness h;
  h.inf.dark = {"w1"};
  h.start();
  h.trainer.publish(1);
  ASSERT_TRUE(h.run_until([&] { return h.orch->weight_watcher().synced() == 1; }, 5000));
  EXPECT_EQ(h.count("update(v1) w1"), 1);  // admin_attempts is 2: the second was not made
  EXPECT_EQ(h.count("resume w1"), 0);
  EXPECT_EQ(h.orch->weight_watcher().left_out(), (std::set<std::string>{"w1"}));
  h.inf.dark.clear();
  ASSERT_TRUE(h.run_until([&] { return h.orch->weight_watcher().left_out().empty(); }, 5000));
  ASSERT_TRUE(h.run_until([&] { return h.count("resume w1") == 1; }, 5000));  // the rejoin round resumes it
}

// Skipping a silent worker is no attempt of the version: even with version_attempts 1 it is not
// out of date for it (which would end its probe), but left out, probed, and synced once it answers.
TEST(WeightUpdate, ASkippedSilentWorkerIsNotCountedAnAttempt) {
  Harness h;
  h.opt.version_attempts = 1;
  h.inf.silent = {"w1"};
  h.start();
  ASSERT_TRUE(h.publish_and_sync(1));
  EXPECT_TRUE(h.orch->weight_watcher().out_of_date().empty());
  EXPECT_EQ(h.orch->weight_watcher().left_out(), (std::set<std::string>{"w1"}));
  EXPECT_EQ(h.count("pause(keep) w1"), 0);
  h.inf.silent.clear();
  ASSERT_TRUE(h.run_until([&] { return h.count("update(v1) w1") == 1 && !h.orch->weight_watcher().syncing(); }, 1000));
  EXPECT_TRUE(h.orch->weight_watcher().left_out().empty());
}

// A worker that refuses a version is tried version_attempts times (each try: admin_attempts calls),
// then it is out of date for that version (not probed, not retried), and tried again on a newer one.
TEST(WeightUpdate, RetriesOfARefusedVersionAreCapped) {
  Harness h;
  h.inf.refuse_update = {"w1"};
  h.start();
  h.trainer.publish(1);
  ASSERT_TRUE(h.run_until([&] { return h.orch->weight_watcher().out_of_date().count("w1") == 1; }, 5000));
  EXPECT_EQ(h.orch->weight_watcher().synced(), 1);  // w0 took it
  const auto tries = std::count(h.inf.log.begin(), h.inf.log.end(), "update(v1) w1");
  EXPECT_EQ(tries, h.opt.version_attempts * h.opt.admin_attempts);
  h.run_until([] { return false; }, 200);  // probes would come every admin_timeout
  EXPECT_EQ(std::count(h.inf.log.begin(), h.inf.log.end(), "update(v1) w1"), tries);
  h.inf.refuse_update.clear();
  h.trainer.publish(2);
  ASSERT_TRUE(h.run_until([&] { return std::count(h.inf.log.begin(), h.inf.log.end(), "update(v2) w1") == 1; }, 5000));
  ASSERT_TRUE(h.run_until([&] { return h.orch->weight_watcher().synced() == 2; }, 5000));
  EXPECT_TRUE(h.orch->weight_watcher().out_of_date().empty());
}

// When every worker refuses a version, the run stops with the reason instead of retrying forever.
TEST(WeightUpdate, AVersionNoWorkerTakesStopsTheRun) {
  Harness h;
  h.inf.refuse_update = {"w0", "w1"};
  h.start();
  h.trainer.publish(1);
  ASSERT_TRUE(h.run_until([&] { return h.orch->weight_watcher().out_of_date().size() == 2; }, 5000));
  ASSERT_TRUE(h.run_until([&] { return h.orch->finished(); }, 5000));
  const auto& s = h.orch->summary();
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.error.find("no worker took v1"), std::string::npos) << s.error;
}

// arlo run restarted a worker (its supervisor): it is synced the current version at once, whether
// or not it was left out, and a left-out one's probe ends.
TEST(WeightWatcherRestart, AWorkerThatWasNotLeftOutIsSyncedTheCurrentVersionAgain) {
  Harness r;
  r.start();
  ASSERT_TRUE(r.publish_and_settle(1));
  ASSERT_EQ(r.count("update(v1) w1"), 1);
  ASSERT_TRUE(r.orch->weight_watcher().left_out().empty());
  r.orch->weight_watcher().restarted("w1");
  r.settle();  // no time passes: the resync starts at once
  EXPECT_EQ(r.count("update(v1) w1"), 2);
  EXPECT_EQ(r.count("pause(keep) w1"), 2);
  EXPECT_EQ(r.count("resume w1"), 2);
  EXPECT_EQ(r.orch->weight_watcher().synced(), 1);
  EXPECT_FALSE(r.orch->weight_watcher().syncing());
}

// A worker killed during a round and restarted before the round ends: the round's failed calls went
// to the dead process; the worker is not left out by them but synced at once (Supervision e2e: it
// ended the run left out, under load).
TEST(WeightWatcherRestart, AWorkerRestartedWhileARoundRanIsSyncedNotLeftOut) {
  Harness r;
  int w1_updates = 0;
  // The dead process refuses both attempts of the round (admin_attempts 2); arlo run reports the
  // restart between them; the restarted process takes the resync.
  r.inf.on_update = [&](const std::string& w, const WeightRound&) {
    if (w != "w1") return;
    if (++w1_updates == 1) r.orch->weight_watcher().restarted("w1");
    if (w1_updates <= 2)
      r.inf.refuse_update = {"w1"};
    else
      r.inf.refuse_update.clear();
  };
  r.start();
  r.trainer.publish(1);
  ASSERT_TRUE(r.run_until([&] { return w1_updates >= 3 && !r.orch->weight_watcher().syncing(); }, 5000));
  EXPECT_TRUE(r.orch->weight_watcher().left_out().empty());
  EXPECT_EQ(r.orch->weight_watcher().synced(), 1);
  EXPECT_EQ(w1_updates, 3);  // two refused in the round, then the resync
  EXPECT_EQ(r.count("weights w1"), 0) << "it was left out and probed instead of synced at once";
}

// The pool saw a worker answer again after its circuit opened (nobody told the run of a restart: an
// external server). It is asked what it holds: one restarted unseen (it holds its own v0) is synced
// the current version; one that only went quiet (it holds what it took) is not updated again.
TEST(WeightWatcherRestart, AWorkerBackFromAnOpenCircuitIsAskedAndSyncedOnlyIfItLostItsVersion) {
  Harness r;
  r.start();
  ASSERT_TRUE(r.publish_and_settle(1));
  // What w1 holds when it comes back (v1: it went quiet and kept its weights; v0: restarted by its
  // user, its own seeded weights), and how many updates to v1 it has had after.
  for (const auto& [holds, updates] : {std::pair<Version, int>{1, 1}, {0, 2}}) {
    r.inf.holds["w1"] = holds;
    r.inf.worker_back("w1");
    r.settle();
    EXPECT_EQ(r.count("update(v1) w1"), updates) << "back holding v" << holds;
    EXPECT_FALSE(r.orch->weight_watcher().syncing());
  }
  EXPECT_EQ(r.count("weights w1"), 2);  // asked each time
}

TEST(WeightWatcherRestart, ALeftOutWorkerRejoinsAtOnceAndItsProbeEnds) {
  Harness r;
  r.start();
  r.inf.hang_pause = {"w1"};  // dead: it answers nothing
  ASSERT_TRUE(r.publish_and_settle(1));
  ASSERT_EQ(r.orch->weight_watcher().left_out(), (std::set<std::string>{"w1"}));
  // Restarted: it answers again and arlo run says so before any probe came.
  r.inf.hang_pause.clear();
  const auto probes = r.count("weights w1");
  r.orch->weight_watcher().restarted("w1");
  r.settle();
  EXPECT_TRUE(r.orch->weight_watcher().left_out().empty());
  EXPECT_EQ(r.count("update(v1) w1"), 1) << "synced without waiting for a probe";
  EXPECT_EQ(r.count("weights w1"), probes);
  // Its probe ends instead of probing a worker that is back.
  r.run_until([] { return false; }, 50);
  EXPECT_EQ(r.count("weights w1"), probes);
  EXPECT_EQ(r.count("update(v1) w1"), 1);
}

// A worker killed once the last step was trained (supervision e2e, loaded machine): the final
// rounds fail it (refused) and leave it out before its restart listens. The end of the run does not
// report it gone: its supervisor said a restart is coming (restarting()), so it is read again until
// the restart resyncs it, within the bound. Without a pending restart a left-out worker is reported
// at once.
TEST(WeightWatcherRestart, AWorkerKilledAtTheEndIsWaitedForAndEndsOnTheFinalVersion) {
  for (const bool restart_pending : {true, false}) {
    SCOPED_TRACE(restart_pending ? "restart pending" : "no restart");
    Harness r;
    r.opt.max_steps = 3;
    r.inf.auto_complete = true;
    r.start();
    for (Version v = 1; v <= 2; ++v) {
      ASSERT_TRUE(r.run_until([&] { return r.trainer.batches.size() >= static_cast<std::size_t>(v); }));
      r.trainer.publish(v);
      ASSERT_TRUE(
          r.run_until([&] { return r.orch->weight_watcher().synced() == v && !r.orch->weight_watcher().syncing(); }));
    }
    ASSERT_TRUE(r.run_until([&] { return r.trainer.batches.size() >= 3; }));  // the last step is trained
    r.inf.hang_pause = {"w1"};  // killed: it answers nothing until restarted
    if (restart_pending) r.orch->weight_watcher().restarting("w1");
    r.trainer.publish(3);
    ASSERT_TRUE(r.run_until([&] {
      return r.orch->weight_watcher().synced() == 3 && r.orch->weight_watcher().left_out().count("w1") == 1;
    }));
    if (!restart_pending) {
      ASSERT_TRUE(r.run_until([&] { return r.orch->finished(); }));
      EXPECT_EQ(r.orch->summary().workers["w1"].value("error", ""), "left out of weight updates: it stopped answering");
      continue;
    }
    // The end waits for it (the fake clock moves, bounded by 20 s), reading nothing from it meanwhile.
    const auto start = r.clock.now();
    ASSERT_FALSE(r.run_until([&] { return r.orch->finished() || r.clock.now() - start >= std::chrono::seconds(3); }) &&
                 r.orch->finished());
    // It comes back without weights; arlo run says so; v3 is synced to it and the run ends with it.
    r.inf.hang_pause.clear();
    r.inf.holds["w1"] = kNoVersion;
    r.inf.on_update = [&](const std::string& worker, const WeightRound& round) {
      if (worker == "w1") r.inf.holds["w1"] = round.version;
    };
    r.orch->weight_watcher().restarted("w1");
    ASSERT_TRUE(r.run_until([&] { return r.orch->finished(); }));
    EXPECT_EQ(r.count("update(v3) w1"), 1);
    const auto& w1 = r.orch->summary().workers["w1"];
    EXPECT_FALSE(w1.contains("error")) << w1.dump();
    EXPECT_EQ(w1.value("version", -1), 3) << w1.dump();
    EXPECT_FALSE(r.orch->weight_watcher().restart_pending("w1"));
  }
}

// A restarted worker whose pool circuit still says silent (a health check timed out while it came
// back up) is asked in the resync round: arlo run heard it answer, the pool's verdict is older.
TEST(WeightWatcherRestart, ARestartedWorkerThePoolStillCallsSilentIsResynced) {
  Harness r;
  r.start();
  ASSERT_TRUE(r.publish_and_settle(1));
  r.inf.silent = {"w1"};
  r.orch->weight_watcher().restarted("w1");
  ASSERT_TRUE(r.run_until([&] { return r.count("update(v1) w1") == 2 && !r.orch->weight_watcher().syncing(); }, 1000));
  EXPECT_TRUE(r.orch->weight_watcher().left_out().empty());
}

// A chain's rounds (Options::pause_all_first): every worker pauses before any update, so a worker
// that does not answer its pause (a dead relay) is out of the round the updates see; a worker that
// already holds the version does not receive it; a failed update attempt marks its retry.
TEST(WeightWatcherRound, UpdatesKnowWhoReceivesAndWhoRetries) {
  Harness r;
  r.opt.pause_all_first = true;
  r.start();
  std::vector<std::string> seen;  // "<worker> v<v>: receives w0 w1, retrying <worker>"
  r.inf.on_update = [&](const std::string& worker, const WeightRound& round) {
    seen.push_back(fmt::format("{} v{}: {}{}{}", worker, round.version, round.receivers.count("w0") ? "w0 " : "",
                               round.receivers.count("w1") ? "w1 " : "", round.retry ? "retrying" : "first"));
  };
  r.inf.hang_pause = {"w1"};  // dead: it answers nothing
  ASSERT_TRUE(r.publish_and_settle(1));
  // w0's update came only after w1's pause had failed: w1 is not in the round.
  EXPECT_EQ(seen, (std::vector<std::string>{"w0 v1: w0 first"}));
  // w1 comes back holding nothing: the resync of v1 goes to it alone (w0 holds v1; each says so).
  r.inf.hang_pause.clear();
  r.inf.holds["w1"] = kNoVersion;
  seen.clear();
  r.orch->weight_watcher().restarted("w1");
  ASSERT_TRUE(r.run_until([&] { return r.count("update(v1) w1") == 1 && !r.orch->weight_watcher().syncing(); }, 1000));
  EXPECT_EQ(seen, (std::vector<std::string>{"w0 v1: w1 first", "w1 v1: w1 first"}));
  // An update attempt that fails is retried as such.
  seen.clear();
  r.inf.refuse_update = {"w1"};
  r.trainer.publish(2);
  ASSERT_TRUE(r.run_until([&] { return r.count("update(v2) w1") == 2; }, 1000));
  EXPECT_EQ(seen, (std::vector<std::string>{"w0 v2: w0 w1 first", "w1 v2: w0 w1 first", "w1 v2: w0 w1 retrying"}));
}

// Every update call is told where its own version lies (the announcement the round started from),
// also when versions coalesce, a worker retries or a restarted worker is synced again.
TEST(WeightWatcherRound, EachUpdateCarriesTheAnnouncementOfItsVersion) {
  Harness r;
  r.start();
  std::vector<std::string> seen;  // "<worker> v<v> from <address>"
  r.inf.on_update = [&](const std::string& worker, const WeightRound& round) {
    seen.push_back(fmt::format("{} v{} from {}", worker, round.version, round.weight_sync.value("address", "?")));
  };
  ASSERT_TRUE(r.publish_and_settle(1));
  r.inf.refuse_update = {"w1"};  // w1 retries v2
  r.trainer.publish(2);
  r.trainer.publish(3);  // arrives during the round of v2: the next round goes straight to v3
  ASSERT_TRUE(
      r.run_until([&] { return r.orch->weight_watcher().synced() == 3 && !r.orch->weight_watcher().syncing(); }, 1000));
  r.inf.refuse_update.clear();
  r.inf.holds["w1"] = kNoVersion;
  r.orch->weight_watcher().restarted("w1");  // synced again to v3
  ASSERT_TRUE(r.run_until([&] { return r.count("update(v3) w1") >= 2 && !r.orch->weight_watcher().syncing(); }, 1000));
  ASSERT_FALSE(seen.empty());
  for (const auto& s : seen) {
    const auto v = s.substr(s.find(" v") + 2, s.find(" from") - s.find(" v") - 2);
    EXPECT_EQ(s.substr(s.find("from trainer:") + 13), v) << s;
  }
  EXPECT_NE(std::find(seen.begin(), seen.end(), "w1 v3 from trainer:3"), seen.end());
}

TEST(Drain, StopsAtMaxStepsWithFinalEval) {
  Harness h;
  h.opt.max_steps = 3;
  h.opt.eval_at_end = true;
  h.opt.eval_samples = 4;
  h.opt.eval_pass_k = {1, 4};
  h.inf.auto_complete = true;
  h.trainer.auto_publish = true;
  std::vector<Task> eval;
  for (int i = 0; i < 3; ++i) eval.push_back(eval_task(1000u + i, {9, 9}));
  h.start(eval);
  ASSERT_TRUE(h.run_until([&] { return h.orch->finished(); }));
  ASSERT_EQ(h.trainer.batches.size(), 3u);
  EXPECT_EQ(h.trainer.batches.back().step, 3);
  const auto& s = h.orch->summary();
  EXPECT_TRUE(s.ok) << s.error;
  EXPECT_EQ(s.steps, 3);
  ASSERT_TRUE(s.eval_last.has_value());
  EXPECT_EQ(s.eval_last->step, 3);  // on the final policy
  const auto& e = s.eval_last->envs.at("arith");
  EXPECT_EQ(e.tasks, 3);
  EXPECT_DOUBLE_EQ(e.avg, 0.5);            // samples alternate 0, 1
  EXPECT_DOUBLE_EQ(e.pass_at.at(1), 0.5);  // c=2 of n=4
  EXPECT_DOUBLE_EQ(e.pass_at.at(4), 1.0);
  // The summary records what each worker served at the end (its GET /weights).
  ASSERT_EQ(s.workers.size(), 2u) << s.workers.dump();
  for (const char* w : {"w0", "w1"}) {
    EXPECT_EQ(s.workers.at(w).at("version").get<std::int64_t>(), 3) << s.workers.dump();
    EXPECT_EQ(s.workers.at(w).at("checksum").get<std::string>(), "fake-3") << s.workers.dump();
  }
  // Eval requests used eval sampling and n = eval_samples.
  int eval_requests = 0;
  for (const auto& r : h.inf.requests())
    if (r.task->id.starts_with("eval-")) {
      ++eval_requests;
      EXPECT_EQ(r.n, 4);
      EXPECT_EQ(r.sampling.temperature, 0.0);
    }
  EXPECT_EQ(eval_requests, 3);
  const auto n = h.inf.requests().size();
  h.run_until([] { return false; }, 50);
  EXPECT_EQ(h.inf.requests().size(), n);  // nothing dispatched after the end
}

TEST(Warmup, SupervisedBatchesFirstThenRlFromWarmedPolicy) {
  Harness h;
  h.opt.sft_warmup_steps = 2;
  h.opt.max_steps = 3;
  h.opt.eval_at_start = true;
  h.inf.auto_complete = true;
  h.trainer.auto_publish = true;
  h.start({eval_task(1000, {9})});
  EXPECT_TRUE(h.inf.requests().empty() || h.inf.pending()[0].version_at_submit >= 2);
  ASSERT_TRUE(h.run_until([&] { return h.orch->finished(); }));
  ASSERT_EQ(h.trainer.batches.size(), 3u);
  for (int i = 0; i < 2; ++i)
    for (const auto& s : h.trainer.batches[i].samples) {
      EXPECT_TRUE(s.supervised);
      EXPECT_EQ(s.completion_tokens, (std::vector<std::int32_t>{1, 0}));  // the reference answer
    }
  for (const auto& s : h.trainer.batches[2].samples) EXPECT_FALSE(s.supervised);
  for (const auto& p : h.inf.pending()) EXPECT_GE(p.version_at_submit, 2);  // nothing before the warm-up
  const auto& evals = h.orch->eval_sink().reports();
  ASSERT_FALSE(evals.empty());
  EXPECT_EQ(evals.front().step, 2);  // the policy RL starts from
}

TEST(Resume, ContinuesAtTheSameStepAndDataPosition) {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("arlo_orch_resume_{}", ::getpid());
  std::filesystem::remove_all(dir);
  std::vector<std::string> pending_ids;
  {
    Harness h;
    h.opt.max_steps = 4;
    h.opt.ckpt_interval = 1;
    h.opt.run_dir = dir.string();
    h.report = true;  // metrics.jsonl
    h.trainer.auto_publish = true;
    h.start();
    h.inf.complete_all();
    h.settle();
    ASSERT_EQ(h.trainer.batches.size(), 2u);
    ASSERT_EQ(h.open(), 4u);  // steps 3 and 4 in flight on v2
    for (auto i : h.inf.open()) pending_ids.push_back(h.inf.pending()[i].request.task->id);
    h.orch->request_stop("test");
    h.settle();
    ASSERT_TRUE(h.orch->finished());
  }
  auto ck = read_checkpoint(checkpoint_path(dir));
  ASSERT_TRUE(ck && ck->has_value());
  EXPECT_EQ((*ck)->step, 2);
  EXPECT_EQ((*ck)->pending_tasks.size(), 4u);
  {
    Harness h;
    h.opt.max_steps = 4;
    h.opt.ckpt_interval = 1;
    h.opt.run_dir = dir.string();
    h.opt.resume = true;
    h.report = true;
    h.opt.initial_version = 2;
    h.inf.set_version(2);  // restarted workers loaded v2
    h.trainer.auto_publish = true;
    h.trainer.first_step_offset = 2;
    h.start();
    ASSERT_EQ(h.open(), 4u);
    std::vector<std::string> ids;
    for (auto i : h.inf.open()) ids.push_back(h.inf.pending()[i].request.task->id);
    EXPECT_EQ(ids, pending_ids);  // the same tasks, before any new one
    EXPECT_TRUE(h.tasks.drawn.empty());
    h.inf.complete_all();
    ASSERT_TRUE(h.run_until([&] { return h.orch->finished(); }));
    ASSERT_EQ(h.trainer.batches.size(), 2u);
    EXPECT_EQ(h.trainer.batches[0].step, 3);
    EXPECT_EQ(h.trainer.batches[1].step, 4);
    EXPECT_TRUE(h.orch->summary().ok) << h.orch->summary().error;
    EXPECT_EQ(h.orch->ledger().cancelled_by_reason().at("resume"), 8u);
  }
  std::ifstream metrics(dir / "metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(metrics, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("train/reward/mean")) {
      ++lines;
      EXPECT_TRUE(j.contains("off_policy/max"));
      EXPECT_TRUE(j.contains("weight_sync/seconds"));
      EXPECT_TRUE(j.contains("rollouts/failed"));
    }
  }
  EXPECT_EQ(lines, 4);  // steps 1, 2, 3, 4 across both runs
  std::filesystem::remove_all(dir);
}

TEST(Checkpoint, MalformedFileIsAnErrorNotACrash) {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("arlo_orch_ckpt_{}", ::getpid());
  std::filesystem::create_directories(dir / "orchestrator");
  std::ofstream(checkpoint_path(dir)) << "{\"format\": 1, \"step\": ";
  auto r = read_checkpoint(checkpoint_path(dir));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kParse);
  std::filesystem::remove_all(dir);
}

// A journaled batch is resent as it was trained: a multi-turn sample's loss mask (the environment's
// tokens out of the loss) and a masked sample's fate survive the round trip.
TEST(Checkpoint, JournaledBatchKeepsLossMaskAndMaskedFate) {
  TrainBatch b;
  b.step = 7;
  Sample turns;
  turns.prompt_tokens = {1, 2};
  turns.completion_tokens = {3, 4, 5};
  turns.logprobs = {-0.5f, 0.0f, -0.25f};
  turns.loss_mask = {1, 0, 1};
  turns.advantage = 0.5;
  turns.reward = 1.0;
  Sample masked = turns;
  masked.loss_mask.clear();
  masked.fate = SampleFate::kMasked;
  b.samples = {turns, masked};
  auto back = train_batch_from_json(to_json(b));
  ASSERT_TRUE(back) << back.error().what();
  ASSERT_EQ(back->samples.size(), 2u);
  EXPECT_EQ(back->samples[0].loss_mask, (std::vector<std::uint8_t>{1, 0, 1}));
  EXPECT_EQ(back->samples[0].fate, SampleFate::kTrain);
  EXPECT_TRUE(back->samples[1].loss_mask.empty());
  EXPECT_EQ(back->samples[1].fate, SampleFate::kMasked);
}

// Pending tasks survive a checkpoint whole: completions and chat tasks, token ids and info.
TEST(Checkpoint, PendingTasksRoundTrip) {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("arlo_orch_ckpt_tasks_{}", ::getpid());
  std::filesystem::create_directories(dir / "orchestrator");
  const Task completion = rollout::test::sample_completion_task(), chat = rollout::test::sample_chat_task();
  CheckpointState state;
  state.step = 3;
  state.version = 3;
  state.task_cursor = {{"next", 9}};
  state.pending_tasks = {completion, chat};
  ASSERT_TRUE(write_checkpoint(checkpoint_path(dir), state));
  auto r = read_checkpoint(checkpoint_path(dir));
  ASSERT_TRUE(r && r->has_value()) << (r ? "no checkpoint" : r.error().what());
  ASSERT_EQ((*r)->pending_tasks.size(), 2u);
  EXPECT_EQ((*r)->pending_tasks[0], completion);
  EXPECT_EQ((*r)->pending_tasks[1], chat);
  EXPECT_TRUE((*r)->pending_tasks[1].is_chat());
  std::filesystem::remove_all(dir);
}

// A checkpoint written before tasks had one type: numeric ids (a sequence number) with the
// environment's id in info["task_id"], and a chat task's prompt as text beside its messages. A run
// resumes from it with the environment's ids and the tasks as the environment gave them.
TEST(Checkpoint, ReadsPendingTasksEarlierVersionsWrote) {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("arlo_orch_ckpt_old_{}", ::getpid());
  std::filesystem::create_directories(dir / "orchestrator");
  std::ofstream(checkpoint_path(dir))
      << R"({"format": 1, "step": 2, "version": 2, "task_cursor": {"stream": {}, "seq": 10},
    "rng": "", "ledger": {}, "pending_tasks": [
      {"id": 7, "env": "arithmetic", "prompt": "2+3=", "messages": [], "prompt_tokens": [1, 50],
       "answer": "5", "answer_tokens": [53, 0], "info": {"task_id": "arithmetic-7", "level": 1}},
      {"id": 8, "env": "gsm8k", "prompt": "user: 2+2?", "messages": [{"role": "user", "content": "2+2?"}],
       "prompt_tokens": [], "answer": "4", "answer_tokens": [], "info": {"task_id": "q-8"}},
      {"id": 9, "env": "default", "prompt": "task 9", "messages": [], "prompt_tokens": [9, 5],
       "answer": "1", "answer_tokens": [1, 0], "info": {}}]})";
  auto r = read_checkpoint(checkpoint_path(dir));
  ASSERT_TRUE(r && r->has_value()) << (r ? "no checkpoint" : r.error().what());
  const auto& tasks = (*r)->pending_tasks;
  ASSERT_EQ(tasks.size(), 3u);
  EXPECT_EQ(tasks[0].id, "arithmetic-7");
  EXPECT_EQ(tasks[0].env, "arithmetic");
  EXPECT_EQ(tasks[0].prompt, std::optional<std::string>("2+3="));
  EXPECT_TRUE(tasks[0].messages.empty());
  EXPECT_EQ(tasks[0].prompt_tokens, (std::vector<std::int32_t>{1, 50}));
  EXPECT_EQ(tasks[0].answer, "5");
  EXPECT_EQ(tasks[0].answer_tokens, (std::vector<std::int32_t>{53, 0}));
  EXPECT_EQ(tasks[0].info, nlohmann::json({{"level", 1}}));
  EXPECT_EQ(tasks[1].id, "q-8");
  EXPECT_TRUE(tasks[1].is_chat());
  EXPECT_EQ(tasks[1].messages, (std::vector<ChatMessage>{{"user", "2+2?"}}));
  EXPECT_EQ(tasks[1].prompt_text(), "user: 2+2?");
  EXPECT_EQ(tasks[1].info, nlohmann::json::object());
  EXPECT_EQ(tasks[2].id, "9");  // no environment id: the number is the id
  EXPECT_EQ(tasks[2].prompt, std::optional<std::string>("task 9"));
  std::filesystem::remove_all(dir);
}

TEST(Eval, UnbiasedPassAtK) {
  EXPECT_DOUBLE_EQ(pass_at_k(4, 1, 1), 0.25);
  EXPECT_DOUBLE_EQ(pass_at_k(4, 1, 2), 0.5);
  EXPECT_DOUBLE_EQ(pass_at_k(4, 0, 3), 0.0);
  EXPECT_DOUBLE_EQ(pass_at_k(4, 4, 2), 1.0);
  EXPECT_NEAR(pass_at_k(5, 2, 3), 0.9, 1e-12);
}

std::vector<nlohmann::json> records_of(const session::Reporter& r, const std::string& kind) {
  std::vector<nlohmann::json> out;
  const auto all = nlohmann::json::parse(r.records().since(0));
  for (const auto& r : all.at("records"))
    if (r.at("kind") == kind) out.push_back(r);
  return out;
}

TEST(Records, StepRecordsCarryTrainerRewardModuleAndStalenessFigures) {
  Harness h;
  h.report = true;
  h.opt.max_steps = 3;
  h.inf.auto_complete = true;
  h.trainer.auto_publish = true;
  h.start();
  ASSERT_TRUE(h.run_until([&] { return h.orch->finished(); }));
  const auto steps = records_of(*h.reporter, "step");
  ASSERT_EQ(steps.size(), 3u);
  for (const auto& r : steps) {
    const auto line = r.dump();
    // Off-policy histogram: every sample of the batch in one bucket.
    int in_histogram = 0;
    for (const auto& n : r.at("off_policy/histogram")) in_histogram += n.get<int>();
    EXPECT_EQ(in_histogram, 4) << line;
    // The reward module's own figures, averaged over the batch.
    EXPECT_DOUBLE_EQ(r.at("train/reward/fake/mean").get<double>(), r.at("train/reward/mean").get<double>()) << line;
    EXPECT_DOUBLE_EQ(r.at("train/reward/fake/tokens").get<double>(), 3.0) << line;
    EXPECT_DOUBLE_EQ(r.at("train/reward/failed").get<double>(), 0.0) << line;
  }
  // Step 1 is cut before any version was published; step 3 waits for v1 (async level 1), so it
  // carries the newest trainer figures, numbers only, under trainer/.
  EXPECT_FALSE(steps[0].contains("trainer/loss")) << steps[0].dump();
  EXPECT_DOUBLE_EQ(steps[2].at("trainer/loss").get<double>(), 0.5) << steps[2].dump();
  EXPECT_DOUBLE_EQ(steps[2].at("trainer/lr").get<double>(), 1e-3) << steps[2].dump();
  EXPECT_GE(steps[2].at("trainer/step").get<int>(), 1) << steps[2].dump();
  for (const auto& r : steps) EXPECT_FALSE(r.contains("trainer/note")) << r.dump();
  // One weight_sync record per version pushed (notices that arrive during an update coalesce),
  // each worker's phases in it.
  const auto syncs = records_of(*h.reporter, "weight_sync");
  ASSERT_GE(syncs.size(), 2u);
  EXPECT_EQ(syncs.back().at("version").get<int>(), 3);
  int last_version = 0;
  for (const auto& r : syncs) {
    EXPECT_GT(r.at("version").get<int>(), last_version) << r.dump();
    last_version = r.at("version").get<int>();
    EXPECT_TRUE(r.at("applied").get<bool>()) << r.dump();
    ASSERT_EQ(r.at("workers").size(), 2u) << r.dump();
    for (const auto& w : r.at("workers")) {
      EXPECT_TRUE(w.at("ok").get<bool>()) << r.dump();
      for (const char* k : {"pause_s", "update_s", "resume_s", "start"}) EXPECT_GE(w.at(k).get<double>(), 0.0) << k;
    }
  }
  const auto status = h.reporter->status_json();
  ASSERT_EQ(status.at("workers").size(), 2u) << status.dump();
  for (const auto& w : status.at("workers")) {
    EXPECT_EQ(w.at("version").get<int>(), 3) << status.dump();
    EXPECT_TRUE(w.at("healthy").get<bool>()) << status.dump();
    EXPECT_EQ(w.at("syncs").get<std::size_t>(), syncs.size()) << status.dump();
  }
  EXPECT_TRUE(status.at("finished").get<bool>());
}

TEST(Records, AWorkerThatFailsAnUpdateIsUnhealthyAndNamed) {
  Harness h;
  h.report = true;
  h.inf.slow_pause = {"w1"};
  h.start();
  ASSERT_TRUE(h.publish_and_sync(1));
  const auto syncs = records_of(*h.reporter, "weight_sync");
  ASSERT_EQ(syncs.size(), 1u);
  EXPECT_EQ(syncs[0].at("weight_sync/workers_failed").get<int>(), 1) << syncs[0].dump();
  for (const auto& w : syncs[0].at("workers")) {
    const bool hung = w.at("worker") == "w1";
    EXPECT_EQ(w.at("ok").get<bool>(), !hung) << syncs[0].dump();
    EXPECT_EQ(w.at("error").get<std::string>().empty(), !hung) << syncs[0].dump();
  }
  // Every admin call of w1 waited out its deadline: 2 attempts of 5 s plus the 1 s backoff.
  for (const auto& w : syncs[0].at("workers"))
    if (w.at("worker") == "w1") {
      EXPECT_DOUBLE_EQ(w.at("pause_s").get<double>(), 11.0) << syncs[0].dump();
    }
  for (const auto& w : h.reporter->status_json().at("workers")) {
    const bool hung = w.at("worker") == "w1";
    EXPECT_EQ(w.at("healthy").get<bool>(), !hung);
    EXPECT_EQ(w.at("version").get<int>(), hung ? 0 : 1);
    EXPECT_EQ(w.at("failures").get<int>(), hung ? 1 : 0);
  }
}

TEST(Observer, TheLoopReportsEachStepSyncEvalAndTheEndInOrder) {
  Harness h;
  h.opt.max_steps = 3;
  h.opt.eval_at_end = true;
  h.opt.eval_samples = 2;
  h.opt.eval_pass_k = {1};
  h.inf.auto_complete = true;
  h.trainer.auto_publish = true;
  h.start({eval_task(1000, {9, 9})});
  ASSERT_TRUE(h.run_until([&] { return h.orch->finished(); }));
  const auto& seen = h.seen;
  ASSERT_EQ(seen.starts.size(), 1u);
  EXPECT_EQ(seen.order.front(), "start");
  EXPECT_EQ(seen.starts[0].start_step, 0);
  EXPECT_EQ(seen.starts[0].workers, (std::vector<std::string>{"w0", "w1"}));
  ASSERT_EQ(seen.steps.size(), 3u);
  for (std::size_t i = 0; i < seen.steps.size(); ++i) {
    const auto& s = seen.steps[i];
    EXPECT_EQ(s.report.step, static_cast<std::int64_t>(i + 1));
    EXPECT_EQ(s.report.samples, 4);
    EXPECT_GE(s.completed, 4u * (i + 1));  // every sample of the batches so far completed
    EXPECT_EQ(s.ledger.at("dispatched").get<std::uint64_t>(),
              s.completed + s.failed + s.cancelled + s.ledger.at("in_flight").get<std::uint64_t>());
  }
  EXPECT_GE(seen.scored, 6u);  // every group of the three batches was scored
  ASSERT_FALSE(seen.syncs.empty());
  Version last = kNoVersion;
  for (const auto& s : seen.syncs) {
    EXPECT_GT(s.report.version, last);
    EXPECT_TRUE(s.report.applied);
    EXPECT_EQ(s.report.workers.size(), 2u);
    last = s.report.version;
  }
  EXPECT_EQ(last, 3);
  ASSERT_EQ(seen.evals.size(), 1u);
  EXPECT_EQ(seen.evals[0].step, 3);
  // Once, last, after the final version was synced and evaluated; it carries what summary() holds.
  ASSERT_EQ(seen.ends.size(), 1u);
  EXPECT_EQ(seen.order.back(), "end");
  const auto at = [&](const std::string& what) {
    return std::find(seen.order.begin(), seen.order.end(), what) - seen.order.begin();
  };
  EXPECT_LT(at("step 3"), at("sync v3"));
  EXPECT_LT(at("sync v3"), at("eval v3"));
  const auto& end = seen.ends[0];
  EXPECT_TRUE(end.summary.ok) << end.summary.error;
  EXPECT_EQ(end.summary.steps, 3);
  EXPECT_EQ(end.summary.ledger, h.orch->summary().ledger);
  EXPECT_EQ(end.dispatched, h.orch->ledger().dispatched_total());
  EXPECT_EQ(end.completed + end.failed + end.cancelled, end.dispatched);
}

TEST(Observer, APipelineViewEveryLogInterval) {
  Harness h;
  h.opt.log_interval_s = 5;
  h.start();
  h.inf.complete_all();  // steps 1 and 2 (async level 1); step 3 waits for v1
  ASSERT_TRUE(h.run_until([&] { return h.seen.pipelines.size() >= 2; }));
  const auto& v = h.seen.pipelines.back();
  EXPECT_EQ(v.step, h.orch->step());
  EXPECT_GE(v.step, 1);
  EXPECT_EQ(v.max_steps, 10);
  EXPECT_EQ(v.version, 0);
  EXPECT_EQ(v.inflight, h.orch->dispatcher().inflight_samples());
  EXPECT_TRUE(h.seen.ends.empty());
}

// GETs each path from the status port, stepping the io_context (real sockets) until all answered.
std::map<std::string, Result<http::Response>> http_get(Harness& h, const std::vector<std::string>& paths) {
  const std::string base = "http://127.0.0.1:" + std::to_string(h.reporter->status_port());
  http::Client client(h.io);
  std::map<std::string, Result<http::Response>> got;
  spawn(h.io.get_executor(), [&]() -> Awaitable<void> {
    for (const auto& path : paths) got.emplace(path, co_await client.get(base + path, std::chrono::seconds(20)));
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (got.size() < paths.size() && std::chrono::steady_clock::now() < deadline) {
    h.io.restart();
    h.io.run_one_for(std::chrono::milliseconds(100));
  }
  return got;
}

TEST(Records, StatusPortServesTheRecordsTheStatusAndLabelledMetricsOverHttp) {
  Harness h;
  h.opt.status_port = 0;
  h.opt.status_linger = std::chrono::seconds(3);
  h.inf.auto_complete = true;  // the trainer publishes v1 only: the gate holds the run at step 2
  h.report = true;
  h.start();
  ASSERT_TRUE(h.run_until([&] { return h.orch->train_sink().steps_cut() >= 2; }));
  h.trainer.publish(1);
  ASSERT_TRUE(h.run_until([&] { return h.orch->dispatcher().version() == 1; }));
  auto got = http_get(h, {"/api/records?since=0", "/api/status", "/metrics", "/api/records?since=x"});
  ASSERT_EQ(got.size(), 4u);
  for (const auto& [path, r] : got) ASSERT_TRUE(r) << path << ": " << r.error().what();
  auto records = got.at("/api/records?since=0")->parse_json();
  ASSERT_TRUE(records);
  EXPECT_EQ(records->at("next").get<std::uint64_t>(), h.reporter->records().next());
  EXPECT_EQ(records->at("records").size(), h.reporter->records().next());
  int steps = 0;
  for (const auto& r : records->at("records")) steps += r.at("kind") == "step" ? 1 : 0;
  EXPECT_GE(steps, 2);
  auto status = got.at("/api/status")->parse_json();
  ASSERT_TRUE(status);
  EXPECT_EQ(status->at("workers").size(), 2u) << status->dump();
  EXPECT_EQ(status->at("max_steps").get<int>(), 10);
  EXPECT_FALSE(status->at("finished").get<bool>());
  const auto& text = got.at("/metrics")->body;
  EXPECT_NE(text.find("arlo_worker_version{worker=\"w0\"}"), std::string::npos) << text;
  EXPECT_NE(text.find("arlo_weight_sync_worker_seconds{worker=\"w1\"}"), std::string::npos) << text;
  EXPECT_NE(text.find("arlo_trainer_loss 0.5"), std::string::npos) << text;
  EXPECT_EQ(got.at("/api/records?since=x")->status, 400);
  EXPECT_NE(got.at("/api/records?since=x")->body.find("since"), std::string::npos);

  // After the end the port stays open for status_linger: it says finished, then closes.
  h.orch->request_stop("test over");
  bool waited = false;
  spawn(h.io.get_executor(), [&]() -> Awaitable<void> {
    co_await h.reporter->wait_closed();
    waited = true;
  });
  ASSERT_TRUE(h.run_until([&] { return h.orch->finished(); }));
  auto after = http_get(h, {"/api/status"});
  ASSERT_EQ(after.size(), 1u);
  ASSERT_TRUE(after.at("/api/status"));
  auto end = after.at("/api/status")->parse_json();
  ASSERT_TRUE(end);
  EXPECT_TRUE(end->at("finished").get<bool>()) << end->dump();
  EXPECT_FALSE(waited);
  EXPECT_TRUE(h.run_until([&] { return waited; }));
}

// The trainer tests' run: inference answers at once, the trainer takes step 1 and then acknowledges
// nothing until told to (step 2 waits), and waits for it raise an alarm every `alarm`.
void start_with_a_stalled_trainer(Harness& h, Duration alarm) {
  h.opt.trainer_alarm = alarm;
  h.trainer.max_pending = 1;
  h.inf.auto_complete = true;
  h.start();
}

// The stalled trainer comes back: it acknowledges and publishes every step from now on, and the run
// finishes ok with all its `steps`.
void trainer_comes_back_and_the_run_finishes(Harness& h, std::int64_t steps) {
  h.trainer.auto_publish = true;
  h.trainer.ack(1);
  h.trainer.publish(1);
  ASSERT_TRUE(h.run_until([&] { return h.orch->finished(); }));
  EXPECT_TRUE(h.orch->summary().ok) << h.orch->summary().error;
  EXPECT_EQ(h.orch->summary().steps, steps);
}

// The run ends by itself, failed, with an error naming each of `parts`.
void expect_the_run_stops_naming(Harness& h, const std::vector<std::string>& parts) {
  ASSERT_TRUE(h.run_until([&] { return h.orch->finished(); }));
  const auto& s = h.orch->summary();
  EXPECT_FALSE(s.ok);
  for (const auto& part : parts) EXPECT_NE(s.error.find(part), std::string::npos) << s.error;
}

TEST(Trainer, ASilentTrainerRaisesAlarmsThenStopsTheRunNamingTheStep) {
  Harness h;
  h.opt.trainer_timeout = std::chrono::seconds(330);
  start_with_a_stalled_trainer(h, std::chrono::seconds(60));
  expect_the_run_stops_naming(h, {"sending batch 2", "trainer.accept_timeout_s"});
  EXPECT_EQ(h.orch->train_sink().trainer_alarms(), 5u);  // at 60, 120, 180, 240 and 300 s
  EXPECT_EQ(h.trainer.batches.size(), 1u);
}

TEST(Trainer, ABusyTrainerRaisesAnAlarmAndTheRunGoesOn) {
  Harness h;
  h.opt.max_steps = 3;
  h.opt.trainer_timeout = std::chrono::seconds(3600);
  start_with_a_stalled_trainer(h, std::chrono::seconds(60));
  ASSERT_TRUE(h.run_until([&] { return h.orch->train_sink().trainer_alarms() >= 1; }));
  ASSERT_NO_FATAL_FAILURE(trainer_comes_back_and_the_run_finishes(h, 3));
  EXPECT_EQ(h.orch->train_sink().trainer_alarms(), 1u);
}

// The trainer's host becomes unreachable: it neither acknowledges nor heartbeats. The run waits
// for the batch without an accept deadline, so only the silence deadline can end it: warnings every
// trainer_alarm, then the run stops naming the trainer and the key.
TEST(Trainer, ASilentTrainerStopsTheRunPastTheSilenceTimeoutNamingTheKey) {
  Harness h;
  h.opt.trainer_silence_timeout = std::chrono::seconds(35);
  start_with_a_stalled_trainer(h, std::chrono::seconds(10));
  h.trainer.heartbeat();  // heard from once, then silent
  const auto heard = h.clock.now();
  expect_the_run_stops_naming(h,
                              {"the trainer has not been heard from for 35.0 s", "trainer.silence_timeout_s (35 s)"});
  EXPECT_EQ(h.orch->trainer_silence_alarms(), 3u);  // at 10, 20 and 30 s
  EXPECT_GE(h.clock.now() - heard, std::chrono::seconds(35));
  EXPECT_LT(h.clock.now() - heard, std::chrono::seconds(40));
}

// A trainer that keeps heartbeating while it holds a batch for long is busy, not gone: no silence
// warning, no stop; a trainer never heard from (a bridge without heartbeats) is not timed either.
TEST(Trainer, ABusyTrainerThatHeartbeatsIsNotSilent) {
  Harness h;
  h.opt.max_steps = 3;
  h.opt.trainer_silence_timeout = std::chrono::seconds(5);
  start_with_a_stalled_trainer(h, std::chrono::seconds(10));
  const auto until = h.clock.now() + std::chrono::seconds(100);
  std::function<void()> beat = [&] {  // every second, for 100 s
    h.trainer.heartbeat();
    if (h.clock.now() < until) h.keep.push_back(h.clock.schedule(h.clock.now() + std::chrono::seconds(1), beat));
  };
  beat();
  ASSERT_TRUE(h.run_until([&] { return h.clock.now() >= until; }));
  EXPECT_FALSE(h.orch->finished()) << h.orch->summary().error;
  EXPECT_EQ(h.orch->trainer_silence_alarms(), 0u);
  ASSERT_NO_FATAL_FAILURE(trainer_comes_back_and_the_run_finishes(h, 3));
}

// trainer.silence_timeout_s 0: the run waits for a silent trainer as long as it takes (warning
// every trainer_alarm); when it comes back the run finishes.
TEST(Trainer, WithoutASilenceTimeoutTheRunWaitsForTheTrainer) {
  Harness h;
  h.opt.max_steps = 3;
  start_with_a_stalled_trainer(h, std::chrono::seconds(60));
  h.trainer.heartbeat();
  ASSERT_TRUE(h.run_until([&] { return h.orch->trainer_silence_alarms() >= 10; }));  // 10 minutes of silence
  EXPECT_FALSE(h.orch->finished()) << h.orch->summary().error;
  h.trainer.heartbeat();  // back
  ASSERT_NO_FATAL_FAILURE(trainer_comes_back_and_the_run_finishes(h, 3));
  EXPECT_EQ(h.orch->trainer_silence_alarms(), 10u);
}

TEST(Options, RejectsInconsistentValues) {
  Options o;
  o.batch_size = 6;
  o.group_size = 4;
  EXPECT_FALSE(o.validate());
  o.batch_size = 8;
  EXPECT_TRUE(o.validate());
  o.sft_warmup_steps = static_cast<int>(o.max_steps);
  auto st = o.validate();
  ASSERT_FALSE(st);
  // Messages name the config keys users set.
  EXPECT_NE(st.error().what().find("run.max_steps="), std::string::npos) << st.error().what();
  o.sft_warmup_steps = 0;
  o.log_interval_s = 0;
  st = o.validate();
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().what().find("log.interval_s"), std::string::npos) << st.error().what();
}

TEST(LedgerDeathTest, DoubleEndAborts) {
  Ledger l;
  l.dispatched(1);
  l.completed(1);
  EXPECT_DEATH(l.failed("x"), "");
}

}  // namespace
}  // namespace arlo::orch
