// Multi-turn trajectories in the dispatcher (docs/environments.md): reset before a group's first
// request, a step after each model turn, the next turn a continuation of the trajectory's exact ids,
// and the limits and failures that end a trajectory. A fake environment answers when the test says
// so (or at once in auto mode); the io_context is stepped by hand, time moved by a fake clock.
// GCC 12 warns of an uninitialized std::expected move inside FakeInference::abort_all when a test
// calls it directly (a false positive: the value is set on the line before).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>

#include "orchestrator/dispatcher.h"
#include "orchestrator/orchestrator.h"
#include "testing/loop_fakes.h"

namespace arlo::orch {
namespace {

using testing::FakeInference;
using Tokens = std::vector<std::int32_t>;

// An environment that records every call. By default reset gives one message and the state
// {"turn": 0}; a step gives feedback ("again", tokens {90, 91}) until the model has had two turns,
// then done with reward 1.
class FakeEnv final : public EnvironmentPort {
 public:
  struct Call {
    bool reset = false;
    std::shared_ptr<const Task> task;
    Sample trajectory;  // a step's view of the trajectory (a copy)
    Tokens prompt;
    TimePoint deadline{};
    Promise<Result<EnvReply>> promise;
    bool answered = false;
  };
  explicit FakeEnv(asio::any_io_executor ex) : ex_(ex) {}

  bool multi_turn(const Task&) const override { return multi; }
  Awaitable<Result<EnvReply>> reset(std::shared_ptr<const Task> task, TimePoint deadline) override {
    Promise<Result<EnvReply>> p(ex_);
    calls.push_back(Call{true, std::move(task), {}, {}, deadline, p});
    if (auto_answer) answer(calls.size() - 1);
    co_return co_await p.get();
  }
  Awaitable<Result<EnvReply>> step(std::shared_ptr<const Task> task, const Sample& trajectory, Tokens prompt,
                                   TimePoint deadline) override {
    Promise<Result<EnvReply>> p(ex_);
    calls.push_back(Call{false, std::move(task), trajectory, std::move(prompt), deadline, p});
    if (auto_answer) answer(calls.size() - 1);
    co_return co_await p.get();
  }

  void answer(std::size_t i) {
    auto& c = calls.at(i);
    answer(i, c.reset ? on_reset(c) : on_step(c));
  }
  void answer(std::size_t i, Result<EnvReply> reply) {
    auto& c = calls.at(i);
    if (c.answered) return;
    c.answered = true;
    c.promise.set(std::move(reply));
  }
  std::vector<std::size_t> open() const {  // the calls not answered yet, by index
    std::vector<std::size_t> unanswered;
    std::size_t index = 0;
    for (const auto& c : calls) unanswered.insert(unanswered.end(), c.answered ? 0 : 1, index++);
    return unanswered;
  }
  // The open step of a sample.
  std::size_t open_step(int sample) const {
    for (auto i : open())
      if (!calls[i].reset && calls[i].trajectory.sample_index == sample) return i;
    ADD_FAILURE() << "no open step of sample " << sample;
    return calls.size();
  }
  std::size_t steps() const {
    return static_cast<std::size_t>(std::count_if(calls.begin(), calls.end(), [](const Call& c) { return !c.reset; }));
  }

  static int model_turns(const Sample& s) {
    return static_cast<int>(
        std::count_if(s.turns.begin(), s.turns.end(), [](const ChatMessage& m) { return m.role == "assistant"; }));
  }

  bool multi = true;
  bool auto_answer = true;
  int done_after = 2;  // model turns
  std::function<Result<EnvReply>(const Call&)> on_reset = [](const Call&) -> Result<EnvReply> {
    EnvReply r;
    r.messages = {{"user", "solve it"}};
    r.state = {{"turn", 0}};
    return r;
  };
  std::function<Result<EnvReply>(const Call&)> on_step = [this](const Call& c) -> Result<EnvReply> {
    EnvReply r;
    const int turns = model_turns(c.trajectory);
    r.state = {{"turn", turns}};
    if (turns >= done_after) {
      r.messages = {{"user", "right"}};
      r.done = true;
      r.reward = 1.0;
    } else {
      r.messages = {{"user", "again"}};
      r.tokens = {90, 91};
    }
    return r;
  };
  std::vector<Call> calls;

 private:
  asio::any_io_executor ex_;
};

// The dispatcher alone, one train group of two samples; complete groups are taken as trained.
// Declaration order: the clock outlives the io_context, which outlives the fakes and the dispatcher.
struct Rig {
  FakeClock clock;
  asio::io_context io;
  FakeInference inf{io.get_executor()};
  testing::FakeTasks tasks;
  FakeEnv env{io.get_executor()};
  Options opt;
  Ledger ledger;
  std::vector<GroupPtr> complete;
  std::unique_ptr<RolloutDispatcher> d;

  Rig() {
    opt.batch_size = 2;
    opt.group_size = 2;
    opt.max_steps = 1;  // one group
    opt.max_inflight = 64;
    opt.sampling.max_tokens = 16;
    opt.env_timeout = std::chrono::seconds(5);
    // Each answer's text names its prompt's length and its sample: "p7s1".
    inf.answer = [](const GenerateRequest& r, int j) {
      Sample c;
      c.completion_tokens = {j % 2, 10 + j, 20 + j};
      c.logprobs = {-0.5f, -0.5f, -0.5f};
      c.finish_reason = FinishReason::kStop;
      c.text = fmt::format("p{}s{}", r.prompt_tokens.size(), j);
      return c;
    };
  }
  ~Rig() {
    auto st = ledger.check();
    EXPECT_TRUE(st) << st.error().what();
    EXPECT_EQ(ledger.dispatched_total(),
              ledger.completed_total() + ledger.failed_total() + ledger.cancelled_total() + ledger.in_flight());
    d.reset();
  }
  void start() {
    DispatcherHooks h;
    h.on_train_group = [this](GroupPtr g) {
      ledger.dispose("trained", g->completions.size());
      complete.push_back(std::move(g));
    };
    h.on_eval_group = [](GroupPtr) {};
    h.backlog_groups = [this] { return static_cast<std::int64_t>(complete.size()); };
    d = std::make_unique<RolloutDispatcher>(io.get_executor(), clock, inf, tasks, ledger, opt, std::move(h), &env);
    d->pump();
    settle();
  }
  void settle() {
    do {
      io.restart();
    } while (io.poll() > 0);
  }
  // Completes every open request and answers every environment call until nothing is open.
  void run_out() {
    for (int i = 0; i < 100 && (!inf.open().empty() || !env.open().empty()); ++i) {
      inf.complete_all();
      for (auto c : env.open()) env.answer(c);
      settle();
    }
  }
  const Sample& sample(int i) const { return complete.at(0)->completions.at(i); }
  // The environment answers only when told: its reset now, then the group's first answers, which
  // leaves each sample's first step open.
  void to_first_steps() {
    env.auto_answer = false;
    start();
    env.answer(0);
    settle();
    inf.complete_all();
    settle();
  }
};

TEST(MultiTurn, ATwoTurnTrajectoryIsOneSequenceWithTheEnvironmentsTokensMaskedOut) {
  Rig r;
  r.env.auto_answer = false;
  r.start();
  ASSERT_EQ(r.env.calls.size(), 1u);  // the group's reset, before any request
  EXPECT_TRUE(r.env.calls[0].reset);
  EXPECT_TRUE(r.inf.requests().empty());
  r.env.answer(0);
  r.settle();
  ASSERT_EQ(r.inf.requests().size(), 1u);
  const auto& first = r.inf.requests()[0];
  EXPECT_EQ(first.n, 2);
  // The reset's messages replaced the task's prompt: the server tokenizes them.
  EXPECT_TRUE(first.prompt_tokens.empty());
  EXPECT_EQ(first.task->messages, (std::vector<ChatMessage>{{"user", "solve it"}}));
  EXPECT_FALSE(first.task->prompt.has_value());
  r.run_out();
  ASSERT_EQ(r.complete.size(), 1u);
  ASSERT_EQ(r.inf.requests().size(), 3u);  // the group, then one continuation per sample
  for (int j = 0; j < 2; ++j) {
    const auto& s = r.sample(j);
    // Turn 2 is a request of its own (n = 1): the fake answers it as sample 0 of its request.
    Tokens want = {j % 2, 10 + j, 20 + j, 90, 91, 0, 10, 20};
    EXPECT_EQ(s.completion_tokens, want);
    EXPECT_EQ(s.loss_mask, (std::vector<std::uint8_t>{1, 1, 1, 0, 0, 1, 1, 1}));
    EXPECT_EQ(s.logprobs, (std::vector<float>{-0.5f, -0.5f, -0.5f, 0, 0, -0.5f, -0.5f, -0.5f}));
    // Turn 2's prompt was the group's prompt ids and the 5 tokens so far: its text says p7.
    const auto first_text = fmt::format("p0s{}", j);
    EXPECT_EQ(s.turns, (std::vector<ChatMessage>{
                           {"assistant", first_text}, {"user", "again"}, {"assistant", "p7s0"}, {"user", "right"}}));
    EXPECT_EQ(s.text, "p7s0");  // the last model turn's
    ASSERT_TRUE(s.env_reward);
    EXPECT_EQ(*s.env_reward, 1.0);
    EXPECT_EQ(s.env_state, (nlohmann::json{{"turn", 2}}));
    EXPECT_EQ(s.finish_reason, FinishReason::kStop);
    EXPECT_EQ(s.turn_versions, (std::vector<Version>{0, 0}));
    EXPECT_EQ(s.token_versions(), std::vector<std::int32_t>(8, 0));
  }
  EXPECT_EQ(r.ledger.completed_total(), 2u);
  EXPECT_EQ(r.d->model_turns_total(), 4u);
  EXPECT_EQ(r.d->trajectories_total(), 2u);
  EXPECT_EQ(r.d->env_failed_total(), 0u);
}

TEST(MultiTurn, EachTurnsPromptExtendsThePreviousIdsExactly) {
  Rig r;
  r.env.on_reset = [](const FakeEnv::Call&) -> Result<EnvReply> { return EnvReply{}; };  // keeps the prompt
  r.env.done_after = 3;
  r.start();
  r.run_out();
  ASSERT_EQ(r.complete.size(), 1u);
  const Tokens task_prompt = {0, 5};  // task 0's ids
  // Requests: the group, then each sample's turns 2 and 3, on the group's worker (same group id).
  ASSERT_EQ(r.inf.requests().size(), 5u);
  EXPECT_EQ(r.inf.requests()[0].prompt_tokens, task_prompt);
  std::map<std::int32_t, Tokens> previous;  // per sample (by its first token), the ids sent last
  for (std::size_t i = 1; i < 5; ++i) {
    const auto& req = r.inf.requests()[i];
    EXPECT_EQ(req.n, 1);
    EXPECT_EQ(req.group_id, r.inf.requests()[0].group_id);
    ASSERT_GT(req.prompt_tokens.size(), 2u);
    EXPECT_EQ(Tokens(req.prompt_tokens.begin(), req.prompt_tokens.begin() + 2), task_prompt);
    auto& prev = previous[req.prompt_tokens[2]];
    if (!prev.empty()) {  // the previous turn's prompt, its answer, the environment's ids
      ASSERT_EQ(req.prompt_tokens.size(), prev.size() + 5);
      EXPECT_EQ(Tokens(req.prompt_tokens.begin(), req.prompt_tokens.begin() + static_cast<long>(prev.size())), prev);
      EXPECT_EQ(Tokens(req.prompt_tokens.end() - 2, req.prompt_tokens.end()), (Tokens{90, 91}));
    }
    prev = req.prompt_tokens;
  }
  for (int j = 0; j < 2; ++j) {
    const auto& s = r.sample(j);
    EXPECT_EQ(s.completion_tokens.size(), 13u);
    Tokens full = task_prompt;
    full.insert(full.end(), s.completion_tokens.begin(), s.completion_tokens.end() - 3);
    EXPECT_EQ(previous.at(j % 2), full);  // the last turn's prompt is everything before its answer
  }
  // Each step saw the group's prompt ids and the trajectory ending with the model's turn.
  for (const auto& c : r.env.calls) {
    if (c.reset) continue;
    EXPECT_EQ(c.prompt, task_prompt);
    ASSERT_FALSE(c.trajectory.turns.empty());
    EXPECT_EQ(c.trajectory.turns.back().role, "assistant");
    EXPECT_EQ(c.trajectory.loss_mask.size(), c.trajectory.completion_tokens.size());
    EXPECT_EQ(c.deadline, r.clock.now() + r.opt.env_timeout);  // the fake clock did not move
  }
}

TEST(MultiTurn, MaxTurnsEndsTheTrajectoryAsLength) {
  Rig r;
  r.opt.max_turns = 3;
  r.env.done_after = 100;  // never done
  r.start();
  r.run_out();
  ASSERT_EQ(r.complete.size(), 1u);
  EXPECT_EQ(r.env.steps(), 6u);  // the last turn is stepped too (the environment may end it with a reward)
  for (int j = 0; j < 2; ++j) {
    const auto& s = r.sample(j);
    EXPECT_EQ(FakeEnv::model_turns(s), 3);
    EXPECT_EQ(s.finish_reason, FinishReason::kLength);
    EXPECT_EQ(s.turn_versions.size(), 3u);
    EXPECT_EQ(s.loss_mask.size(), s.completion_tokens.size());
    EXPECT_FALSE(s.env_reward);
  }
}

TEST(MultiTurn, TheTokenBudgetCutsTheEnvironmentsTokensAndEndsAsLength) {
  Rig r;
  r.opt.max_trajectory_tokens = 6;
  r.env.done_after = 100;
  r.env.on_step = [](const FakeEnv::Call&) -> Result<EnvReply> {
    EnvReply e;
    e.messages = {{"tool", "4 tokens"}};
    e.tokens = {90, 91, 92, 93};
    return e;
  };
  r.start();
  r.run_out();
  ASSERT_EQ(r.complete.size(), 1u);
  EXPECT_EQ(r.inf.requests()[0].sampling.max_tokens, 6);  // min(sampling.max_tokens, the budget)
  ASSERT_EQ(r.inf.requests().size(), 1u);                 // no room left for a second turn
  for (int j = 0; j < 2; ++j) {
    const auto& s = r.sample(j);
    EXPECT_EQ(s.completion_tokens, (Tokens{j % 2, 10 + j, 20 + j, 90, 91, 92}));
    EXPECT_EQ(s.loss_mask, (std::vector<std::uint8_t>{1, 1, 1, 0, 0, 0}));
    EXPECT_EQ(s.finish_reason, FinishReason::kLength);
  }
}

TEST(MultiTurn, TheNextTurnAsksOnlyForTheBudgetLeftAndAnOverrunIsCut) {
  Rig r;
  r.opt.max_trajectory_tokens = 7;
  r.env.done_after = 100;
  r.start();
  r.run_out();
  ASSERT_EQ(r.complete.size(), 1u);
  ASSERT_EQ(r.inf.requests().size(), 3u);
  EXPECT_EQ(r.inf.requests()[1].sampling.max_tokens, 2);  // 7 - (3 + 2)
  for (int j = 0; j < 2; ++j) {
    const auto& s = r.sample(j);  // the fake answers 3 tokens whatever max_tokens says
    EXPECT_EQ(s.completion_tokens.size(), 7u);
    EXPECT_EQ(s.loss_mask, (std::vector<std::uint8_t>{1, 1, 1, 0, 0, 1, 1}));
    EXPECT_EQ(s.logprobs.size(), 7u);
    EXPECT_EQ(s.finish_reason, FinishReason::kLength);
  }
  EXPECT_EQ(r.env.steps(), 2u);  // a turn cut by the budget is not stepped
}

TEST(MultiTurn, AStepTimeoutFailsThatSampleAndItsGroupIsDroppedWhole) {
  Rig r;
  r.to_first_steps();
  ASSERT_EQ(r.env.open().size(), 2u);
  r.env.answer(r.env.open_step(0));  // sample 0 goes on; sample 1's environment never answers
  r.settle();
  r.inf.complete_all();
  r.settle();
  r.env.answer(r.env.open_step(0));  // sample 0's second step: done
  r.settle();
  EXPECT_EQ(r.ledger.completed_total(), 1u);
  r.d->start_draining();  // no group replaces the dropped one
  r.clock.advance(r.opt.env_timeout);
  r.settle();
  EXPECT_EQ(r.ledger.failed_by_reason().at("env_timeout"), 1u);
  EXPECT_EQ(r.ledger.disposed("group_incomplete"), 1u);
  EXPECT_TRUE(r.complete.empty());
  EXPECT_EQ(r.d->env_failed_total(), 1u);
  EXPECT_EQ(r.d->inflight_samples(), 0);
  r.env.answer(r.env.open_step(1));  // the late reply is ignored
  r.settle();
  EXPECT_EQ(r.ledger.failed_total(), 1u);
  EXPECT_EQ(r.ledger.in_flight(), 0u);
}

TEST(MultiTurn, AnEnvironmentErrorFailsTheSampleWithItsCodeAndTheRunGoesOn) {
  Rig r;
  r.opt.max_steps = 2;  // a second group follows the first
  r.opt.max_async_level = 2;
  r.env.on_step = [&](const FakeEnv::Call& c) -> Result<EnvReply> {
    if (c.trajectory.sample_index == 1 && c.task->id == "0") return make_error(ErrorCode::kParse, "garbage (test)");
    EnvReply e;
    e.done = true;
    e.reward = 0.5;
    return e;
  };
  r.start();
  r.run_out();
  EXPECT_EQ(r.ledger.failed_by_reason().at("env_parse"), 1u);
  EXPECT_EQ(r.ledger.disposed("group_incomplete"), 1u);
  ASSERT_FALSE(r.complete.empty());  // task 1's group, and the one that replaced task 0's
  for (const auto& g : r.complete) {
    EXPECT_NE(g->task->id, "0");
    EXPECT_EQ(*g->completions[1].env_reward, 0.5);
  }
}

TEST(MultiTurn, AFailedResetFailsTheWholeGroup) {
  Rig r;
  r.env.on_reset = [](const FakeEnv::Call& c) -> Result<EnvReply> {
    if (c.task->id == "0") return make_error(ErrorCode::kUnavailable, "environment down (test)");
    return EnvReply{};
  };
  r.start();
  EXPECT_EQ(r.ledger.failed_by_reason().at("env_unavailable"), 2u);
  EXPECT_EQ(r.d->env_failed_total(), 2u);
  ASSERT_EQ(r.inf.requests().size(), 1u);  // the next task's group: the run goes on
  EXPECT_EQ(r.inf.requests()[0].task->id, "1");
  EXPECT_EQ(r.ledger.in_flight(), 2u);
}

TEST(MultiTurn, CancellingWhileAStepIsPendingEndsTheSampleOnceAndIgnoresTheLateReply) {
  Rig r;
  r.to_first_steps();
  ASSERT_EQ(r.env.open().size(), 2u);
  r.env.answer(r.env.open()[0]);  // sample 0's next turn is out; sample 1 waits for its step
  r.settle();
  ASSERT_EQ(r.inf.open().size(), 1u);
  r.d->start_draining();
  r.d->cancel_all("shutdown");
  r.settle();
  EXPECT_EQ(r.ledger.cancelled_by_reason().at("shutdown"), 2u);
  EXPECT_EQ(r.ledger.in_flight(), 0u);
  const auto before = r.ledger.to_json();
  for (auto c : r.env.open()) r.env.answer(c);  // late replies: no second end
  r.inf.complete_all();
  r.clock.advance(std::chrono::minutes(30));  // and deadlines that fire after the cancel
  r.settle();
  EXPECT_EQ(r.ledger.to_json(), before);
  EXPECT_EQ(r.inf.requests().size(), 2u);  // nothing relaunched
}

TEST(MultiTurn, CancellingWhileTheResetIsPendingEndsTheGroup) {
  Rig r;
  r.env.auto_answer = false;
  r.start();
  r.d->start_draining();
  r.d->cancel_all("drain");
  r.settle();
  EXPECT_EQ(r.ledger.cancelled_by_reason().at("drain"), 2u);
  r.env.answer(0);
  r.settle();
  EXPECT_TRUE(r.inf.requests().empty());
  EXPECT_EQ(r.ledger.in_flight(), 0u);
}

// An abort-mode weight update in the middle of turn 2: the turn goes on from its tokens (its
// max_tokens counts only that turn's tokens, its text is appended), and the tokens after the update
// and turn 3 carry the new version.
TEST(MultiTurn, AnAbortedTurnContinuesAndVersionsFollowTheUpdate) {
  Rig r;
  r.env.done_after = 3;
  r.to_first_steps();
  for (auto c : r.env.open()) r.env.answer(c);
  r.settle();
  ASSERT_EQ(r.inf.open().size(), 2u);  // turn 2 of each sample
  r.inf.set_version(1);                // the workers took v1 ...
  r.d->on_version(1);
  r.inf.abort_all();  // ... and aborted their requests after one token each
  r.settle();
  ASSERT_EQ(r.inf.requests().size(), 5u);
  for (std::size_t i = 3; i < 5; ++i) {
    const auto& req = r.inf.requests()[i];
    EXPECT_EQ(req.prompt_tokens.size(), 2u + 3 + 2 + 1);
    EXPECT_EQ(req.sampling.max_tokens, r.opt.sampling.max_tokens - 1);
  }
  EXPECT_EQ(r.ledger.dispatched_total(), 2u);
  r.run_out();
  ASSERT_EQ(r.complete.size(), 1u);
  for (int j = 0; j < 2; ++j) {
    const auto& s = r.sample(j);
    // turn 1 (3) + env (2) at v0; turn 2: the aborted token at v0, then 3 at v1; env (2); turn 3 (3) at v1
    EXPECT_EQ(s.completion_tokens.size(), 3u + 2 + 4 + 2 + 3);
    EXPECT_EQ(s.token_versions(), (std::vector<std::int32_t>{0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1}));
    EXPECT_EQ(s.turn_versions, (std::vector<Version>{0, 0, 1}));
    EXPECT_EQ(s.loss_mask, (std::vector<std::uint8_t>{1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1, 1}));
    ASSERT_EQ(s.turns.size(), 6u);
    EXPECT_EQ(s.turns[2].content, "p8s0");  // the aborted part had no text; the continuation's appended
    EXPECT_EQ(s.text, "p13s0");
    EXPECT_EQ(s.oldest_version(kNoVersion), 0);  // staleness counts from the first turn
  }
}

TEST(MultiTurn, ATaskTheEnvironmentCallsSingleTurnTakesTheSingleTurnPath) {
  Rig r;
  r.env.multi = false;
  r.start();
  r.inf.complete_all();
  r.settle();
  ASSERT_EQ(r.complete.size(), 1u);
  EXPECT_TRUE(r.env.calls.empty());
  EXPECT_EQ(r.inf.requests().size(), 1u);
  EXPECT_EQ(r.inf.requests()[0].prompt_tokens, (Tokens{0, 5}));
  EXPECT_EQ(r.inf.requests()[0].sampling.max_tokens, 16);
  const auto& s = r.sample(0);
  EXPECT_TRUE(s.loss_mask.empty());
  EXPECT_TRUE(s.turns.empty());
  EXPECT_TRUE(s.turn_versions.empty());
  EXPECT_EQ(r.d->trajectories_total(), 0u);
}

// The whole loop with Ports::environment: trajectories reach the trainer with their masks, and the
// ledger adds up.
// The whole loop over a rig's fakes (its batch_size and max_steps as set), with a fake scorer and a
// trainer that acknowledges every batch, run until it finishes; `last` holds the last step's figures.
struct LoopRun {
  struct LastStep : RunObserver {
    StepObservation seen;
    void on_step(const StepObservation& o) override { seen = o; }
  };
  testing::FakeScorer scorer;
  testing::FakeTrainer trainer;
  LastStep last;
  std::unique_ptr<Orchestrator> orch;

  explicit LoopRun(Rig& r) : trainer{r.io.get_executor()} {
    r.opt.eval_at_start = r.opt.eval_at_end = r.opt.console = false;
    r.opt.log_interval_s = 1000;
    r.inf.auto_complete = true;
    trainer.auto_publish = true;
    orch = std::make_unique<Orchestrator>(r.io, Ports{&r.inf, &r.tasks, &scorer, &trainer, &r.clock, &r.env, {}}, r.opt,
                                          &last);
    EXPECT_TRUE(orch->start());
    while (!orch->finished()) {
      r.settle();
      if (!orch->finished() && !r.clock.fire_next()) break;
    }
    EXPECT_TRUE(orch->finished());
    EXPECT_TRUE(orch->summary().ok) << orch->summary().error;
  }
};

TEST(MultiTurn, ARunTrainsTrajectories) {
  Rig r;
  r.opt.batch_size = 4;  // two groups a step, three steps
  r.opt.max_steps = 3;
  LoopRun run(r);
  const auto& trainer = run.trainer;
  const auto& last = run.last;
  const auto& orch = *run.orch;
  ASSERT_EQ(trainer.batches.size(), 3u);
  for (const auto& b : trainer.batches) {
    for (const auto& s : b.samples) {
      EXPECT_EQ(s.completion_tokens.size(), 8u);
      EXPECT_EQ(s.loss_mask, (std::vector<std::uint8_t>{1, 1, 1, 0, 0, 1, 1, 1}));
      EXPECT_EQ(s.turns.size(), 4u);
      EXPECT_EQ(s.text, "p7s0");
    }
  }
  const auto& l = orch.ledger();
  EXPECT_TRUE(l.check());
  EXPECT_EQ(l.disposed("trained"), 12u);
  // The step records count the trajectories' turns: two a trajectory here.
  EXPECT_EQ(last.seen.report.step, 3);
  EXPECT_GE(last.seen.trajectories, 12u);
  EXPECT_EQ(last.seen.model_turns, 2 * last.seen.trajectories);
  EXPECT_EQ(last.seen.env_failed, 0u);
}

// A step whose rendering did not extend the trajectory (EnvReply::restart_prompt): 8 ids after the
// first model turn; the second turn ends the trajectory.
Result<EnvReply> split_after_first_turn(const FakeEnv::Call& c) {
  EnvReply r;
  if (FakeEnv::model_turns(c.trajectory) >= 2) {
    r.messages = {{"user", "right"}};
    r.done = true;
    r.reward = 1.0;
    return r;
  }
  r.messages = {{"user", "again"}};
  r.restart_prompt = {70, 71, 72, 73, 74, 75, 76, 77};
  return r;
}

TEST(MultiTurn, ASplitTrajectoryGoesOnFromTheRestartPromptAndKeepsItsEarlierPiece) {
  Rig r;
  r.env.on_step = split_after_first_turn;
  r.start();
  r.run_out();
  ASSERT_EQ(r.complete.size(), 1u);
  const Tokens group_prompt = {1, 2};  // the fake server's tokenization of the reset's messages
  const Tokens restart = {70, 71, 72, 73, 74, 75, 76, 77};
  ASSERT_EQ(r.inf.requests().size(), 3u);
  for (std::size_t i = 1; i < 3; ++i) EXPECT_EQ(r.inf.requests()[i].prompt_tokens, restart);  // the new piece's
  for (int j = 0; j < 2; ++j) {
    const auto& s = r.sample(j);
    ASSERT_EQ(s.split_segments.size(), 1u);
    const auto& first = s.split_segments[0];
    EXPECT_EQ(first.prompt_tokens, group_prompt);
    EXPECT_EQ(first.completion_tokens, (Tokens{j % 2, 10 + j, 20 + j}));
    EXPECT_EQ(first.loss_mask, (std::vector<std::uint8_t>{1, 1, 1}));
    EXPECT_EQ(first.logprobs, (std::vector<float>{-0.5f, -0.5f, -0.5f}));
    // The last piece: its own prompt, the second turn's answer only (the fake's text names the
    // prompt's length: the restart prompt, nothing after it).
    EXPECT_EQ(s.prompt_tokens, restart);
    EXPECT_EQ(s.completion_tokens, (Tokens{0, 10, 20}));
    EXPECT_EQ(s.loss_mask, (std::vector<std::uint8_t>{1, 1, 1}));
    EXPECT_EQ(s.text, "p8s0");
    EXPECT_EQ(
        s.turns,
        (std::vector<ChatMessage>{
            {"assistant", fmt::format("p0s{}", j)}, {"user", "again"}, {"assistant", "p8s0"}, {"user", "right"}}));
    EXPECT_EQ(s.turn_versions, (std::vector<Version>{0, 0}));
    EXPECT_EQ(s.finish_reason, FinishReason::kStop);
    ASSERT_TRUE(s.env_reward);
    EXPECT_EQ(s.token_versions(), std::vector<std::int32_t>(3, 0));
  }
  // The second step saw the new piece: its prompt and its completion so far.
  int second_steps = 0;
  for (const auto& c : r.env.calls) {
    if (c.reset || FakeEnv::model_turns(c.trajectory) < 2) continue;
    ++second_steps;
    EXPECT_EQ(c.prompt, restart);
    EXPECT_EQ(c.trajectory.completion_tokens, (Tokens{0, 10, 20}));
  }
  EXPECT_EQ(second_steps, 2);
  EXPECT_EQ(r.ledger.completed_total(), 2u);  // two trajectories, however many pieces
  EXPECT_EQ(r.d->trajectories_total(), 2u);
}

TEST(MultiTurn, TheTokenBudgetCountsTheRestartPromptBeyondTheGroupsPrompt) {
  Rig r;
  r.opt.max_trajectory_tokens = 8;  // the restart prompt holds 6 ids beyond the group's 2
  r.env.on_step = split_after_first_turn;
  r.start();
  r.run_out();
  ASSERT_EQ(r.complete.size(), 1u);
  ASSERT_EQ(r.inf.requests().size(), 3u);
  EXPECT_EQ(r.inf.requests()[1].sampling.max_tokens, 2);  // 8 - 6
  for (int j = 0; j < 2; ++j) {
    const auto& s = r.sample(j);  // the fake answers 3 tokens whatever max_tokens says: cut to 2
    ASSERT_EQ(s.split_segments.size(), 1u);
    EXPECT_EQ(s.completion_tokens, (Tokens{0, 10}));
    EXPECT_EQ(s.finish_reason, FinishReason::kLength);
  }
}

TEST(MultiTurn, ARestartPromptThatFillsTheBudgetEndsTheTrajectoryAsLength) {
  Rig r;
  r.opt.max_trajectory_tokens = 6;
  r.env.on_step = split_after_first_turn;
  r.start();
  r.run_out();
  ASSERT_EQ(r.complete.size(), 1u);
  EXPECT_EQ(r.inf.requests().size(), 1u);  // no second turn
  for (int j = 0; j < 2; ++j) {            // it ends as it was, unsplit
    EXPECT_EQ(r.sample(j).finish_reason, FinishReason::kLength);
    EXPECT_TRUE(r.sample(j).split_segments.empty());
    EXPECT_EQ(r.sample(j).completion_tokens.size(), 3u);
  }
}

TEST(MultiTurn, ARunTrainsEachPieceOfASplitTrajectoryAsARowSharingItsScores) {
  Rig r;
  r.opt.batch_size = 2;
  r.opt.max_steps = 1;
  r.env.on_step = [](const FakeEnv::Call& c) {
    auto reply = split_after_first_turn(c);
    if (reply->done) reply->ended_because = "solved";
    return reply;
  };
  LoopRun run(r);
  const auto& trainer = run.trainer;
  const auto& last = run.last;
  const auto& orch = *run.orch;
  ASSERT_EQ(trainer.batches.size(), 1u);
  const auto& rows = trainer.batches[0].samples;
  ASSERT_EQ(rows.size(), 4u);  // two trajectories, two pieces each, the earlier piece first
  for (std::size_t t = 0; t < 2; ++t) {
    const auto& early = rows[2 * t];
    const auto& last_piece = rows[2 * t + 1];
    EXPECT_EQ(early.prompt_tokens, (Tokens{1, 2}));
    EXPECT_EQ(early.completion_tokens.size(), 3u);
    EXPECT_EQ(early.loss_mask, (std::vector<std::uint8_t>{1, 1, 1}));
    EXPECT_EQ(last_piece.prompt_tokens, (Tokens{70, 71, 72, 73, 74, 75, 76, 77}));
    EXPECT_TRUE(last_piece.split_segments.empty());
    EXPECT_EQ(early.task_id, last_piece.task_id);
    EXPECT_EQ(early.sample_index, last_piece.sample_index);
    ASSERT_TRUE(early.reward && last_piece.reward);
    EXPECT_EQ(*early.reward, *last_piece.reward);
    EXPECT_EQ(early.advantage, last_piece.advantage);
    EXPECT_EQ(early.fate, last_piece.fate);
  }
  EXPECT_EQ(orch.ledger().disposed("trained"), 2u);  // the ledger counts trajectories, not rows
  EXPECT_EQ(last.seen.report.samples, 2);
  // Every trajectory (equal-reward groups were filtered and others drawn) ended for the one reason.
  ASSERT_EQ(last.seen.ended_because.size(), 1u);
  EXPECT_EQ(last.seen.ended_because.at("solved"), last.seen.trajectories);
  EXPECT_GE(last.seen.trajectories, 2u);
}

TEST(MultiTurn, OptionsRejectNoTurnsAndNoTokenBudget) {
  Options o;
  o.max_turns = 0;
  auto st = o.validate();
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().message(), "env.max_turns: must be >= 1, got 0");
  o.max_turns = 1;
  o.max_trajectory_tokens = 0;
  st = o.validate();
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().message(), "env.max_trajectory_tokens: must be >= 1, got 0");
}

}  // namespace
}  // namespace arlo::orch
