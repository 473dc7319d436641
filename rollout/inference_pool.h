#pragma once
// Sending completion requests to a fleet of inference workers (OpenAI-compatible servers).
//
// InferencePool (the orchestrator reaches it through session::adapters::RolloutInference; its unit
// tests fake the orchestrator's InferencePort, not this):
//   - routing: least outstanding requests among usable workers, with group affinity (requests with
//     the same affinity_key go to the same worker while it stays usable, for its prefix cache);
//   - a deadline on every request covering all attempts;
//   - retry on another worker for connection errors, 5xx answers and per-attempt timeouts; each
//     submit() completes exactly once, with the first successful answer or the last error;
//   - a circuit breaker per worker: `failure_threshold` consecutive failures open it; while open the
//     worker gets no requests and is probed with GET /health after an exponential backoff; a
//     successful probe closes it. Requests still waiting on a worker when its circuit opens (a
//     stopped or hung worker answers nothing) are cut off and retried on another one, within their
//     deadline;
//   - a silent worker fails over at once: a health probe that times out (no answer at all, not a
//     refusal or an error status) while the worker holds requests and none of them got an answer
//     since the probe started opens its circuit without waiting for `failure_threshold` probes
//     (each waits out health_timeout: a link that is down would hold its requests ~3 timeouts).
//     A worker that is slow but answers its requests, or an idle one, only counts a failure;
//     `open_on_silence = false` restores the plain count;
//   - workers join (add_worker: usable after its first successful health check) and leave
//     (remove_worker: no new requests, in-flight ones finish) at runtime;
//   - a request that asks for it (CompletionRequest::cache_salt) carries "cache_salt" naming the
//     weights its worker serves (weights_changed): vLLM and SGLang share prefix KV only between
//     requests with the same salt, so none computed under other weights is reused after an update.
// Threading: everything runs on the io_context's single thread; no locks.
#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/async/clock.h"
#include "common/http.h"
#include "common/result.h"
#include "rollout/types.h"

namespace arlo::rollout {

struct WorkerStatus {
  std::string url;
  bool healthy = false;  // last health check (or request) succeeded and circuit closed
  bool circuit_open = false;
  bool removed = false;
  std::size_t outstanding = 0;
  std::uint64_t completed = 0;          // successful requests
  std::uint64_t failed = 0;             // failed attempts (connection errors, 5xx, timeouts)
  std::optional<std::int64_t> version;  // policy version reported by /health, when present
  // Its last health probe got no answer within health_timeout (a dead link or a hung host, not a
  // refusal or an error status). With circuit_open: admin calls to it would only wait out their
  // deadlines, so a weight update leaves it out until it answers again.
  bool silent = false;
};

struct PoolOptions {
  Duration health_interval = std::chrono::seconds(2);
  Duration health_timeout = std::chrono::seconds(2);
  int failure_threshold = 3;  // consecutive failures that open the circuit
  Duration open_backoff_initial = std::chrono::milliseconds(200);
  Duration open_backoff_max = std::chrono::seconds(30);
  // A probe that times out while the worker holds requests, none of which got an answer since the
  // probe started, opens the circuit at once (see above). Config: inference.failover_on_silence.
  bool open_on_silence = true;
  int max_attempts = 3;                       // workers tried per request
  std::optional<Duration> attempt_timeout{};  // per attempt; default: the remaining deadline
  std::size_t affinity_capacity = 8192;       // affinity keys remembered (oldest forgotten)
  http::ClientOptions client;
  // The time health intervals, recovery backoff and request deadlines are measured on
  // (common/async/clock.h): a FakeClock in tests. Not owned; it must outlive the pool. Null: the
  // real clock. The pool's HTTP client uses it too unless client.clock is set.
  arlo::Clock* clock = nullptr;
};

class InferencePool {
 public:
  InferencePool(boost::asio::io_context& io, PoolOptions options = {});
  ~InferencePool();

  // base_url: "http://host:port". Adding a known URL again revives it if it was removed.
  void add_worker(const std::string& base_url);
  void remove_worker(const std::string& base_url);
  std::vector<std::string> workers() const;  // not removed

  // Starts the periodic health checks (also run once immediately for every worker).
  void start();
  // Stops health checks and wakes waiters; in-flight requests finish on their own deadlines.
  void stop();

  // Sends one request; completes exactly once. Errors: kTimeout (deadline passed), kUnavailable
  // (no usable worker, or all attempts failed), kParse / kInvalidArgument for a 4xx or bad answer
  // (not retried: the request itself is wrong).
  boost::asio::awaitable<Result<Completion>> submit(CompletionRequest request, Duration timeout);
  std::vector<WorkerStatus> status() const;

  // The weights `base_url` serves change: a pause that may precede an update (no version: its
  // label stays) or an update that ended, loaded (`version`) or not. Requests sent to it from now
  // on carry a salt no earlier request carried: requests queued in a keep pause run on the new
  // weights, a failed update may have loaded part of them, a restarted server was resynced.
  void weights_changed(const std::string& base_url, std::optional<std::int64_t> version = std::nullopt);
  // The cache_salt of requests to `base_url` now: "arlo-<pool id>-v<version>-<change count>" (the
  // version is "init" until weights_changed gave one; the pool id is random, so that another run
  // against the same long-lived server shares no prefix KV with this one). Empty for an unknown url.
  std::string cache_salt(const std::string& base_url) const;

  // Called on the pool's thread with a worker's base_url when its circuit closes after it opened:
  // it answers again after answering nothing or failing, and may have been restarted meanwhile (what
  // it serves now is unknown to the pool).
  void on_back(std::function<void(const std::string& base_url)> callback) { on_back_ = std::move(callback); }

  // Health-checks every worker now (used by start(); handy in tests). Completes when all answered.
  boost::asio::awaitable<void> check_all();

  http::Client& client() { return *client_; }

 private:
  struct Worker {
    std::string url;
    bool healthy = false;
    bool circuit_open = false;
    bool removed = false;
    bool probing = false;     // a health probe is in flight
    bool recovering = false;  // a recovery coroutine owns this worker's probes
    int consecutive_failures = 0;
    Duration backoff{};
    Clock::time_point next_probe{};
    std::size_t outstanding = 0;
    std::uint64_t completed = 0;
    std::uint64_t failed = 0;
    std::optional<std::int64_t> version;
    std::optional<std::int64_t> weights_version;  // the last update's (weights_changed)
    std::uint64_t weights_changes = 0;            // weights_changed calls
    bool silent = false;                          // see WorkerStatus::silent
    Clock::time_point last_answer{};              // the last HTTP response (any status) to a request or probe
    // Fires (is cancelled) when the circuit opens: requests waiting on this worker give up on it.
    std::shared_ptr<boost::asio::steady_timer> lost;
  };

  Worker* find(const std::string& url);
  Worker* pick(const std::string& affinity_key, const std::vector<std::string>& tried);
  void remember_affinity(const std::string& key, const std::string& url);
  void on_success(Worker& s);
  void on_failure(Worker& s, const Error& why);
  void open_circuit(Worker& s, const std::string& why);
  boost::asio::awaitable<bool> probe(Worker& s);
  boost::asio::awaitable<void> recover(Worker& s, std::shared_ptr<bool> alive);
  boost::asio::awaitable<void> health_loop(std::shared_ptr<bool> alive);
  boost::asio::awaitable<void> wait_health_interval(std::shared_ptr<bool> alive);

  boost::asio::io_context& io_;
  PoolOptions options_;
  std::unique_ptr<arlo::Clock> own_clock_;  // the real clock, when options.clock is null
  arlo::Clock* clock_;
  std::unique_ptr<http::Client> client_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::unordered_map<std::string, std::string> affinity_;  // key -> url
  std::deque<std::string> affinity_order_;
  boost::asio::steady_timer health_timer_;  // woken by the clock after health_interval, or by stop()
  bool running_ = false;
  std::function<void(const std::string&)> on_back_;
  std::size_t round_robin_ = 0;  // breaks ties between equally loaded workers
  std::shared_ptr<bool> alive_;  // guards coroutines that outlive the pool
  std::string salt_id_;          // random per pool: the run's part of every cache_salt
};

}  // namespace arlo::rollout
