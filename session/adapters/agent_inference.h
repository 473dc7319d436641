#pragma once
// Agent tasks through the policy gateway (docs/environments.md, "The policy gateway"): a decorator of
// the run's InferencePort that hands a task an agent program drives to an AgentRunner (the gateway:
// it opens the group's trajectories, asks the program to run each and records every model call the
// program makes) and passes every other call to the port it wraps, unchanged.
//
// Threading: called on the orchestrator's loop like any InferencePort. With `network`, the runner is
// called on that executor's thread (the gateway and the worker pool live there, so its state needs
// no locks) and the result comes back to the caller's loop.
#include <boost/asio/any_io_executor.hpp>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/async/coro.h"
#include "orchestrator/ports.h"

namespace arlo::session::adapters {

// Runs a group of an agent task: n trajectories, each an agent program's run that ends with its
// reward; the result holds one sample per trajectory (the group's prompt ids: what every
// trajectory's first model call shares).
class AgentRunner {
 public:
  virtual ~AgentRunner() = default;
  // Whether an agent program drives `task` (false: the plain inference path).
  virtual bool handles(const Task& task) const = 0;
  virtual Awaitable<Result<orch::GenerateResult>> run(orch::GenerateRequest request) = 0;
};

class AgentInference final : public orch::InferencePort {
 public:
  // `inner` and `runner` must outlive this adapter; `runner` is used only on `network`'s thread
  // (the caller's when there is none).
  AgentInference(orch::InferencePort& inner, AgentRunner& runner,
                 std::optional<boost::asio::any_io_executor> network = std::nullopt);

  Awaitable<Result<orch::GenerateResult>> generate(orch::GenerateRequest request) override;
  // The rest is the wrapped port's: each returns its (lazy) operation, arguments moved into it.
  std::vector<std::string> workers() const override { return inner_.workers(); }
  void on_worker_back(std::function<void(std::string worker)> callback) override {
    inner_.on_worker_back(std::move(callback));
  }
  Awaitable<Status> pause(std::string worker, PauseMode mode, orch::TimePoint deadline) override {
    return inner_.pause(std::move(worker), mode, deadline);
  }
  Awaitable<Status> resume(std::string worker, orch::TimePoint deadline) override {
    return inner_.resume(std::move(worker), deadline);
  }
  Awaitable<Status> update_weights(std::string worker, orch::WeightRound round, orch::TimePoint deadline) override {
    return inner_.update_weights(std::move(worker), std::move(round), deadline);
  }
  Awaitable<Result<orch::WorkerWeights>> weights(std::string worker, orch::TimePoint deadline) override {
    return inner_.weights(std::move(worker), deadline);
  }
  Awaitable<std::vector<std::string>> silent_workers() override { return inner_.silent_workers(); }
  Awaitable<std::vector<std::string>> unreachable_workers() override { return inner_.unreachable_workers(); }

 private:
  orch::InferencePort& inner_;
  AgentRunner& runner_;
  std::optional<boost::asio::any_io_executor> network_;
};

}  // namespace arlo::session::adapters
