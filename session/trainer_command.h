#pragma once
// `trainer.launch: command` (or `hf`, arlo's reference trainer examples/hf_trainer/train.py for
// trainer.model, its flags from trainer.*): arlo run starts the user's own trainer (trainer.command, e.g. a PyTorch
// script using arlo.bridge, python/arlo/bridge.py) as its "trainer" child, after the bridge server started, and
// tells it where everything is through its environment (docs/bring-your-own-trainer.md):
//   ARLO_RUN_DIR           the run directory (absolute)
//   ARLO_BRIDGE_TRANSPORT  dir | socket
//   ARLO_BRIDGE_ADDRESS    socket: "host:port" the bridge listens on; dir: empty
//   ARLO_WEIGHT_SYNC       the weight-sync block to publish with, as JSON (hand it to the bridge as is)
//   ARLO_MODEL             {"layers", "hidden", "heads", "context", "seed"} from model.*, as JSON
//   ARLO_RANK, ARLO_NUM_RANKS  this rank and trainer.num_ranks (the bridge splits each step's batch
//                          over the ranks; rank 0 publishes the weights)
//   RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT  the same for torch.distributed's env://
//                          rendezvous (a free loopback port: the ranks run on this machine)
//   OMP_NUM_THREADS, MKL_NUM_THREADS  trainer.threads
// The command runs in the directory arlo run was started in; relative paths in it are relative to it.
#include <cstdint>
#include <string>
#include <vector>

#include "session/launch_plan.h"
#include "config/config.h"
#include "session/launcher.h"

namespace arlo::session {

// The children of a command (or hf) trainer, one per rank ("trainer", or "trainer-<rank>" for several).
// `bridge_port` is the socket bridge's bound port (unused for dir).
Result<std::vector<ChildSpec>> command_trainer_specs(const config::Config& cfg, const std::string& run_dir,
                                                     const WeightSyncPlan& ws, int num_workers,
                                                     std::uint16_t bridge_port);

}  // namespace arlo::session
