#pragma once
// env.kind verifiers in a run (docs/environments.md, "verifiers environments"): verifiers' environment
// server, started by arlo from the project's Python (env.verifiers_launch embedded: a supervised
// child on a loopback port; restarted when it dies) or reached at env.verifiers_address (external),
// and the policy gateway's in-process agent program (Gateway::set_program) that runs each trajectory
// as one episode on it: the run request's model client is the trajectory's gateway URL, so every
// model call the environment makes is recorded token-in/token-out; the episode's reward closes the
// trajectory. An episode the server fails, or that fails all its model calls, fails its group with
// the reason; the gateway counts it (agent_failures) and the run goes on.
//
// Threading: built and started on the run's loop; program() runs on the gateway's thread (the
// network thread); server_died() may be called from any thread.
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "common/async/coro.h"
#include "common/result.h"
#include "config/config.h"
#include "session/adapters/verifiers_client.h"
#include "session/gateway.h"
#include "session/launcher.h"

namespace arlo::session {

class VerifiersEnv {
 public:
  static constexpr const char* kChild = "verifiers-env";               // the embedded server's child name
  static constexpr const char* kApiKeyVar = "ARLO_VERIFIERS_API_KEY";  // the gateway's token, for the server

  // Whether the run has verifiers tasks (env.kind verifiers).
  static bool wanted(const config::Config& cfg);
  // Reads env.verifiers_*; embedded: picks the loopback port. `token`: the run's (the gateway wants it).
  static Result<std::unique_ptr<VerifiersEnv>> create(const config::Config& cfg, std::string token);

  // Embedded: the server's child (the project's Python running python/arlo_verifiers_server.py).
  std::optional<ChildSpec> child() const;
  // Completes when the server answers a health request, or at `deadline` with why not.
  Awaitable<Status> wait_ready(std::chrono::steady_clock::time_point deadline);
  // The gateway's program: one episode per trajectory.
  Gateway::Program program();
  // The server died: the episodes it held fail (their groups fail, counted); a restarted server
  // takes the next ones at the same address.
  std::size_t server_died(const std::string& reason);
  const std::string& address() const { return address_; }
  adapters::VerifiersClient& client() { return *client_; }

 private:
  VerifiersEnv() = default;
  Awaitable<Result<double>> episode(nlohmann::json job, std::chrono::steady_clock::time_point deadline);
  std::string address_;
  bool embedded_ = true;
  nlohmann::json env_config_;  // verifiers' EnvConfig
  int concurrency_ = 0;
  std::string python_path_;
  std::string token_;
  std::unique_ptr<adapters::VerifiersClient> client_;
};

// The episode request for one gateway job ({"task", "trajectory", "base_url", "sampling", ...}):
// task_data is the task's prompt (text, or its messages) with task.info.verifiers merged over it.
adapters::VerifiersRunRequest verifiers_run_request(const nlohmann::json& job);

}  // namespace arlo::session
