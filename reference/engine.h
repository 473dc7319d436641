#pragma once
// The batched generation engine: continuous batching on one dedicated thread.
//
// Requests are submitted from any thread. Between decoding steps (a token boundary) the engine
// admits queued requests into free KV-cache slots (their prompts run as one batched prefill),
// retires finished ones, applies a newly installed model, and honours pause/resume. Each decoding
// step is one forward pass over every active request. Sampling happens per request with the
// request's own random stream (sampler.h), so a request's tokens and logprobs do not depend on what
// else was in the batch.
//
// Pause modes (common/vocabulary.h):
//   keep  - stop at the next token boundary; in-flight requests keep their caches and continue,
//           on whatever model is installed by then, after resume(). Version spans record the switch.
//   wait  - admit nothing new; in-flight requests run to completion; then paused.
//   abort - in-flight and queued requests finish now with finish reason "abort"; then paused.
// While paused, new requests queue. resume() lifts any pause.
//
// Torch-free header. Thread-safety: every public method is safe from any thread. Callbacks
// (completion, paused, applied) run on the engine thread and must not block; post elsewhere.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_set>
#include <vector>

#include "common/result.h"
#include "common/vocabulary.h"
#include "reference/model.h"
#include "reference/sampler.h"
#include "reference/tokenizer.h"

namespace arlo::reference {

struct KvCache;  // model_impl.h

// Finish reasons (the engine reports stop, length and abort), pause modes and version spans are the
// shared vocabulary's (common/vocabulary.h, namespace arlo).

struct Generation {
  std::vector<std::int32_t> prompt;
  std::vector<std::int32_t> tokens;  // generated ids, including a final <eos> or stop-string characters
  std::vector<float> logprobs;       // one per generated token (sampler.h for the distribution)
  // When params.top_logprobs > 0: per generated token, the most likely (id, logprob) pairs.
  std::vector<std::vector<std::pair<std::int32_t, float>>> top_logprobs;
  std::string text;  // decoded, special tokens skipped, cut before a matched stop string
  FinishReason finish = FinishReason::kLength;
  std::optional<std::string> matched_stop;
  std::vector<VersionSpan> version_spans;
};

using GenerationCallback = std::function<void(Result<Generation>)>;

struct EngineStats {
  std::uint64_t tokens_generated = 0;
  std::uint64_t requests_finished = 0;
  std::uint64_t steps = 0;  // forward passes (prefill and decode)
  std::size_t active = 0;
  std::size_t queued = 0;
  bool paused = false;
};

struct EngineOptions {
  int max_batch = 64;      // KV-cache slots = most requests decoded together
  int threads = 1;         // libtorch intra/inter-op threads, set on the engine thread
  std::uint64_t seed = 0;  // base of the streams of requests that bring no seed
  // Called on the engine thread after every step, outside the engine's lock (it may call pause(),
  // cancel() ...). For metrics and for tests that act at an exact token boundary.
  std::function<void(const EngineStats&)> on_step;
};

class Engine {
 public:
  Engine(const ModelConfig& config, EngineOptions options = {});
  ~Engine();  // stops the thread; requests still pending complete with a kCancelled error
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }

  // Validates (non-empty prompt of valid ids shorter than the context, max_tokens >= 1,
  // temperature >= 0, top_p in (0, 1]) and queues. Returns the request id, or kInvalidArgument.
  // `done` runs exactly once (on the engine thread), unless submit returned an error.
  Result<std::uint64_t> submit(std::vector<std::int32_t> prompt, SamplingParams params, GenerationCallback done);
  // Finishes a queued or active request with reason "abort". Unknown ids are ignored.
  void cancel(std::uint64_t id);

  // Installs `model` as policy `version` at the next token boundary (also while paused); `applied`
  // runs once requests use it. Refuses a model of another shape.
  Status set_model(std::shared_ptr<Model> model, std::int64_t version, std::function<void()> applied = {});
  // The version in use (nullopt before the first model is applied).
  std::optional<std::int64_t> version() const;
  // The model in use; callers must not modify it.
  std::shared_ptr<const Model> model() const;

  // `paused` runs once the engine is paused in that mode (immediately for keep/abort at the next
  // boundary; for wait after the last in-flight request finished).
  void pause(PauseMode mode, std::function<void()> paused = {});
  void resume();
  bool paused() const;
  EngineStats stats() const;

 private:
  struct Request;
  struct PauseOrder {
    PauseMode mode;
    std::function<void()> paused;
  };
  // The engine thread: waits for work, applies what the other threads asked for (a new model,
  // cancellations, pauses), retires finished requests, admits queued ones and steps; at stop, fails
  // what is left. The *_locked steps run under mu_; the callbacks they collect run after it is
  // released.
  void run();
  // Swaps in the model set_model() left (the KV cache is made with the first one).
  void take_pending_model_locked(std::optional<KvCache>& cache, std::vector<std::function<void()>>& callbacks);
  // Cancelled requests: queued ones leave the queue, active ones finish with what they have.
  void apply_cancels_locked(std::vector<std::function<void()>>& callbacks);
  // Pause orders in arrival order: abort finishes everything now, keep freezes at a token
  // boundary, wait drains the active requests first (its callback waits in drained_waiters_).
  void apply_pause_orders_locked(std::vector<std::function<void()>>& callbacks);
  // Frees the slots of finished requests; once a drain is done, wakes the wait-mode pausers.
  void retire_finished_locked(std::vector<int>& free_slots, std::vector<std::function<void()>>& callbacks);
  // Moves queued requests into free slots, in order; they are `fresh` (to prefill).
  void admit_queued_locked(std::vector<int>& free_slots, std::vector<Request*>& fresh);
  // One step; a libtorch failure fails the requests of the step and the engine keeps serving.
  void step_or_fail(KvCache& cache, std::vector<Request*>& fresh, std::vector<std::function<void()>>& callbacks);
  // At shutdown: every request not finished fails with kCancelled.
  void fail_pending();
  void step(KvCache& cache, std::vector<Request*>& fresh, std::vector<std::function<void()>>& callbacks);
  void finish(Request* r, FinishReason reason, std::vector<std::function<void()>>& callbacks);
  bool has_work_locked() const;

  const ModelConfig config_;
  const EngineOptions options_;
  const Tokenizer tokenizer_{};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<std::unique_ptr<Request>> queued_;
  std::vector<std::unique_ptr<Request>> active_;  // owned by the engine thread once admitted
  std::unordered_set<std::uint64_t> cancels_;
  std::vector<PauseOrder> pause_orders_;
  std::vector<std::function<void()>> drained_waiters_;  // wait-mode callbacks
  bool paused_ = false;
  bool draining_ = false;
  struct PendingModel {
    std::shared_ptr<Model> model;
    std::int64_t version;
    std::function<void()> applied;
  };
  std::optional<PendingModel> pending_model_;
  std::shared_ptr<Model> model_;
  std::optional<std::int64_t> version_;
  std::uint64_t next_id_ = 1;
  EngineStats stats_;
  std::atomic<std::uint64_t> finished_count_{0};

  std::thread thread_;  // last: starts after every member above exists
};

}  // namespace arlo::reference
