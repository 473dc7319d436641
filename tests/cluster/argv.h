// The command lines of the parts a cluster test starts by hand, each on a simulated host of its own,
// as `arlo run` would start them there: the settings from the config by the very functions `arlo run`
// uses (session::trainer_settings_flags, session::model_flags). Needs ARLO_TRAINER_BINARY and
// ARLO_WORKER_BINARY (arlo_process_test with PROGRAMS arlo-trainer arlo-worker).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "session/launch_plan.h"

namespace arlo::cluster {

// The trainer's command line: its files under `run_dir`, its bridge at `bridge_host`:`bridge_port`
// (where the orchestrator listens), one thread, publishing weights with the block `weight_sync`.
inline std::vector<std::string> trainer_argv(const config::Config& cfg, const std::string& run_dir,
                                             const std::string& bridge_host, int bridge_port,
                                             const nlohmann::json& weight_sync) {
  std::vector<std::string> argv = {ARLO_TRAINER_BINARY, "--run-dir", run_dir, "--threads", "1", "--bridge", "socket"};
  argv.insert(argv.end(), {"--bridge-host", bridge_host, "--bridge-port", std::to_string(bridge_port)});
  argv.insert(argv.end(), {"--weight-sync", weight_sync.dump()});
  const auto settings = session::trainer_settings_flags(cfg);
  argv.insert(argv.end(), settings.begin(), settings.end());
  return argv;
}

// An arlo-worker's command line: serving on `address`:`port`, the model's shape from `cfg`, v0 from
// `init_seed`, sampling seed 100 + `index`, one thread, named worker-<index> in its weight-sync block
// of `transport`. The caller adds where it may take weights from (--allow-weights-from).
inline std::vector<std::string> worker_argv(const config::Config& cfg, const std::string& address, int port, int index,
                                            const std::string& init_seed, const std::string& transport) {
  const nlohmann::json block = {{"transport", transport}, {"peer_name", "worker-" + std::to_string(index)}};
  std::vector<std::string> argv = {ARLO_WORKER_BINARY, "--bind", address, "--port", std::to_string(port)};
  argv.insert(argv.end(), {"--init-seed", init_seed, "--seed", std::to_string(100 + index), "--threads", "1"});
  argv.insert(argv.end(), {"--weight-sync", block.dump()});
  const auto model = session::model_flags(cfg);
  argv.insert(argv.end(), model.begin(), model.end());
  return argv;
}

}  // namespace arlo::cluster
