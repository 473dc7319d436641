#pragma once
// A verifiers environment in a run (docs/environments.md, "verifiers environments"): verifiers'
// environment server, started by arlo from the project's Python (verifiers_launch embedded: a
// supervised child on a loopback port; restarted when it dies) or reached at verifiers_address (external),
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
#include <vector>

#include "common/async/coro.h"
#include "common/result.h"
#include "config/config.h"
#include "session/adapters/verifiers_client.h"
#include "session/gateway.h"
#include "session/launcher.h"

namespace arlo::session {

// One verifiers environment a run needs: the envs whose tasks it runs, and its options.
struct VerifiersSource {
  std::vector<std::string> envs;  // the tasks' env names it drives (a source's name; "verifiers")
  std::string child;              // its embedded server's child name (unique in the run)
  std::string where;              // where its options are, for errors: "env" or "env.sources[i].options"
  nlohmann::json options;         // the verifiers kind's options (verifiers_env, ...), defaults filled in
};

// The verifiers environments of a run (docs/environments.md, "verifiers environments"):
// env.kind verifiers: one (envs {"verifiers"}, child "verifiers-env", the env.verifiers_* keys);
// each env.sources item of kind verifiers: its own (envs {its name}, child "verifiers-env-<name>",
// its options); eval.env_kind verifiers (eval.interval > 0): eval.env_path's tasks (env "verifiers")
// on the environment of the env.verifiers_* keys, the one a source or env.kind already runs when
// its options are the same (else its own, child "verifiers-env": the env.verifiers_* keys'
// environment, as with env.kind verifiers; a source's child is never that). A source named "verifiers"
// with other options is refused then: both would be env "verifiers".
Result<std::vector<VerifiersSource>> verifiers_sources(const config::Config& cfg);

class VerifiersEnv {
 public:
  static constexpr const char* kChild = "verifiers-env";               // the embedded server's child name
  static constexpr const char* kApiKeyVar = "ARLO_VERIFIERS_API_KEY";  // the gateway's token, for the server

  // Reads the source's verifiers_* options; embedded: picks the loopback port. `token`: the run's
  // (the gateway wants it).
  static Result<std::unique_ptr<VerifiersEnv>> create(VerifiersSource source, std::string token);

  // Embedded: the server's child (the project's Python running python/arlo_verifiers_server.py).
  std::optional<ChildSpec> child() const;
  // Completes when the server answers a health request, or after its verifiers_start_timeout_s
  // with why not.
  Awaitable<Status> wait_ready();
  // The gateway's program: one episode per trajectory.
  Gateway::Program program();
  // The server died: the episodes it held fail (their groups fail, counted); a restarted server
  // takes the next ones at the same address.
  std::size_t server_died(const std::string& reason);
  const std::string& address() const { return address_; }
  const VerifiersSource& source() const { return source_; }
  adapters::VerifiersClient& client() { return *client_; }

 private:
  VerifiersEnv() = default;
  Awaitable<Result<double>> episode(nlohmann::json job, std::chrono::steady_clock::time_point deadline);
  VerifiersSource source_;
  std::string address_;
  bool embedded_ = true;
  nlohmann::json env_config_;  // verifiers' EnvConfig
  int concurrency_ = 0;
  double start_timeout_s_ = 120;
  std::string python_path_;
  std::string token_;
  std::unique_ptr<adapters::VerifiersClient> client_;
};

// The episode request for one gateway job ({"task", "trajectory", "base_url", "sampling", ...}):
// task_data is the task's prompt (text, or its messages) with task.info.verifiers merged over it.
adapters::VerifiersRunRequest verifiers_run_request(const nlohmann::json& job);

}  // namespace arlo::session
