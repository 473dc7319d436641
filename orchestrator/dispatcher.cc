#include "orchestrator/dispatcher.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <sstream>

#include "common/log.h"

namespace arlo::orch {

namespace {
// Grace beyond a request's own deadline before the orchestrator cuts it off from outside: the
// port should time out first and report a precise error.
constexpr Duration kDeadlineGrace = std::chrono::seconds(2);
constexpr int kMaxLaunchesPerTurn = 32;

std::string reason_of(const Error& e) { return std::string(to_string(e.code())); }

// Appends `add` (generated with prefix length `offset`) to `into`. When the server reported no
// versions, the tokens are attributed to `launch_version`, the version the workers were at when
// the request left: the oldest they can have come from, which is the safe side for staleness.
void merge(Sample& into, Sample&& add, Version launch_version) {
  const auto offset = static_cast<std::int64_t>(into.completion_tokens.size());
  if (add.version_spans.empty()) add.version_spans.push_back({launch_version, 0});
  for (auto& s : add.version_spans) {
    s.first_token += offset;
    if (!into.version_spans.empty() && into.version_spans.back().version == s.version) continue;
    into.version_spans.push_back(s);
  }
  if (into.completion_tokens.empty() && into.logprobs.empty() && into.text.empty()) {
    // The first answer for this sample: its tokens, logprobs and text move in whole.
    into.completion_tokens = std::move(add.completion_tokens);
    into.logprobs = std::move(add.logprobs);
    into.text = std::move(add.text);
    // A trajectory the inference port recorded whole (an agent program's, through the policy
    // gateway): its loss mask, turns, turn versions and reward come with it.
    if (!add.loss_mask.empty()) into.loss_mask = std::move(add.loss_mask);
    if (into.turns.empty()) into.turns = std::move(add.turns);
    if (into.turn_versions.empty()) into.turn_versions = std::move(add.turn_versions);
    if (add.env_reward) into.env_reward = add.env_reward;
  } else {
    into.completion_tokens.insert(into.completion_tokens.end(), add.completion_tokens.begin(),
                                  add.completion_tokens.end());
    into.logprobs.insert(into.logprobs.end(), add.logprobs.begin(), add.logprobs.end());
    into.text += add.text;
  }
  into.finish_reason = add.finish_reason;
  if (into.worker.empty()) into.worker = std::move(add.worker);
}

// An environment's step over a copy of the trajectory that lives as long as the call: the call may
// go on after the dispatcher stopped waiting for it (deadline, cancellation).
Awaitable<Result<EnvReply>> step_holding(EnvironmentPort& env, std::shared_ptr<const Task> task,
                                         std::shared_ptr<const Sample> trajectory, std::vector<std::int32_t> prompt,
                                         TimePoint deadline) {
  auto op = env.step(std::move(task), *trajectory, std::move(prompt), deadline);
  co_return co_await std::move(op);
}

// Cuts a sample's tokens (and what runs beside them) to `size`.
void truncate(Sample& c, std::size_t size) {
  c.completion_tokens.resize(size);
  if (c.logprobs.size() > size) c.logprobs.resize(size);
  if (c.loss_mask.size() > size) c.loss_mask.resize(size);
  while (c.version_spans.size() > 1 && c.version_spans.back().first_token >= static_cast<std::int64_t>(size))
    c.version_spans.pop_back();
}
}  // namespace

RolloutDispatcher::RolloutDispatcher(asio::any_io_executor ex, Clock& clock, InferencePort& inference,
                                     TaskSource& tasks, Ledger& ledger, const Options& options, DispatcherHooks hooks,
                                     EnvironmentPort* environment)
    : ex_(ex),
      clock_(clock),
      inference_(inference),
      tasks_(tasks),
      ledger_(ledger),
      opt_(options),
      hooks_(std::move(hooks)),
      environment_(environment),
      idle_(ex),
      rng_(options.seed),
      version_(options.initial_version) {}

std::int64_t RolloutDispatcher::next_target_step() const {
  const std::int64_t base = std::max<std::int64_t>(steps_cut_, opt_.sft_warmup_steps);
  const std::int64_t ahead = inflight_train_groups_ + (hooks_.backlog_groups ? hooks_.backlog_groups() : 0);
  return base + 1 + ahead / opt_.groups_per_step();
}

bool RolloutDispatcher::blocked_by_version() const {
  if (draining_ || held_) return false;
  const auto s = next_target_step();
  if (s > opt_.max_steps) return false;
  if (version_ == kNoVersion || version_ < opt_.sft_warmup_steps) return true;
  return (s - 1) - version_ > opt_.max_async_level;
}

bool RolloutDispatcher::train_allowed() const {
  if (held_ || draining_ || failed_source_) return false;
  if (inflight_samples_ + opt_.group_size > opt_.max_inflight) return false;
  const std::int64_t backlog = hooks_.backlog_groups ? hooks_.backlog_groups() : 0;
  if (inflight_train_groups_ + backlog >= opt_.queue_capacity_groups()) return false;
  const auto s = next_target_step();
  if (s > opt_.max_steps) return false;
  // RL starts from the warmed-up policy: no train rollouts before the workers hold it.
  if (version_ == kNoVersion || version_ < opt_.sft_warmup_steps) return false;
  return (s - 1) - version_ <= opt_.max_async_level;
}

void RolloutDispatcher::pump() {
  if (pumping_) return;  // re-entered from a hook: the outer loop continues
  pumping_ = true;
  int launched = 0;
  while (true) {
    // Bound the work of one turn so a refill of thousands of requests does not stall the loop:
    // the rest is dispatched from a posted continuation, after whatever else is ready.
    if (launched++ >= kMaxLaunchesPerTurn) {
      if (!pump_posted_) {
        pump_posted_ = true;
        asio::post(ex_, [this] {
          pump_posted_ = false;
          pump();
        });
      }
      break;
    }
    if (!held_ && !continuations_.empty()) {
      auto c = continuations_.front();
      continuations_.pop_front();
      launch_continuation(c);
      continue;
    }
    if (!held_ && !eval_queue_.empty() && inflight_samples_ + eval_queue_.front().samples <= opt_.max_inflight) {
      auto item = std::move(eval_queue_.front());
      eval_queue_.pop_front();
      auto& rec = create_group(RolloutKind::kEval, item.task, item.samples);
      rec.group->eval_id = item.eval_id;
      start_group(rec, opt_.eval_sampling.max_tokens);
      continue;
    }
    if (train_allowed()) {
      auto task = next_train_task();
      if (!task) {
        failed_source_ = true;
        ARLO_ERROR("dispatcher: task source failed: {}", task.error().what());
        if (hooks_.on_fatal) hooks_.on_fatal(task.error());
        break;
      }
      const auto target = next_target_step();
      auto& rec = create_group(RolloutKind::kTrain, std::move(*task), opt_.group_size);
      rec.group->target_step = target;
      ++inflight_train_groups_;
      start_group(rec, sampling_of(*rec.group).max_tokens);
      continue;
    }
    break;
  }
  pumping_ = false;
  update_wait_for_policy();
}

void RolloutDispatcher::update_wait_for_policy() {
  const bool blocked = blocked_by_version();
  if (blocked && !version_blocked_) {
    version_blocked_ = true;
    version_blocked_since_ = clock_.now();
  } else if (!blocked && version_blocked_) {
    version_blocked_ = false;
    version_blocked_total_ += clock_.now() - version_blocked_since_;
  }
}

double RolloutDispatcher::wait_for_policy_seconds() const {
  auto total = version_blocked_total_;
  if (version_blocked_) total += clock_.now() - version_blocked_since_;
  return std::chrono::duration<double>(total).count();
}

Result<std::shared_ptr<const Task>> RolloutDispatcher::next_train_task() {
  if (!requeued_.empty()) {
    auto t = std::make_shared<const Task>(std::move(requeued_.front()));
    requeued_.pop_front();
    return t;
  }
  ARLO_ASSIGN_OR_RETURN(auto task, tasks_.next());
  return std::make_shared<const Task>(std::move(task));
}

RolloutDispatcher::Record& RolloutDispatcher::create_group(RolloutKind kind, std::shared_ptr<const Task> task,
                                                           int samples) {
  auto g = std::make_shared<Group>();
  g->id = next_group_id_++;
  g->kind = kind;
  g->task = std::move(task);
  g->dispatch_version = version_;
  g->dispatched_at = clock_.now();
  g->prompt_tokens = g->task->prompt_tokens;
  g->completions.resize(samples);
  for (int i = 0; i < samples; ++i) {
    g->completions[i].task_id = g->task->id;
    g->completions[i].sample_index = i;
  }
  auto [it, inserted] = groups_.emplace(g->id, Record{});
  auto& rec = it->second;
  rec.source_task = g->task;
  rec.group = std::move(g);
  rec.states.assign(samples, SampleState::kInFlight);
  rec.open = samples;
  ledger_.dispatched(samples);
  inflight_samples_ += samples;
  return rec;
}

void RolloutDispatcher::launch(Record& rec, std::vector<int> samples, std::vector<std::int32_t> prompt,
                               std::int64_t max_tokens) {
  const auto& g = *rec.group;
  GenerateRequest req;
  req.request_id = next_request_id_++;
  req.group_id = g.id;
  req.task = g.task;
  req.prompt_tokens = std::move(prompt);
  req.n = static_cast<int>(samples.size());
  req.sampling = sampling_of(g);
  req.sampling.max_tokens = max_tokens;
  req.seed = rng_();
  req.deadline = clock_.now() + opt_.request_timeout;
  auto cancel = std::make_shared<asio::cancellation_signal>();
  rec.requests.emplace(req.request_id, cancel);
  ++outstanding_requests_;
  const auto id = req.request_id;
  spawn(ex_, run_request(g.id, id, std::move(samples), version_, std::move(req), std::move(cancel)));
}

Awaitable<void> RolloutDispatcher::run_request(std::uint64_t group_id, std::uint64_t request_id,
                                               std::vector<int> samples, Version launch_version,
                                               GenerateRequest request,
                                               std::shared_ptr<asio::cancellation_signal> cancel) {
  const auto deadline = request.deadline + kDeadlineGrace;
  auto op = inference_.generate(std::move(request));
  auto result =
      co_await with_deadline<GenerateResult>(ex_, clock_, deadline, std::move(op), "generate", std::move(cancel));
  on_result(group_id, request_id, samples, launch_version, std::move(result));
}

void RolloutDispatcher::on_result(std::uint64_t group_id, std::uint64_t request_id, const std::vector<int>& samples,
                                  Version launch_version, Result<GenerateResult> result) {
  --outstanding_requests_;
  auto it = groups_.find(group_id);
  if (it != groups_.end()) {
    auto& rec = it->second;
    rec.requests.erase(request_id);
    if (result && result->completions.size() != samples.size()) {
      result =
          make_error(ErrorCode::kMismatch, fmt::format("worker {} returned {} completions for n={}", result->worker,
                                                       result->completions.size(), samples.size()));
    }
    if (!result) {
      ARLO_WARN_EVERY(5.0, "dispatcher: group {} request failed: {}", group_id, result.error().what());
      for (int s : samples) end_sample(rec, s, SampleState::kFailed, reason_of(result.error()));
      if (result.error().code() == ErrorCode::kInvalidArgument) count_rejected(samples.size(), result.error());
    } else {
      auto& g = *rec.group;
      if (g.prompt_tokens.empty()) g.prompt_tokens = result->prompt_tokens;
      if (g.worker.empty()) g.worker = result->worker;
      for (std::size_t j = 0; j < samples.size(); ++j) {
        const int s = samples[j];
        auto& c = result->completions[j];
        completion_tokens_ += c.completion_tokens.size();
        merge(g.completions[s], std::move(c), launch_version);
        if (g.completions[s].finish_reason == FinishReason::kAbort) {
          if (g.prompt_tokens.empty()) {
            // Without the prompt's token ids we cannot continue the sample exactly.
            end_sample(rec, s, SampleState::kFailed, "abort_without_prompt_tokens");
          } else {
            rec.states[s] = SampleState::kAwaitingContinuation;
            continuations_.push_back({group_id, s});
          }
        } else if (rec.multi_turn) {
          end_model_turn(rec, s);
        } else {
          end_sample(rec, s, SampleState::kCompleted);
        }
      }
    }
    maybe_finish(group_id);
  }
  if (outstanding_requests_ == 0) idle_.notify();
  pump();
}

void RolloutDispatcher::launch_continuation(const Continuation& c) {
  auto it = groups_.find(c.group_id);
  if (it == groups_.end()) return;  // group cancelled meanwhile
  auto& rec = it->second;
  if (c.sample == kWholeGroup) {
    launch_group_turn(rec);
    return;
  }
  if (rec.states[c.sample] != SampleState::kAwaitingContinuation) return;
  rec.states[c.sample] = SampleState::kInFlight;
  auto& g = *rec.group;
  auto& done = g.completions[c.sample];
  if (c.new_turn) rec.turns[c.sample].turn_start = done.completion_tokens.size();
  const auto left = turn_budget(rec, c.sample);
  if (left <= 0) {
    done.finish_reason = FinishReason::kLength;
    end_sample(rec, c.sample, SampleState::kCompleted);
    maybe_finish(c.group_id);
    return;
  }
  if (c.new_turn) {  // Sample::text becomes this turn's text
    done.turn_versions.push_back(version_);
    done.text.clear();
  }
  std::vector<std::int32_t> prompt = rec.multi_turn ? prompt_of(rec, c.sample) : g.prompt_tokens;
  prompt.insert(prompt.end(), done.completion_tokens.begin(), done.completion_tokens.end());
  launch(rec, {c.sample}, std::move(prompt), left);
}

const SamplingParams& RolloutDispatcher::sampling_of(const Group& g) const {
  if (g.kind == RolloutKind::kEval) return opt_.eval_sampling;
  const auto it = opt_.source_sampling.find(g.task->env);
  return it == opt_.source_sampling.end() ? opt_.sampling : it->second;
}

std::int64_t RolloutDispatcher::turn_budget(const Record& rec, int sample) const {
  const auto& g = *rec.group;
  const auto& sampling = sampling_of(g);
  const auto size = static_cast<std::int64_t>(g.completions[sample].completion_tokens.size());
  if (!rec.multi_turn) return sampling.max_tokens - size;
  const auto turn = size - static_cast<std::int64_t>(rec.turns[sample].turn_start);
  const auto extra = static_cast<std::int64_t>(rec.turns[sample].extra);
  return std::min(sampling.max_tokens - turn, opt_.max_trajectory_tokens - extra - size);
}

void RolloutDispatcher::start_group(Record& rec, std::int64_t max_tokens) {
  const auto& g = *rec.group;
  if (environment_ == nullptr || !environment_->multi_turn(*g.task)) {
    std::vector<int> all(g.completions.size());
    std::iota(all.begin(), all.end(), 0);
    launch(rec, std::move(all), g.task->prompt_tokens, max_tokens);
    return;
  }
  rec.multi_turn = true;
  rec.turns.assign(g.completions.size(), TurnState{});
  std::fill(rec.states.begin(), rec.states.end(), SampleState::kAwaitingEnv);
  const auto id = next_request_id_++;
  auto cancel = std::make_shared<asio::cancellation_signal>();
  rec.requests.emplace(id, cancel);
  spawn(ex_, run_reset(g.id, id, g.task, std::move(cancel)));
}

Awaitable<void> RolloutDispatcher::run_reset(std::uint64_t group_id, std::uint64_t call_id,
                                             std::shared_ptr<const Task> task,
                                             std::shared_ptr<asio::cancellation_signal> cancel) {
  const auto deadline = clock_.now() + opt_.env_timeout;
  auto op = environment_->reset(std::move(task), deadline);
  auto reply =
      co_await with_deadline<EnvReply>(ex_, clock_, deadline, std::move(op), "environment reset", std::move(cancel));
  on_reset(group_id, call_id, std::move(reply));
}

void RolloutDispatcher::on_reset(std::uint64_t group_id, std::uint64_t call_id, Result<EnvReply> reply) {
  auto it = groups_.find(group_id);
  if (it == groups_.end() || it->second.requests.erase(call_id) == 0) return;  // cancelled meanwhile
  auto& rec = it->second;
  auto& g = *rec.group;
  if (!reply) {
    ARLO_WARN_EVERY(5.0, "dispatcher: group {}: environment reset failed: {}", group_id, reply.error().what());
    for (int s = 0; s < static_cast<int>(rec.states.size()); ++s) {
      if (rec.states[s] != SampleState::kAwaitingEnv) continue;
      ++env_failed_;
      end_sample(rec, s, SampleState::kFailed, "env_" + reason_of(reply.error()));
    }
    maybe_finish(group_id);
    pump();
    return;
  }
  if (!reply->messages.empty()) {  // the environment's first messages are the group's prompt
    auto task = std::make_shared<Task>(*g.task);
    task->prompt.reset();
    task->messages = std::move(reply->messages);
    if (!reply->tools.is_null()) task->tools = std::move(reply->tools);
    task->prompt_tokens.clear();
    g.task = std::move(task);
    g.prompt_tokens.clear();
  }
  for (int s = 0; s < static_cast<int>(rec.states.size()); ++s) {
    g.completions[s].env_state = reply->state;
    if (rec.states[s] == SampleState::kAwaitingEnv) rec.states[s] = SampleState::kAwaitingContinuation;
  }
  continuations_.push_back({group_id, kWholeGroup, true});
  pump();
}

void RolloutDispatcher::launch_group_turn(Record& rec) {
  auto& g = *rec.group;
  std::vector<int> samples;
  for (int s = 0; s < static_cast<int>(rec.states.size()); ++s) {
    if (rec.states[s] != SampleState::kAwaitingContinuation) continue;
    rec.states[s] = SampleState::kInFlight;
    g.completions[s].turn_versions.push_back(version_);
    samples.push_back(s);
  }
  if (samples.empty()) return;
  const auto& sampling = sampling_of(g);
  launch(rec, std::move(samples), g.prompt_tokens, std::min(sampling.max_tokens, opt_.max_trajectory_tokens));
}

void RolloutDispatcher::end_model_turn(Record& rec, int sample) {
  auto& g = *rec.group;
  auto& c = g.completions[sample];
  ++rec.turns[sample].model_turns;
  ++model_turns_;
  c.loss_mask.resize(c.completion_tokens.size(), 1);  // the model's tokens train
  c.logprobs.resize(c.completion_tokens.size(), 0.0f);
  c.turns.push_back({"assistant", c.text});
  if (g.prompt_tokens.empty()) {
    // Without the prompt's token ids the next turn cannot extend the trajectory's ids exactly.
    end_sample(rec, sample, SampleState::kFailed, "multi_turn_without_prompt_tokens");
    return;
  }
  const auto budget = static_cast<std::size_t>(opt_.max_trajectory_tokens) - rec.turns[sample].extra;
  if (c.completion_tokens.size() > budget) {  // a server that overran max_tokens
    truncate(c, budget);
    complete_trajectory(rec, sample, FinishReason::kLength);
    return;
  }
  rec.states[sample] = SampleState::kAwaitingEnv;
  const auto id = next_request_id_++;
  auto cancel = std::make_shared<asio::cancellation_signal>();
  rec.requests.emplace(id, cancel);
  spawn(ex_, run_step(g.id, id, sample, g.task, std::make_shared<const Sample>(c), prompt_of(rec, sample),
                      std::move(cancel)));
}

Awaitable<void> RolloutDispatcher::run_step(std::uint64_t group_id, std::uint64_t call_id, int sample,
                                            std::shared_ptr<const Task> task, std::shared_ptr<const Sample> trajectory,
                                            std::vector<std::int32_t> prompt,
                                            std::shared_ptr<asio::cancellation_signal> cancel) {
  const auto deadline = clock_.now() + opt_.env_timeout;
  auto op = step_holding(*environment_, std::move(task), std::move(trajectory), std::move(prompt), deadline);
  auto reply =
      co_await with_deadline<EnvReply>(ex_, clock_, deadline, std::move(op), "environment step", std::move(cancel));
  on_step(group_id, call_id, sample, std::move(reply));
}

void RolloutDispatcher::on_step(std::uint64_t group_id, std::uint64_t call_id, int sample, Result<EnvReply> reply) {
  auto it = groups_.find(group_id);
  if (it == groups_.end()) return;  // the group ended meanwhile (cancelled): a late reply is ignored
  auto& rec = it->second;
  if (rec.requests.erase(call_id) == 0 || rec.states[sample] != SampleState::kAwaitingEnv) return;
  if (!reply) {
    ARLO_WARN_EVERY(5.0, "dispatcher: group {} sample {}: environment step failed: {}", group_id, sample,
                    reply.error().what());
    ++env_failed_;
    end_sample(rec, sample, SampleState::kFailed, "env_" + reason_of(reply.error()));
  } else {
    apply_step(rec, sample, std::move(*reply));
  }
  maybe_finish(group_id);
  pump();
}

void RolloutDispatcher::apply_step(Record& rec, int sample, EnvReply&& reply) {
  auto& c = rec.group->completions[sample];
  for (auto& m : reply.messages) c.turns.push_back(std::move(m));
  if (!reply.state.is_null()) c.env_state = std::move(reply.state);
  if (reply.reward) c.env_reward = reply.reward;
  if (!reply.ended_because.empty()) ++ended_because_[reply.ended_because];
  if (reply.done) {
    complete_trajectory(rec, sample, c.finish_reason);
    return;
  }
  if (!reply.restart_prompt.empty() && !split(rec, sample, std::move(reply.restart_prompt))) {
    complete_trajectory(rec, sample, FinishReason::kLength);
    return;
  }
  // The environment's tokens: out of the loss, logprob 0, in the span of the model's last token.
  const auto room =
      static_cast<std::size_t>(opt_.max_trajectory_tokens) - rec.turns[sample].extra - c.completion_tokens.size();
  const auto n = std::min(room, reply.tokens.size());
  c.completion_tokens.insert(c.completion_tokens.end(), reply.tokens.begin(),
                             reply.tokens.begin() + static_cast<std::ptrdiff_t>(n));
  c.logprobs.resize(c.completion_tokens.size(), 0.0f);
  c.loss_mask.resize(c.completion_tokens.size(), 0);
  if (n < reply.tokens.size() || rec.turns[sample].model_turns >= opt_.max_turns) {
    complete_trajectory(rec, sample, FinishReason::kLength);
    return;
  }
  rec.states[sample] = SampleState::kAwaitingContinuation;
  continuations_.push_back({rec.group->id, sample, true});
}

bool RolloutDispatcher::split(Record& rec, int sample, std::vector<std::int32_t> restart_prompt) {
  auto& c = rec.group->completions[sample];
  auto& turn = rec.turns[sample];
  const auto base = rec.group->prompt_tokens.size();
  const auto extra = restart_prompt.size() > base ? restart_prompt.size() - base : 0;
  if (extra >= static_cast<std::size_t>(opt_.max_trajectory_tokens)) return false;  // it ends before the split
  const Version oldest = c.oldest_version(kNoVersion);  // an earlier split's too (see below)
  TrajectorySegment piece;
  piece.prompt_tokens = turn.prompt.empty() ? rec.group->prompt_tokens : std::move(turn.prompt);
  piece.completion_tokens = std::move(c.completion_tokens);
  piece.logprobs = std::move(c.logprobs);
  piece.loss_mask = std::move(c.loss_mask);
  piece.version_spans = std::move(c.version_spans);
  c.split_segments.push_back(std::move(piece));
  c.completion_tokens.clear();
  c.logprobs.clear();
  c.loss_mask.clear();
  c.version_spans.clear();
  // Staleness counts from the trajectory's first turn: the new piece keeps its oldest version as a
  // span that covers no token (Sample::oldest_version reads it; token_versions gives it no token).
  if (oldest != kNoVersion) c.version_spans.push_back({oldest, 0});
  turn.extra = extra;
  turn.prompt = std::move(restart_prompt);
  c.prompt_tokens = turn.prompt;  // the train sink keeps a split sample's own prompt
  turn.turn_start = 0;
  return true;
}

const std::vector<std::int32_t>& RolloutDispatcher::prompt_of(const Record& rec, int sample) const {
  const auto& own = rec.turns[sample].prompt;
  return own.empty() ? rec.group->prompt_tokens : own;
}

void RolloutDispatcher::complete_trajectory(Record& rec, int sample, FinishReason reason) {
  rec.group->completions[sample].finish_reason = reason;
  end_sample(rec, sample, SampleState::kCompleted);
}

void RolloutDispatcher::end_sample(Record& rec, int sample, SampleState state, const std::string& reason) {
  auto& cur = rec.states[sample];
  if (cur != SampleState::kInFlight && cur != SampleState::kAwaitingContinuation && cur != SampleState::kAwaitingEnv) {
    ARLO_ERROR("dispatcher: sample {} of group {} ended twice", sample, rec.group->id);
    std::abort();
  }
  cur = state;
  --rec.open;
  --inflight_samples_;
  if (rec.multi_turn) ++trajectories_;
  switch (state) {
    case SampleState::kCompleted:
      ledger_.completed();
      rejected_in_a_row_ = 0;
      break;
    case SampleState::kFailed: ledger_.failed(reason); break;
    case SampleState::kCancelled: ledger_.cancelled(reason); break;
    default: break;
  }
}

void RolloutDispatcher::count_rejected(std::size_t samples, const Error& e) {
  const int before = rejected_in_a_row_;
  rejected_in_a_row_ += static_cast<int>(samples);
  const int limit = opt_.max_rejected_in_a_row;
  if (limit <= 0 || before >= limit || rejected_in_a_row_ < limit || !hooks_.on_fatal) return;
  hooks_.on_fatal(Error(ErrorCode::kInvalidArgument,
                        fmt::format("{} rollouts in a row were rejected by the inference servers and none completed, "
                                    "so the run cannot make progress (check the prompts against the model's context "
                                    "and the sampling parameters); the last: {}",
                                    rejected_in_a_row_, e.what())));
}

void RolloutDispatcher::maybe_finish(std::uint64_t group_id) {
  auto it = groups_.find(group_id);
  if (it == groups_.end() || it->second.open > 0) return;
  // Outstanding requests of a finished group can only belong to samples already ended (cancelled);
  // their late results are ignored.
  Record rec = std::move(it->second);
  groups_.erase(it);
  auto g = rec.group;
  g->finished_at = clock_.now();
  if (g->kind == RolloutKind::kTrain) --inflight_train_groups_;
  const auto completed = std::count(rec.states.begin(), rec.states.end(), SampleState::kCompleted);
  if (completed == static_cast<long>(rec.states.size())) {
    if (g->kind == RolloutKind::kTrain) {
      hooks_.on_train_group(std::move(g));
    } else {
      hooks_.on_eval_group(std::move(g));
    }
    return;
  }
  // Whole groups are dropped together: the completed samples of a broken group are unusable.
  if (completed > 0) ledger_.dispose("group_incomplete", static_cast<std::uint64_t>(completed));
  if (g->kind == RolloutKind::kEval && hooks_.on_eval_group_lost) hooks_.on_eval_group_lost(std::move(g));
}

void RolloutDispatcher::on_version(Version v) {
  version_ = v;
  pump();
}

void RolloutDispatcher::on_step_cut(std::int64_t step) {
  steps_cut_ = step;
  pump();
}

void RolloutDispatcher::hold(bool on) {
  held_ = on;
  if (!on) pump();
  update_wait_for_policy();
}

void RolloutDispatcher::start_draining() {
  draining_ = true;
  update_wait_for_policy();
}

void RolloutDispatcher::cancel_train(const std::string& reason) { cancel_where(reason, true); }
void RolloutDispatcher::cancel_all(const std::string& reason) {
  eval_queue_.clear();
  cancel_where(reason, false);
}

void RolloutDispatcher::cancel_where(const std::string& reason, bool train_only) {
  std::vector<std::uint64_t> ids;
  for (auto& [id, rec] : groups_)
    if (!train_only || rec.group->kind == RolloutKind::kTrain) ids.push_back(id);
  std::sort(ids.begin(), ids.end());  // deterministic order
  for (auto id : ids) {
    auto& rec = groups_.at(id);
    for (auto& [rid, sig] : rec.requests) sig->emit(asio::cancellation_type::terminal);
    rec.requests.clear();
    for (int s = 0; s < static_cast<int>(rec.states.size()); ++s)
      if (rec.states[s] == SampleState::kInFlight || rec.states[s] == SampleState::kAwaitingContinuation ||
          rec.states[s] == SampleState::kAwaitingEnv)
        end_sample(rec, s, SampleState::kCancelled, reason);
    maybe_finish(id);
  }
}

void RolloutDispatcher::enqueue_eval(std::uint64_t eval_id, const std::vector<std::shared_ptr<const Task>>& tasks,
                                     int samples) {
  for (const auto& t : tasks) eval_queue_.push_back({eval_id, t, samples});
  pump();
}

void RolloutDispatcher::requeue(std::vector<Task> tasks) {
  for (auto& t : tasks) requeued_.push_back(std::move(t));
}

std::vector<Task> RolloutDispatcher::unfinished_train_tasks() const {
  std::vector<std::pair<std::uint64_t, Task>> v;
  for (const auto& [id, rec] : groups_)
    if (rec.group->kind == RolloutKind::kTrain) v.emplace_back(id, *rec.source_task);
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Task> out;
  for (auto& t : requeued_) out.push_back(t);
  for (auto& [id, t] : v) out.push_back(std::move(t));
  return out;
}

Awaitable<void> RolloutDispatcher::wait_idle() {
  while (outstanding_requests_ > 0) co_await idle_.wait();
}

std::string RolloutDispatcher::rng_state() const {
  std::ostringstream os;
  os << rng_;
  return os.str();
}

Status RolloutDispatcher::restore_rng(const std::string& state) {
  std::istringstream is(state);
  is >> rng_;
  if (!is) return make_error(ErrorCode::kParse, "checkpoint: malformed dispatcher RNG state");
  return ok();
}

}  // namespace arlo::orch
