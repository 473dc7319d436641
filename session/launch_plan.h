#pragma once
// What an `arlo run` starts and how workers fetch weights, derived from the configuration: the
// argv of each arlo-worker and of arlo-trainer (ports, model shape, seeds, weight_sync endpoint),
// the worker URLs, and the per-version weight update the WeightWatcher sends to every worker.
// Only this file knows the flags of arlo-worker and arlo-trainer (docs/reference-policy.md).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "common/result.h"
#include "session/launcher.h"
#include "rollout/admin.h"

namespace arlo::session::adapters {
class TrainerCollective;
}

namespace arlo::session {

// A worker's part in one update round of a chain (weight_sync.topology chain).
struct ChainRole {
  std::optional<std::size_t> upstream;  // the worker whose relay it pulls from; none: the trainer's publisher
  bool relays = false;                  // it serves the next worker that receives in this round
};

// Worker `worker`'s role in a chain round where receiving[j] says whether worker j (plan order)
// receives the version in it: it pulls from the nearest receiving worker before it (a relay that
// died, is left out or already holds the version is skipped) and relays when a receiving worker
// comes after it. A worker that does not receive in the round, or whose update already failed once
// in it (`retry`: its upstream may have died mid-transfer), pulls from the trainer, whose publisher
// serves a late receiver at any time.
ChainRole chain_role(std::size_t worker, const std::vector<bool>& receiving, bool retry);

// The run's weight-sync blocks (weight_sync/wire.h), derived from the weight_sync config section and
// the transport's descriptor; nothing here knows a transport by name.
struct WeightSyncPlan {
  nlohmann::json block;     // shared keys and the transport's config keys
  std::string weights_dir;  // weight_sync.dir, absolute (what a new run claims)
  bool chain = false;       // weight_sync.topology chain: each worker relays to the next
  // In a chain, per worker (plan order): the params that make it relay (the transport's relay_at:
  // embedded workers on a free loopback port, external ones on weight_sync.relay_port + k of their
  // URL's host) and the endpoint the next worker then pulls from. Whether a worker relays and whom
  // it pulls from is decided per round (ChainRole) and sent with each update.
  std::vector<std::pair<nlohmann::json, nlohmann::json>> relays;
  // A collective transport (nccl): every update joins the workers and the trainer's publisher in
  // one group through this session (describe() hands it the announcement of each round's version).
  std::shared_ptr<adapters::TrainerCollective> collective;

  // The update the WeightWatcher sends `worker` (index into LaunchPlan::workers) for `version` on
  // servers that can take what `server` says (inference.kind's dialect): {version, weight_sync: the
  // receiver block}, plus extra.model_path for a durable transport when the server takes_model_path;
  // a collective transport: the session. `announced` is the trainer's announcement of `version`
  // (its weight_sync block, weight_sync/wire.h); without one, the planned block is used as is. In a chain, `role` is
  // the worker's part in this round (none: the whole chain receives; worker k pulls from worker k-1 and relays unless
  // it is last).
  rollout::WeightUpdate describe(std::size_t worker, std::int64_t version, const rollout::ServerCapabilities& server,
                                 const nlohmann::json& announced = nlohmann::json::object(),
                                 std::optional<ChainRole> role = std::nullopt) const;
  // The block a trainer publishes with: what arlo-trainer gets with --weight-sync and a
  // `trainer.launch: command` trainer in ARLO_WEIGHT_SYNC.
  nlohmann::json trainer_block(int num_workers) const;
};

struct LaunchPlan {
  std::vector<std::pair<std::string, std::string>> workers;  // (name, base url) in order
  std::vector<ChildSpec> worker_specs;                       // embedded inference only
  WeightSyncPlan weight_sync;
  std::string token;  // the run's token (run_token())
};

// Picks free loopback ports for embedded workers (and their relays in a chain) and fills the plan.
// `run_dir` is absolute. Fails for combinations the transport cannot serve (a chain over one that
// does not relay, a device transport with arlo-worker).
Result<LaunchPlan> plan_launch(const config::Config& cfg, const std::string& run_dir);

// The run's token (common/auth.h): security.token, else security.token_file, else $ARLO_TOKEN /
// $ARLO_TOKEN_FILE, else, when this run starts every part (embedded workers, a trainer it launches),
// a fresh one written to <run_dir>/token (mode 0600); else "" (no token). Sets $ARLO_TOKEN in
// this process so every child inherits it (never argv). Call after the run directory is claimed.
Result<std::string> run_token(const config::Config& cfg, const std::string& run_dir);

// The Python interpreter of arlo's helper processes (monitors, the reference trainer, embedded vLLM): `configured`
// (monitors.python, trainer.python) where set, else $ARLO_PYTHON, else the environment
// scripts/bootstrap --python made in the source tree (known at build time).
std::string project_python(const std::string& configured);

// The trainer's checkpoint interval in steps: trainer.ckpt_interval, else ckpt.interval (a resume
// needs both sides' checkpoints); 0: none.
std::int64_t trainer_ckpt_interval(const config::Config& cfg);

// The arlo-trainer child; `bridge_port` is the socket transport's bound port (0 for dir).
ChildSpec trainer_spec(const config::Config& cfg, const std::string& run_dir, const WeightSyncPlan& ws, int num_workers,
                       std::uint16_t bridge_port);

// The model's shape from `cfg` as arlo-worker and arlo-trainer take it (--layers, --hidden, --heads,
// --context).
std::vector<std::string> model_flags(const config::Config& cfg);

// The flags that give arlo-trainer the run's settings from `cfg`: the model (--seed and its shape),
// the optimizer, the importance-sampling correction and the sampling temperature. trainer_spec
// passes them; so does whoever starts a trainer by hand as `arlo run` would (tests/cluster).
std::vector<std::string> trainer_settings_flags(const config::Config& cfg);

}  // namespace arlo::session
