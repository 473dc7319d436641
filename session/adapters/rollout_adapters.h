#pragma once
// Adapters from the orchestrator's ports to the rollout module: the worker pool and admin clients
// (InferencePort), an environment's task stream (TaskSource) and the reward scorer plus advantage
// estimator (ScorerPort). Each is called on the orchestrator's io_context thread; RolloutInference
// can run its HTTP work on a separate network thread (see its constructor).
#include <boost/asio/io_context.hpp>

#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/async/coro.h"
#include "orchestrator/ports.h"
#include "rollout/admin.h"
#include "rollout/advantages.h"
#include "rollout/environment.h"
#include "rollout/inference_pool.h"
#include "rollout/reward_scorer.h"
#include "rollout/task_mix.h"

namespace arlo::session::adapters {

namespace asio = boost::asio;

// Worker pool for generation; one admin client per worker for pause / weights / resume.
class RolloutInference final : public orch::InferencePort {
 public:
  // What `worker` (its admin url) needs to fetch the round's version (weight-sync block, manifest,
  // dialect extras), from where the round says it is.
  using DescribeUpdate = std::function<rollout::WeightUpdate(const std::string& worker, const orch::WeightRound&)>;
  // `pool` and every admin client must outlive this adapter; workers are keyed by admin->url().
  // With `network`, the pool and the admin clients live on that executor's thread (another
  // io_context): every call hops there and its result comes back to the caller's loop, so request
  // and response handling (sockets, JSON) never delays the orchestrator's loop. `describe` is
  // always called on the caller's thread.
  // `server` is what the pool's servers are (inference.kind): it chooses the request fields that
  // ask for token ids and logprobs, and the advice when a response lacks them.
  RolloutInference(rollout::InferencePool& pool, std::vector<std::unique_ptr<rollout::AdminClient>> admins,
                   DescribeUpdate describe, std::string model = "",
                   std::optional<asio::any_io_executor> network = std::nullopt,
                   rollout::AdminDialect server = rollout::AdminDialect::kArlo);
  ~RolloutInference() override;
  // Called once, on the caller's thread, with the first response that can never be trained on (a
  // server that returns no token ids, prompt ids or logprobs: rollout::check_token_data): every
  // other request would fail alike, so the run should stop with this error.
  void on_unusable_server(std::function<void(const Error&)> callback) { on_unusable_ = std::move(callback); }

  Awaitable<Result<orch::GenerateResult>> generate(orch::GenerateRequest request) override;
  std::vector<std::string> workers() const override;
  Awaitable<Status> pause(std::string worker, PauseMode mode, orch::TimePoint deadline) override;
  Awaitable<Status> update_weights(std::string worker, orch::WeightRound round, orch::TimePoint deadline) override;
  Awaitable<Status> resume(std::string worker, orch::TimePoint deadline) override;
  Awaitable<Result<orch::WorkerWeights>> weights(std::string worker, orch::TimePoint deadline) override;
  // The workers the pool finds silent (rollout::WorkerStatus::silent) with its circuit open,
  // or open or not, matched to their admin url; read on the pool's thread.
  Awaitable<std::vector<std::string>> silent_workers() override;
  Awaitable<std::vector<std::string>> unreachable_workers() override;
  void on_worker_back(std::function<void(std::string worker)> callback) override;

 private:
  Result<rollout::AdminClient*> admin(const std::string& worker);
  // The admin url (the worker's name at the port) of the pool's worker `pool_url`; empty if none.
  std::string worker_of(const std::string& pool_url) const;
  // What the pool's on_back reaches (the pool may outlive this adapter, so it holds this, not it).
  struct BackRelay {
    std::mutex mu;  // the pool calls on its thread; on_worker_back runs on the caller's
    std::function<void(std::string)> callback;
  };
  // Runs the coroutine make() returns on the pool's thread (here when there is no network thread).
  template <typename T, typename Make>
  Awaitable<T> on_pool_thread(Make make);
  // The calls themselves, on the pool's thread.
  Awaitable<Result<orch::GenerateResult>> generate_here(orch::GenerateRequest request);
  Awaitable<Result<orch::WorkerWeights>> weights_here(std::string worker);
  Awaitable<std::vector<std::string>> silent_workers_here(bool circuit_open);
  Awaitable<Status> admin_call_here(std::string worker, std::function<Awaitable<Status>(rollout::AdminClient&)> call);
  Awaitable<Status> admin_call(std::string worker, std::function<Awaitable<Status>(rollout::AdminClient&)> call);
  rollout::InferencePool& pool_;
  std::map<std::string, std::unique_ptr<rollout::AdminClient>> admins_;
  DescribeUpdate describe_;
  std::string model_;
  std::optional<asio::any_io_executor> network_;
  rollout::AdminDialect server_;
  std::function<void(const Error&)> on_unusable_;
  bool unusable_reported_ = false;
  std::shared_ptr<BackRelay> back_ = std::make_shared<BackRelay>();
};

// An endless (or epoch-bounded) task stream, or the mix of several (env.sources), handing out the
// environment's tasks as they are (token ids, where a run wants them, are added by its caller:
// session::RunTasks). The cursor holds the stream's (or the mix's) cursor and, as "seq", how many
// tasks it has handed out.
class RolloutTasks final : public orch::TaskSource {
 public:
  explicit RolloutTasks(std::shared_ptr<rollout::TaskStream> stream);
  explicit RolloutTasks(std::shared_ptr<rollout::TaskMix> mix);
  Result<Task> next() override;
  nlohmann::json cursor() const override;
  Status restore(const nlohmann::json& cursor) override;

 private:
  std::shared_ptr<rollout::TaskMix> stream_;
  std::uint64_t served_ = 0;
};

// Scores through rollout's RewardScorer (modules on its worker threads, with its timeout and
// failure policy), then computes advantages with rollout's estimator. A sample left unscored by
// the `drop` policy gets reward 0 and advantage 0. A completion cut off by max_tokens gets the fate
// that the estimator's truncation policy (orchestrator.overlong) gives it: dropped, masked or trained.
class RolloutScorer final : public orch::ScorerPort {
 public:
  RolloutScorer(rollout::RewardScorer& scorer, rollout::AdvantageOptions advantages);
  Awaitable<Result<orch::ScoredGroup>> score(std::shared_ptr<const Task> task,
                                             std::shared_ptr<const std::vector<Sample>> completions) override;

 private:
  rollout::RewardScorer& scorer_;
  rollout::AdvantageOptions advantages_;
};

}  // namespace arlo::session::adapters
