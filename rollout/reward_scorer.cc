#include "rollout/reward_scorer.h"

#include <cmath>

#include <fmt/format.h>

#include "common/enum_names.h"
#include "common/log.h"
#include "common/async/coro.h"

namespace arlo::rollout {

namespace asio = boost::asio;

namespace {
constexpr EnumName<FailurePolicy> kFailurePolicies[] = {
    {FailurePolicy::kAssign, "assign"}, {FailurePolicy::kDrop, "drop"}, {FailurePolicy::kFail, "fail"}};
}  // namespace

Result<FailurePolicy> parse_failure_policy(std::string_view name) {
  return parse_enum(kFailurePolicies, "reward failure policy", name);
}

namespace {

// Runs a module call, turning exceptions into errors and rejecting non-finite numbers.
template <typename F>
auto guarded(const std::string& name, F f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kInternal, fmt::format("reward module '{}' threw: {}", name, e.what()));
  } catch (...) {
    return make_error(ErrorCode::kInternal, fmt::format("reward module '{}' threw a non-standard exception", name));
  }
}

Status check_finite(const std::string& name, const Score& s) {
  if (!std::isfinite(s.reward))
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("reward module '{}' returned a non-finite reward ({})", name, s.reward));
  for (const auto& [k, v] : s.metrics)
    if (!std::isfinite(v))
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("reward module '{}' returned non-finite metric '{}' ({})", name, k, v));
  return ok();
}

}  // namespace

RewardScorer::RewardScorer(asio::io_context& loop, std::shared_ptr<RewardModule> module, ScorerOptions options)
    : loop_(loop),
      module_(std::move(module)),
      options_(options),
      executor_(AbandonableExecutor::Options{options.threads, options.max_abandoned, options.clock}) {}

Status RewardScorer::handle_failure(const Rollout& r, const Error& e, SampleScore& out) {
  ++stats_.failed;
  if (e.code() == ErrorCode::kTimeout) ++stats_.timeouts;
  if (e.message().find("non-finite") != std::string::npos) ++stats_.non_finite;
  switch (options_.on_failure) {
    case FailurePolicy::kAssign:
      ++stats_.assigned;
      out.reward = options_.assign_value;
      out.metrics["reward/failed"] = 1.0;
      ARLO_WARN_EVERY(10.0, "reward for task {} sample {} failed, assigned {}: {}", r.task_id, r.sample_index,
                      options_.assign_value, e.what());
      return ok();
    case FailurePolicy::kDrop:
      ++stats_.dropped;
      out.reward.reset();
      ARLO_WARN_EVERY(10.0, "reward for task {} sample {} failed, sample dropped: {}", r.task_id, r.sample_index,
                      e.what());
      return ok();
    case FailurePolicy::kFail: break;
  }
  Error failed = e;
  failed.with_context(
      fmt::format("scoring task {} sample {} (reward failure policy: fail)", r.task_id, r.sample_index));
  return std::unexpected(std::move(failed));
}

// Plain functions, not coroutine code: GCC 12 mishandles temporaries in conditional expressions
// inside coroutines, so results are applied here.
Status RewardScorer::apply(const std::vector<Rollout>& group, std::vector<Result<Score>>& results,
                           std::vector<SampleScore>& out) {
  // A call that ended without a verdict on its sample (kCancelled: a process-isolated plugin's host
  // died under it, or shutdown) fails the whole group whatever the policy: no made-up reward.
  for (std::size_t i = 0; i < group.size(); ++i) {
    if (results[i] || results[i].error().code() != ErrorCode::kCancelled) continue;
    ++stats_.groups_lost;
    for (auto& s : out) s.reward.reset();
    Error lost = results[i].error();
    lost.with_context(
        fmt::format("scoring task {} sample {} (the group is dropped)", group[i].task_id, group[i].sample_index));
    return std::unexpected(std::move(lost));
  }
  // A module that cannot go on (kResourceExhausted: a plugin host past its restart bound) stops the run.
  if (auto usable = module_->usable(); !usable) return usable;
  Status first_failure = ok();
  const std::string& name = module_->name();
  for (std::size_t i = 0; i < group.size(); ++i) {
    Status st = ok();
    if (!results[i]) {
      st = std::unexpected(results[i].error());
    } else {
      st = check_finite(name, *results[i]);
    }
    if (st) {
      ++stats_.scored;
      out[i].reward = results[i]->reward;
      for (auto& [k, v] : results[i]->metrics) out[i].metrics[k] = v;
    } else {
      Status f = handle_failure(group[i], st.error(), out[i]);
      if (!f && first_failure) first_failure = std::move(f);
    }
  }
  return first_failure;
}

Status RewardScorer::apply_group(const std::vector<Rollout>& group, Result<std::vector<Score>>& scores,
                                 std::vector<SampleScore>& out) {
  std::vector<Result<Score>> per_sample;
  per_sample.reserve(group.size());
  if (scores && scores->size() != group.size()) {
    scores = make_error(ErrorCode::kMismatch, fmt::format("reward module '{}' returned {} scores for a group of {}",
                                                          module_->name(), scores->size(), group.size()));
  }
  for (std::size_t i = 0; i < group.size(); ++i) {
    if (scores) {
      per_sample.emplace_back(std::move((*scores)[i]));
    } else {
      per_sample.emplace_back(std::unexpected(scores.error()));
    }
  }
  return apply(group, per_sample, out);
}

// Coroutine locals initialised by co_await live at function scope on purpose: GCC 12 double-destroys
// such locals when they are declared in a nested block.
asio::awaitable<Status> RewardScorer::score_whole_group(std::shared_ptr<const Task> task,
                                                        std::shared_ptr<const std::vector<Rollout>> group,
                                                        std::vector<SampleScore>& out) {
  std::shared_ptr<RewardModule> module = module_;
  const std::string name = module->name();
  ++stats_.calls;
  // The result travels as a shared_ptr: GCC 12 mis-destroys a co_await-initialised
  // expected<vector<...>> in the coroutine frame.
  using Shared = std::shared_ptr<std::vector<Score>>;
  std::vector<asio::awaitable<Result<Shared>>> call;
  call.push_back(executor_.run<Shared>(
      loop_,
      [module, task, group, name]() -> Result<Shared> {
        auto r = guarded(name, [&] { return module->score_group(*task, *group); });
        if (!r) return std::unexpected(std::move(r).error());
        return std::make_shared<std::vector<Score>>(std::move(*r));
      },
      options_.timeout));
  std::vector<Result<Shared>> shared = co_await when_all(std::move(call));
  co_return apply_shared(*group, shared.front(), out);
}

Status RewardScorer::apply_shared(const std::vector<Rollout>& group,
                                  Result<std::shared_ptr<std::vector<Score>>>& shared, std::vector<SampleScore>& out) {
  Result<std::vector<Score>> scores = shared ? Result<std::vector<Score>>(std::move(**shared))
                                             : Result<std::vector<Score>>(std::unexpected(shared.error()));
  return apply_group(group, scores, out);
}

namespace {

// One SampleScore per sample, each starting from the sample's own reward.
void start_scores(const std::vector<Rollout>& group, std::vector<SampleScore>& out) {
  out.assign(group.size(), SampleScore{});
  for (std::size_t i = 0; i < group.size(); ++i) out[i].reward = group[i].reward;
}

// The scores written back into the samples (score_group's in-place form).
void write_scores(std::vector<Rollout>& group, std::vector<SampleScore>& scores) {
  for (std::size_t i = 0; i < group.size() && i < scores.size(); ++i) {
    group[i].reward = scores[i].reward;
    for (auto& [k, v] : scores[i].metrics) group[i].metrics[k] = v;
  }
}

}  // namespace

asio::awaitable<Status> RewardScorer::score_shared(std::shared_ptr<const Task> task,
                                                   std::shared_ptr<const std::vector<Rollout>> group,
                                                   std::vector<SampleScore>& out) {
  start_scores(*group, out);
  if (module_->scores_groups()) co_return co_await score_whole_group(std::move(task), std::move(group), out);
  std::shared_ptr<RewardModule> module = module_;
  const std::string name = module->name();
  std::vector<asio::awaitable<Result<Score>>> calls;
  calls.reserve(group->size());
  for (std::size_t i = 0; i < group->size(); ++i) {
    ++stats_.calls;
    calls.push_back(executor_.run<Score>(
        loop_,
        [module, task, group, i, name]() -> Result<Score> {
          return guarded(name, [&] { return module->score(*task, (*group)[i]); });
        },
        options_.timeout));
  }
  std::vector<Result<Score>> results = co_await when_all(std::move(calls));
  co_return apply(*group, results, out);
}

// The modules' threads may outlive this call (a call abandoned past its timeout): they read a copy.
asio::awaitable<Status> RewardScorer::score_group(const Task& task, std::vector<Rollout>& group) {
  auto shared = std::make_shared<const std::vector<Rollout>>(group);
  std::vector<SampleScore> scores;
  Status st = co_await score_shared(std::make_shared<const Task>(task), std::move(shared), scores);
  write_scores(group, scores);
  co_return st;
}

}  // namespace arlo::rollout
