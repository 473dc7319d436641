#include "session/adapters/rollout_adapters.h"

#include <fmt/format.h>

#include <algorithm>
#include <span>
#include <string_view>

#include "rollout/openai.h"

namespace arlo::session::adapters {

RolloutInference::RolloutInference(rollout::InferencePool& pool,
                                   std::vector<std::unique_ptr<rollout::AdminClient>> admins, DescribeUpdate describe,
                                   std::string model, std::optional<asio::any_io_executor> network,
                                   rollout::AdminDialect server)
    : pool_(pool),
      describe_(std::move(describe)),
      model_(std::move(model)),
      network_(std::move(network)),
      server_(server) {
  for (auto& a : admins) {
    const auto url = a->url();
    admins_.emplace(url, std::move(a));
  }
  // Registered before the pool starts (it is not running yet); the caller's callback comes later.
  pool_.on_back([back = back_, this](const std::string& pool_url) {
    std::lock_guard lock(back->mu);
    if (!back->callback) return;  // no callback yet, or this adapter is gone (its destructor cleared it)
    if (auto worker = worker_of(pool_url); !worker.empty()) back->callback(std::move(worker));
  });
}

RolloutInference::~RolloutInference() {
  std::lock_guard lock(back_->mu);
  back_->callback = nullptr;
}

void RolloutInference::on_worker_back(std::function<void(std::string worker)> callback) {
  std::lock_guard lock(back_->mu);
  back_->callback = std::move(callback);
}

std::string RolloutInference::worker_of(const std::string& pool_url) const {
  for (const auto& [url, a] : admins_) {
    auto u = std::string_view(url);
    while (!u.empty() && u.back() == '/') u.remove_suffix(1);
    if (u == pool_url) return url;
  }
  return "";
}

std::vector<std::string> RolloutInference::workers() const {
  std::vector<std::string> v;
  for (const auto& [url, a] : admins_) v.push_back(url);
  return v;
}

Result<rollout::AdminClient*> RolloutInference::admin(const std::string& worker) {
  auto it = admins_.find(worker);
  if (it == admins_.end())
    return make_error(ErrorCode::kNotFound, fmt::format("no admin client for worker {}", worker));
  return it->second.get();
}

template <typename T, typename Make>
Awaitable<T> RolloutInference::on_pool_thread(Make make) {
  if (!network_) {
    auto op = make();
    co_return co_await std::move(op);
  }
  auto op = run_on<T>(*network_, std::move(make));
  co_return co_await std::move(op);
}

Awaitable<Result<orch::GenerateResult>> RolloutInference::generate(orch::GenerateRequest request) {
  auto op = on_pool_thread<Result<orch::GenerateResult>>(
      [this, request = std::move(request)]() mutable { return generate_here(std::move(request)); });
  auto result = co_await std::move(op);
  // kMismatch from generate_here: the server's responses lack token data (check_token_data).
  if (!result && result.error().code() == ErrorCode::kMismatch && on_unusable_ && !unusable_reported_) {
    unusable_reported_ = true;
    on_unusable_(result.error());
  }
  co_return result;
}

Awaitable<Result<orch::GenerateResult>> RolloutInference::generate_here(orch::GenerateRequest req) {
  rollout::CompletionRequest cr;
  cr.model = model_;
  cr.prompt_token_ids = req.prompt_tokens;
  if (cr.prompt_token_ids.empty() && req.task) {
    if (!req.task->messages.empty())
      cr.messages = req.task->messages;
    else
      cr.prompt = req.task->prompt_text();
    cr.tools = req.task->tools;  // chat tasks: the tools go in the body (rollout/openai.cc)
  }
  cr.sampling = req.sampling;
  cr.sampling.n = req.n;
  cr.sampling.seed = req.seed;
  cr.sampling.logprobs = true;
  cr.affinity_key = std::to_string(req.group_id);
  const bool chat = cr.is_chat();
  const bool logprobs = cr.sampling.logprobs;
  cr.extra = rollout::token_data_request(server_, chat);
  // Prefix KV only from the weights the worker serves now (arlo-worker keeps no cache across versions).
  cr.cache_salt = server_ == rollout::AdminDialect::kVllm || server_ == rollout::AdminDialect::kSglang;
  const auto budget = std::max<orch::Duration>(orch::Duration::zero(), req.deadline - orch::Clock_::now());
  auto completion = co_await pool_.submit(std::move(cr), budget);
  if (!completion) co_return std::unexpected(std::move(completion).error());
  if (auto st = rollout::check_token_data(*completion, chat, logprobs, server_); !st)
    co_return std::unexpected(st.error());
  orch::GenerateResult out;
  out.prompt_tokens = std::move(completion->prompt_token_ids);
  out.worker = completion->worker;
  // The wire's choices become samples once, by moves (common/sample.h).
  for (auto& ch : completion->choices) {
    Sample c;
    c.completion_tokens = std::move(ch.token_ids);
    c.logprobs = std::move(ch.logprobs);
    c.version_spans = std::move(ch.version_spans);
    c.finish_reason = ch.finish_reason;
    c.text = std::move(ch.text);
    c.worker = out.worker;
    out.completions.push_back(std::move(c));
  }
  co_return out;
}

Awaitable<Status> RolloutInference::admin_call_here(std::string worker,
                                                    std::function<Awaitable<Status>(rollout::AdminClient&)> call) {
  auto a = admin(worker);
  if (!a) co_return std::unexpected(std::move(a).error());
  auto op = call(**a);
  co_return co_await std::move(op);
}

Awaitable<Status> RolloutInference::admin_call(std::string worker,
                                               std::function<Awaitable<Status>(rollout::AdminClient&)> call) {
  auto op = on_pool_thread<Status>([this, worker = std::move(worker), call = std::move(call)]() mutable {
    return admin_call_here(std::move(worker), std::move(call));
  });
  co_return co_await std::move(op);
}

Awaitable<Status> RolloutInference::pause(std::string worker, PauseMode mode, orch::TimePoint) {
  // Requests sent from now on may wait out the update in the server's queue (keep): a new salt.
  std::function<Awaitable<Status>(rollout::AdminClient&)> call = [this, worker, mode](rollout::AdminClient& a) {
    pool_.weights_changed(worker);
    return a.pause(mode);
  };
  auto op = admin_call(std::move(worker), std::move(call));
  co_return co_await std::move(op);
}

namespace {
Awaitable<Status> prepare_then_commit(rollout::AdminClient& a, rollout::WeightUpdate update) {
  auto prepare = a.prepare_weights(update);
  auto prepared = co_await std::move(prepare);
  if (!prepared) co_return prepared;
  auto commit = a.commit_weights(update.version);
  co_return co_await std::move(commit);
}
// The update, then a new cache salt for `worker` whatever came of it (a failed one may have loaded
// part of the weights).
Awaitable<Status> update_then_salt(rollout::InferencePool& pool, std::string worker, rollout::AdminClient& a,
                                   rollout::WeightUpdate update) {
  auto op = prepare_then_commit(a, update);
  auto st = co_await std::move(op);
  pool.weights_changed(worker, st ? std::optional<std::int64_t>(update.version) : std::nullopt);
  co_return st;
}
}  // namespace

Awaitable<Status> RolloutInference::update_weights(std::string worker, orch::WeightRound round, orch::TimePoint) {
  rollout::WeightUpdate update = describe_ ? describe_(worker, round) : rollout::WeightUpdate{};
  update.version = round.version;
  std::function<Awaitable<Status>(rollout::AdminClient&)> call = [this, worker, update](rollout::AdminClient& a) {
    return update_then_salt(pool_, worker, a, update);
  };
  auto op = admin_call(std::move(worker), std::move(call));
  co_return co_await std::move(op);
}

Awaitable<Status> RolloutInference::resume(std::string worker, orch::TimePoint) {
  std::function<Awaitable<Status>(rollout::AdminClient&)> call = [](rollout::AdminClient& a) { return a.resume(); };
  auto op = admin_call(std::move(worker), std::move(call));
  co_return co_await std::move(op);
}

Awaitable<Result<orch::WorkerWeights>> RolloutInference::weights(std::string worker, orch::TimePoint) {
  auto op = on_pool_thread<Result<orch::WorkerWeights>>(
      [this, worker = std::move(worker)]() mutable { return weights_here(std::move(worker)); });
  co_return co_await std::move(op);
}

Awaitable<Result<orch::WorkerWeights>> RolloutInference::weights_here(std::string worker) {
  auto a = admin(worker);
  if (!a) co_return std::unexpected(std::move(a).error());
  auto query = (*a)->weights();
  auto info = co_await std::move(query);
  if (!info) co_return std::unexpected(std::move(info).error());
  co_return orch::WorkerWeights{info->version.value_or(kNoVersion), info->checksum};
}

Awaitable<std::vector<std::string>> RolloutInference::silent_workers() {
  auto op = on_pool_thread<std::vector<std::string>>([this] { return silent_workers_here(true); });
  co_return co_await std::move(op);
}

Awaitable<std::vector<std::string>> RolloutInference::unreachable_workers() {
  auto op = on_pool_thread<std::vector<std::string>>([this] { return silent_workers_here(false); });
  co_return co_await std::move(op);
}

Awaitable<std::vector<std::string>> RolloutInference::silent_workers_here(bool circuit_open) {
  std::vector<std::string> out;
  for (const auto& s : pool_.status()) {
    if ((circuit_open && !s.circuit_open) || !s.silent || s.removed) continue;
    if (auto worker = worker_of(s.url); !worker.empty()) out.push_back(std::move(worker));
  }
  co_return out;
}

RolloutTasks::RolloutTasks(std::shared_ptr<rollout::TaskStream> stream)
    : stream_(std::make_shared<rollout::TaskMix>(std::move(stream))) {}

RolloutTasks::RolloutTasks(std::shared_ptr<rollout::TaskMix> mix) : stream_(std::move(mix)) {}

Result<Task> RolloutTasks::next() {
  ARLO_ASSIGN_OR_RETURN(auto t, stream_->next());
  ++served_;
  return t;
}

nlohmann::json RolloutTasks::cursor() const { return {{"stream", stream_->cursor()}, {"seq", served_}}; }

Status RolloutTasks::restore(const nlohmann::json& cursor) {
  if (!cursor.is_object() || !cursor.contains("stream") || !cursor.contains("seq") ||
      !cursor["seq"].is_number_unsigned())
    return make_error(ErrorCode::kParse, "task cursor: expected {\"stream\": ..., \"seq\": N}");
  ARLO_TRY(stream_->restore(cursor["stream"]));
  served_ = cursor["seq"].get<std::uint64_t>();
  return ok();
}

namespace {

// What orchestrator.overlong makes of each sample: a truncated one is dropped or masked, as
// compute_advantages decided it. A group that the estimator drops for another reason (rloo with one
// sample) trains at advantage 0, as ever.
std::vector<SampleFate> overlong_fates(std::span<const rollout::SampleInput> samples,
                                       rollout::TruncationPolicy policy) {
  std::vector<SampleFate> out(samples.size(), SampleFate::kTrain);
  for (std::size_t i = 0; i < samples.size(); ++i) {
    if (!samples[i].truncated) continue;
    if (policy == rollout::TruncationPolicy::kDrop) out[i] = SampleFate::kDropped;
    if (policy == rollout::TruncationPolicy::kMask) out[i] = SampleFate::kMasked;
  }
  return out;
}

}  // namespace

RolloutScorer::RolloutScorer(rollout::RewardScorer& scorer, rollout::AdvantageOptions advantages)
    : scorer_(scorer), advantages_(std::move(advantages)) {
  // The orchestrator's TrainSink applies the equal-reward filter itself (counted in the ledger).
  advantages_.filter_equal_reward_groups = false;
}

Awaitable<Result<orch::ScoredGroup>> RolloutScorer::score(std::shared_ptr<const Task> task,
                                                          std::shared_ptr<const std::vector<Sample>> completions) {
  // Rollout is Sample: the reward modules read the group's samples where they are (named by task
  // and index by the dispatcher), on the scorer's threads; nothing is copied.
  std::vector<rollout::SampleScore> scores;
  auto st = co_await scorer_.score_shared(task, completions, scores);
  if (!st) co_return std::unexpected(std::move(st).error());
  orch::ScoredGroup out;
  std::vector<rollout::SampleInput> inputs;
  for (std::size_t i = 0; i < scores.size(); ++i) {
    const auto& c = (*completions)[i];
    out.rewards.push_back(scores[i].reward.value_or(0.0));
    out.metrics.push_back(std::move(scores[i].metrics));
    inputs.push_back({out.rewards.back(), c.completion_tokens.size(), c.finish_reason == FinishReason::kLength});
  }
  auto adv = rollout::compute_advantages(inputs, advantages_);
  out.advantages = std::move(adv.advantages);
  out.advantages.resize(out.rewards.size(), 0.0);
  out.fates = overlong_fates(inputs, advantages_.truncated);
  co_return out;
}

}  // namespace arlo::session::adapters
