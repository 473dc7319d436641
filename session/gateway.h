#pragma once
// The policy gateway (docs/environments.md, "The policy gateway"): an OpenAI-compatible endpoint
// (/v1/chat/completions, /v1/completions) that agent programs use as their model during a run. Each
// call names its trajectory (the per-trajectory base URL http://host:port/t/<id>/v1, the header
// X-Arlo-Trajectory or the query parameter `trajectory`), goes through the run's worker pool (sticky
// to one worker per trajectory: the id is the pool's affinity key) under the trajectory's deadline
// (and a per-call one, call_timeout), and is recorded into the trajectory: the ids its prompt adds beyond what the
// trajectory holds (loss mask 0), then the completion (loss mask 1, its logprobs and versions). An aborted call
// (abort-mode weight update) is continued here from its tokens, so the program sees one answer.
//
// An agent task's group (AgentRunner::run) opens n trajectories and POSTs to the agent program
// (gateway.agent_url) {"task", "trajectory", "base_url", "api_key", "sampling"} for each; the
// program's answer {"reward": r} closes its trajectory (Sample::env_reward). A program that fails,
// times out or answers garbage fails the group with the reason; a call whose prompt does not extend
// its trajectory's ids (the program rewrote history) is refused (409), counted, and ends the
// trajectory there: it keeps what it holds, and the reward still closes it.
//
// Bad calls get a 4xx with an OpenAI-style JSON error naming the field (param) and are counted in
// stats(); the run goes on. The endpoint is token-protected like the run's other planes (bearer).
//
// Threading: everything (server, trajectories, agent client) lives on one io_context, the worker
// pool's (arlo run: the network thread); run() and every handler run there.
#include <boost/asio/io_context.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/http.h"
#include "common/metrics.h"
#include "config/config.h"
#include "rollout/admin.h"
#include "rollout/inference_pool.h"
#include "session/adapters/agent_inference.h"

namespace arlo::session {

struct GatewayOptions {
  std::string bind = "127.0.0.1";
  std::uint16_t port = 0;         // 0: any free port
  std::string token;              // the run's token: calls must send it as a bearer; given to the program as api_key
  std::string agent_url;          // where the agent program takes {"task", "trajectory", "base_url", ...}
  std::vector<std::string> envs;  // task environments the program drives (empty: every task)
  // How long a program may take for one trajectory when the request has no deadline of its own.
  std::chrono::milliseconds agent_timeout{std::chrono::minutes(10)};
  // How long one model call may take (0: up to the trajectory's deadline). A call past it gets a 504
  // naming its trajectory, is counted (call_timeouts), and the trajectory goes on.
  std::chrono::milliseconds call_timeout{0};
  // Trajectories in flight at once (orchestrator.max_inflight): the client to the agent program keeps
  // as many idle connections (one per trajectory's request), and start() checks that this process may
  // open the descriptors they hold.
  std::size_t max_inflight = 64;
  std::string model;  // the model name sent to the workers ("" lets them pick)
  rollout::AdminDialect server = rollout::AdminDialect::kArlo;
  std::size_t max_body_bytes = 4u << 20;
  std::size_t remember_closed = 4096;  // closed trajectory ids remembered (a late call: 409, not 404)
};

// What the gateway counted since it started (read on its thread).
struct GatewayStats {
  std::uint64_t trajectories = 0;         // opened
  std::uint64_t calls = 0;                // model calls recorded
  std::uint64_t unknown_trajectory = 0;   // 404: no such trajectory (or none named: 400)
  std::uint64_t closed_trajectory = 0;    // 409: the trajectory had ended
  std::uint64_t malformed = 0;            // 400: the body or a field is wrong
  std::uint64_t busy = 0;                 // 409: another call of the trajectory was in flight
  std::uint64_t rewrites = 0;             // 409: the prompt did not extend the trajectory (it ended there)
  std::uint64_t stop_tokens_dropped = 0;  // a turn's final stop token the next prompt left out (not trained)
  std::uint64_t call_failures = 0;        // 502/504: the pool could not answer
  std::uint64_t call_timeouts = 0;        // 504: a call ran past call_timeout (its trajectory went on)
  std::uint64_t agent_failures = 0;       // trajectories whose program failed, timed out or answered garbage
};

// Whether the configuration serves the gateway (gateway.enabled, or gateway.agent_url set), and its
// options from the gateway section (the token, model and server are the run's: the caller's).
bool gateway_enabled(const config::Config& cfg);
GatewayOptions gateway_options(const config::Config& cfg);

class Gateway final : public adapters::AgentRunner {
 public:
  // `pool` must outlive the gateway and live on `io`.
  Gateway(boost::asio::io_context& io, rollout::InferencePool& pool, GatewayOptions options);
  ~Gateway() override;
  Gateway(const Gateway&) = delete;
  Gateway& operator=(const Gateway&) = delete;

  // Binds (refused off loopback without a token) and serves; returns the port. Raises the open-file
  // limit to its hard limit first, and refuses (kResourceExhausted) when that cannot hold the
  // descriptors max_inflight trajectories need.
  Result<std::uint16_t> start();
  void close();
  std::uint16_t port() const;
  // http://<bind>:<port>
  std::string url() const;

  // An agent program in-process instead of one at agent_url (a verifiers environment: its server's
  // client): it takes the job the HTTP program would get ({"task", "trajectory", "base_url",
  // "api_key", "sampling", ...}) and the trajectory's deadline, and answers the reward. It drives the
  // tasks of environment `env` (a task's env: the source's name with env.sources), one program per
  // env, replacing the one set before for it; with agent_url, the HTTP program takes the others it
  // handles.
  using Program = std::function<Awaitable<Result<double>>(nlohmann::json job, std::chrono::steady_clock::time_point)>;
  void set_program(std::string env, Program program) { programs_[std::move(env)] = std::move(program); }

  bool handles(const Task& task) const override;
  Awaitable<Result<orch::GenerateResult>> run(orch::GenerateRequest request) override;
  GatewayStats stats() const { return stats_; }
  // Also counts into `registry` (gateway/<counter>, on /metrics) from now on; null: stats() only.
  void count_into(metrics::Registry* registry) { registry_ = registry; }

  struct Trajectory;  // gateway.cc

 private:
  Awaitable<http::Response> handle(http::Request request, bool chat);
  Awaitable<http::Response> call(std::string id, http::Request request, bool chat);
  Awaitable<Result<double>> ask_agent(std::shared_ptr<const Task> task, std::string id,
                                      std::chrono::steady_clock::time_point deadline, SamplingParams sampling);
  void count(std::uint64_t& field, std::uint64_t n = 1);
  http::Response refuse(std::uint64_t& counter, int status, std::string message, std::string param);
  void forget(const std::string& id);

  boost::asio::io_context& io_;
  rollout::InferencePool& pool_;
  GatewayOptions options_;
  http::Server server_;
  http::Client client_;
  std::unordered_map<std::string, std::unique_ptr<Trajectory>> open_;
  std::unordered_set<std::string> closed_;
  std::deque<std::string> closed_order_;
  std::uint64_t next_id_ = 0;
  GatewayStats stats_;
  metrics::Registry* registry_ = nullptr;
  // The in-process program of `task`'s env, or null.
  const Program* program_for(const Task& task) const;

  std::map<std::string, Program> programs_;  // env -> its in-process program (set_program)
};

}  // namespace arlo::session
