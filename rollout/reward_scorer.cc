#include "rollout/reward_scorer.h"

#include <cmath>

#include <fmt/format.h>

#include "common/log.h"
#include "rollout/async_util.h"

namespace arlo::rollout {

namespace asio = boost::asio;

Result<FailurePolicy> parse_failure_policy(std::string_view name) {
  if (name == "assign") return FailurePolicy::kAssign;
  if (name == "drop") return FailurePolicy::kDrop;
  if (name == "fail") return FailurePolicy::kFail;
  return make_error(ErrorCode::kInvalidArgument, fmt::format("unknown reward failure policy '{}': use assign, drop or fail", name));
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
    return make_error(ErrorCode::kInvalidArgument, fmt::format("reward module '{}' returned a non-finite reward ({})", name, s.reward));
  for (const auto& [k, v] : s.metrics)
    if (!std::isfinite(v))
      return make_error(ErrorCode::kInvalidArgument, fmt::format("reward module '{}' returned non-finite metric '{}' ({})", name, k, v));
  return ok();
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

RewardScorer::RewardScorer(asio::io_context& loop, std::shared_ptr<RewardModule> module, ScorerOptions options)
    : loop_(loop),
      module_(std::move(module)),
      options_(options),
      executor_(AbandonableExecutor::Options{options.threads, options.max_abandoned}) {}

Status RewardScorer::handle_failure(Rollout& r, const Error& e) {
  ++stats_.failed;
  if (e.code() == ErrorCode::kTimeout) ++stats_.timeouts;
  if (e.message().find("non-finite") != std::string::npos) ++stats_.non_finite;
  switch (options_.on_failure) {
    case FailurePolicy::kAssign:
      ++stats_.assigned;
      r.reward = options_.assign_value;
      r.metrics["reward/failed"] = 1.0;
      ARLO_WARN_EVERY(10.0, "reward for task {} sample {} failed, assigned {}: {}", r.task_id, r.sample_index,
                      options_.assign_value, e.what());
      return ok();
    case FailurePolicy::kDrop:
      ++stats_.dropped;
      r.reward.reset();
      ARLO_WARN_EVERY(10.0, "reward for task {} sample {} failed, sample dropped: {}", r.task_id, r.sample_index, e.what());
      return ok();
    case FailurePolicy::kFail:
      break;
  }
  Error out = e;
  out.with_context(fmt::format("scoring task {} sample {} (reward failure policy: fail)", r.task_id, r.sample_index));
  return std::unexpected(std::move(out));
}

asio::awaitable<Status> RewardScorer::score_group(const Task& task, std::vector<Rollout>& group) {
  const auto t0 = Clock::now();
  std::shared_ptr<RewardModule> module = module_;
  const std::string name = module->name();
  if (module->scores_groups()) {
    ++stats_.calls;
    auto task_copy = std::make_shared<const Task>(task);
    auto group_copy = std::make_shared<const std::vector<Rollout>>(group);
    Result<std::vector<Score>> scores = co_await executor_.run<std::vector<Score>>(
        loop_,
        [module, task_copy, group_copy, name]() -> Result<std::vector<Score>> {
          return guarded(name, [&] { return module->score_group(*task_copy, *group_copy); });
        },
        options_.timeout);
    if (scores && scores->size() != group.size())
      scores = make_error(ErrorCode::kMismatch, fmt::format("reward module '{}' returned {} scores for a group of {}", name,
                                                            scores->size(), group.size()));
    for (std::size_t i = 0; i < group.size(); ++i) {
      Status st = scores ? check_finite(name, (*scores)[i]) : Status(std::unexpected(scores.error()));
      if (st) {
        ++stats_.scored;
        group[i].reward = (*scores)[i].reward;
        for (auto& [k, v] : (*scores)[i].metrics) group[i].metrics[k] = v;
      } else if (auto f = handle_failure(group[i], st.error()); !f) {
        co_return f;
      }
      group[i].timings.scoring_s = seconds_since(t0);
    }
    co_return ok();
  }

  auto task_copy = std::make_shared<const Task>(task);
  std::vector<asio::awaitable<Result<Score>>> calls;
  calls.reserve(group.size());
  for (const auto& r : group) {
    ++stats_.calls;
    auto sample = std::make_shared<const Rollout>(r);
    calls.push_back(executor_.run<Score>(
        loop_,
        [module, task_copy, sample, name]() -> Result<Score> {
          return guarded(name, [&] { return module->score(*task_copy, *sample); });
        },
        options_.timeout));
  }
  std::vector<Result<Score>> results = co_await when_all(std::move(calls));
  Status first_failure = ok();
  for (std::size_t i = 0; i < group.size(); ++i) {
    Status st = results[i] ? check_finite(name, *results[i]) : Status(std::unexpected(results[i].error()));
    if (st) {
      ++stats_.scored;
      group[i].reward = results[i]->reward;
      for (auto& [k, v] : results[i]->metrics) group[i].metrics[k] = v;
    } else if (auto f = handle_failure(group[i], st.error()); !f && first_failure) {
      first_failure = std::move(f);
    }
    group[i].timings.scoring_s = seconds_since(t0);
  }
  co_return first_failure;
}

}  // namespace arlo::rollout
