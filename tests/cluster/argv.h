// arlo-trainer started by a cluster test on a simulated host of its own, as `arlo run` would start
// it there: the run's settings from the config by the very function `arlo run` uses
// (session::trainer_settings_flags), its bridge a socket to the orchestrator's host. Needs
// ARLO_TRAINER_BINARY (arlo_process_test with PROGRAMS arlo-trainer).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/config/config.h"
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

}  // namespace arlo::cluster
