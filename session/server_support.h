#pragma once
// Which inference servers a configuration can drive with its weight_sync transport: the
// combinations that cannot run are refused before anything starts (`arlo check-config` and
// `plan_launch`), each with the reason and what to use instead. Nothing here knows a transport or a
// server by name: the transport descriptor's capabilities (weight_sync/transport.h) and the admin
// dialect's (rollout::ServerCapabilities, in its registry entry) decide. docs/vllm.md and
// docs/sglang.md describe the combinations that do run.
#include "config/config.h"
#include "common/result.h"

namespace arlo::session {

// What this build of arlo can do that a configuration may ask for.
struct BuildSupport {
  bool nccl = false;  // built with NCCL: collective transports can join a GPU group
};
// The running binary's build.
BuildSupport this_build();

// ok() when the inference servers (inference.kind), the weight_sync transport and its topology can
// run together in `build`; otherwise kInvalidArgument with one line per problem: the keys involved
// (where each was set), why it cannot run, and the alternative. Every
// orchestrator.weight_update_mode runs on every server kind (SGLang has no wait mode: arlo drains
// first, rollout/admin.h), so none is refused here.
Status check_inference_support(const config::Config& cfg, const BuildSupport& build = this_build());

}  // namespace arlo::session
