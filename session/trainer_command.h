#pragma once
// `trainer.launch: command`: arlo run starts the user's own trainer (trainer.command, e.g. a PyTorch
// script using arlo.bridge, python/arlo/bridge.py) as its "trainer" child, after the bridge server started, and
// tells it where everything is through its environment (docs/bring-your-own-trainer.md):
//   ARLO_RUN_DIR           the run directory (absolute)
//   ARLO_BRIDGE_TRANSPORT  dir | socket
//   ARLO_BRIDGE_ADDRESS    socket: "host:port" the bridge listens on; dir: empty
//   ARLO_WEIGHT_SYNC       the weight-sync block to publish with, as JSON (hand it to the bridge as is)
//   ARLO_MODEL             {"layers", "hidden", "heads", "context", "seed"} from model.*, as JSON
//   OMP_NUM_THREADS, MKL_NUM_THREADS  trainer.threads
// The command runs in the directory arlo run was started in; relative paths in it are relative to it.
#include <cstdint>
#include <string>

#include "session/launch_plan.h"
#include "config/config.h"
#include "session/launcher.h"

namespace arlo::session {

// The child of a command trainer. `bridge_port` is the socket bridge's bound port (unused for dir).
ChildSpec command_trainer_spec(const config::Config& cfg, const std::string& run_dir, const WeightSyncPlan& ws,
                               int num_workers, std::uint16_t bridge_port);

}  // namespace arlo::session
