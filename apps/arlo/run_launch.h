#pragma once
// What an `arlo run` starts and how workers fetch weights, derived from the configuration: the
// argv of each arlo-worker and of arlo-trainer (ports, model shape, seeds, weight_sync endpoint),
// the worker URLs, and the per-version weight update the WeightWatcher sends to every worker.
// Only this file knows the flags of arlo-worker and arlo-trainer (docs/reference-policy.md).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/config/config.h"
#include "common/result.h"
#include "orchestrator/launcher.h"
#include "rollout/admin.h"

namespace arlo::cli {

struct WeightSyncPlan {
  std::string transport;  // tcp | shm | filesystem | nccl
  std::string address;    // tcp: the trainer's publisher (host:port)
  std::string shm_name;   // shm
  std::string dir;        // filesystem: <dir>/v<version>/
  std::string payload;    // arlo-trainer/arlo-worker payload name: full | bf16 | fp8 | delta
  std::int64_t timeout_ms = 0;
  // The body extras of POST /weights/prepare (arlo dialect) or the dialect's extras (vllm, sglang).
  // `announced` is what the trainer published with its newest version: its "address", "shm_name"
  // or "dir", when present, win over the planned ones (an external trainer knows where it is).
  rollout::WeightUpdate describe(std::int64_t version, rollout::AdminDialect dialect,
                                 const nlohmann::json& announced = nlohmann::json::object()) const;
  // The weight-sync block a trainer publishes with (weight_sync::options_from_json's form): what
  // arlo-trainer gets with --weight-sync and a `trainer.launch: command` trainer in ARLO_WEIGHT_SYNC.
  nlohmann::json trainer_block(int num_workers) const;
};

struct LaunchPlan {
  std::vector<std::pair<std::string, std::string>> workers;  // (name, base url) in order
  std::vector<orch::ChildSpec> worker_specs;                 // embedded inference only
  WeightSyncPlan weight_sync;
};

// Picks free loopback ports for embedded workers (and the tcp publisher) and fills the plan.
// `run_dir` is absolute. Fails for combinations arlo-worker cannot serve (e.g. nccl).
Result<LaunchPlan> plan_launch(const config::Config& cfg, const std::string& run_dir);

// The arlo-trainer child; `bridge_port` is the socket transport's bound port (0 for dir).
orch::ChildSpec trainer_spec(const config::Config& cfg, const std::string& run_dir, const WeightSyncPlan& ws,
                             int num_workers, std::uint16_t bridge_port);

}  // namespace arlo::cli
