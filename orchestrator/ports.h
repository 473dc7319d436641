#pragma once
// The orchestrator's ports: the narrow interfaces through which it reaches everything it does not
// own. Real adapters (session/adapters/) connect them to rollout's worker pool, the
// trainer_bridge and the environments; unit tests connect them to fakes and step the io_context.
//
// Threading contract for every port: methods are called on the orchestrator's io_context thread,
// returned awaitables complete on that thread, and callbacks registered with a port are invoked on
// it. A port may do its work elsewhere (a thread pool, another process) but must post back.
#include <boost/asio/awaitable.hpp>
#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/async/clock.h"
#include "common/async/coro.h"
#include "common/result.h"
#include "orchestrator/types.h"

namespace arlo::orch {

namespace asio = boost::asio;

// Inference workers: data plane (generate) and admin plane (pause / update / resume), per worker.
// Every call honours its deadline; the orchestrator also enforces it from outside, so a port that
// fails to is cut off rather than hanging the loop.
class InferencePort {
 public:
  virtual ~InferencePort() = default;
  // n completions of one prompt, from one worker. Failure: the whole request failed (its samples
  // are counted failed with the error code as the reason).
  virtual Awaitable<Result<GenerateResult>> generate(GenerateRequest request) = 0;
  // Names of the workers the admin calls address, fixed for the call sequence of one update.
  virtual std::vector<std::string> workers() const = 0;
  virtual Awaitable<Status> pause(std::string worker, PauseMode mode, TimePoint deadline) = 0;
  // Makes `worker` fetch and apply `round.version` (prepare + commit in the arlo dialect) from where
  // the round says it is.
  virtual Awaitable<Status> update_weights(std::string worker, WeightRound round, TimePoint deadline) = 0;
  virtual Awaitable<Status> resume(std::string worker, TimePoint deadline) = 0;
  // What `worker` serves now (read at the end of a run for summary.json).
  virtual Awaitable<Result<WorkerWeights>> weights(std::string worker, TimePoint deadline) = 0;
  // Workers that answer nothing now: their requests failed over (the pool's circuit for them opened
  // when they went silent: a dark link or a hung host). An update round leaves them out rather than
  // wait out their admin deadlines, and they rejoin once they answer again. Default: none.
  virtual Awaitable<std::vector<std::string>> silent_workers() { co_return std::vector<std::string>{}; }
  // Workers whose last health probe got no answer at all, whether or not their circuit opened (an
  // idle or paused worker's does not: it holds no requests to fail over). An admin call that failed
  // on one is not retried: another would only wait out its deadline. Default: silent_workers().
  virtual Awaitable<std::vector<std::string>> unreachable_workers() { co_return co_await silent_workers(); }
  // Calls `callback` (on any thread: the loop posts it to itself) with a worker that answers again
  // after it answered nothing or failed (the pool's circuit closed): it may have been restarted and
  // serve other weights than it last took. Default: never.
  virtual void on_worker_back(std::function<void(std::string worker)> callback) { (void)callback; }
};

// Training tasks: an endless, seeded stream with a cursor that can be saved and restored, so a
// resumed run continues at the same data position. Cheap and synchronous (runs on the loop).
class TaskSource {
 public:
  virtual ~TaskSource() = default;
  virtual Result<Task> next() = 0;
  virtual nlohmann::json cursor() const = 0;
  virtual Status restore(const nlohmann::json& cursor) = 0;
};

// Multi-turn environments (docs/environments.md): built-in ones in C++, others over HTTP. The
// dispatcher calls reset before a multi-turn group's first request and step after each model turn
// of each sample, each call with a deadline; an error fails that sample (its code is the reason),
// never the run.
class EnvironmentPort {
 public:
  virtual ~EnvironmentPort() = default;
  // Whether `task` runs several turns (false: the single-turn path, no reset or step).
  virtual bool multi_turn(const Task& task) const = 0;
  // A trajectory of `task` starts: its first messages (non-empty: they replace the task's prompt
  // for the whole group) and the initial state every sample of the group starts from.
  virtual Awaitable<Result<EnvReply>> reset(std::shared_ptr<const Task> task, TimePoint deadline) = 0;
  // The model has ended a turn: `trajectory` holds everything so far (its last turn the model's,
  // its worker the server that answered it; prompt_tokens: the group's prompt ids). What the
  // environment adds, tokenized for that worker.
  virtual Awaitable<Result<EnvReply>> step(std::shared_ptr<const Task> task, const Sample& trajectory,
                                           std::vector<std::int32_t> prompt_tokens, TimePoint deadline) = 0;
};

// Scores one complete group off the event loop (reward modules on a thread pool, or a remote reward
// server) and computes its advantages.
class ScorerPort {
 public:
  virtual ~ScorerPort() = default;
  virtual Awaitable<Result<ScoredGroup>> score(std::shared_ptr<const Task> task,
                                               std::shared_ptr<const std::vector<Sample>> completions) = 0;
};

// The trainer. send() completes when the batch is accepted; under back-pressure (too many
// unacknowledged batches) it completes later. "Version v published" is pushed through the
// callback, never polled.
class TrainerPort {
 public:
  virtual ~TrainerPort() = default;
  virtual Awaitable<Status> send(TrainBatch batch) = 0;
  virtual void on_version(std::function<void(VersionNotice)> callback) = 0;
  // Calls `callback` on the loop each time the trainer is heard from (a heartbeat, a version). A
  // port without a liveness signal never calls it; the silence deadline (Options::
  // trainer_silence_timeout) starts at the first call.
  virtual void on_alive(std::function<void()> callback) { (void)callback; }
};

// Time: arlo::Clock (common/async/clock.h); RealClock in production, FakeClock in unit tests.

}  // namespace arlo::orch
