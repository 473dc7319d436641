#include "session/server_support.h"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "rollout/admin.h"
#include "weight_sync/transport.h"

namespace arlo::session {

namespace {

namespace ws = arlo::weight_sync;

bool moves(const ws::Capabilities& c, ws::Device::Kind kind) {
  return std::find(c.devices.begin(), c.devices.end(), kind) != c.devices.end();
}

// The server joins one collective with the trainer (an NCCL group) and receives the broadcast.
bool collective(const ws::Capabilities& c) { return c.collective; }

// Why a server of this kind cannot take weights over a transport with these capabilities in
// `build`; empty when it can.
std::string refusal(const rollout::ServerCapabilities& server, const ws::Capabilities& c, const BuildSupport& build) {
  if (collective(c) && !build.nccl)
    return "this arlo was built without NCCL, so it cannot join an NCCL group (rebuild where CUDA and NCCL are "
           "installed: cmake -DARLO_WITH_NCCL=ON finds them under CUDA_HOME or /usr/local/cuda)";
  if (collective(c) && !server.joins_collective)
    return fmt::format(
        "{} does not join a collective weight-transfer group (its admin dialect takes arlo's own "
        "streams and files)",
        server.title);
  if (server.host_memory && !moves(c, ws::Device::Kind::kCpu))
    return fmt::format("{} holds its weights in host memory, which this transport does not move (it moves GPU memory)",
                       server.title);
  if (c.durable && !server.loads_durable)
    return fmt::format(
        "{} has no admin route that loads a version from its directory into a running server, so "
        "it would keep serving its first weights",
        server.title);
  if (!c.durable && !collective(c) && !server.streams)
    return fmt::format("{} cannot receive arlo's own weight stream (only arlo-worker speaks it)", server.title);
  return {};
}

}  // namespace

BuildSupport this_build() {
  BuildSupport b;
#ifdef ARLO_WEIGHT_SYNC_NCCL  // weight_sync's NCCL backend is compiled in (CMake found CUDA and NCCL)
  b.nccl = true;
#endif
  return b;
}

Status check_inference_support(const config::Config& cfg, const BuildSupport& build) {
  const std::string& kind = cfg.string("inference.kind");
  auto dialect = rollout::find_admin_dialect(kind);
  if (!dialect)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("inference.kind {} ({}): not a server arlo drives; use {}", kind,
                                  cfg.where("inference.kind"), join_names(entry_names(rollout::admin_dialects()))));
  const rollout::ServerCapabilities* server = &(*dialect)->server;
  ARLO_ASSIGN_OR_RETURN(const auto* d, ws::find_transport(cfg.string("weight_sync.transport")));
  const std::string servers_of = fmt::format("inference.kind {} ({})", kind, cfg.where("inference.kind"));

  std::string problems;  // one line each
  auto add = [&problems](const std::string& line) {
    if (!problems.empty()) problems += '\n';
    problems += line;
  };
  if (const std::string why = refusal(*server, d->capabilities, build); !why.empty()) {
    std::string use;        // the registered transports this server takes in this build
    std::string with_nccl;  // ... and those it would take in a build with NCCL
    for (const auto& t : ws::transports()) {
      if (refusal(*server, t.capabilities, build).empty())
        use += (use.empty() ? "" : " or ") + t.name;
      else if (refusal(*server, t.capabilities, BuildSupport{true}).empty())
        with_nccl += (with_nccl.empty() ? "" : " or ") + t.name;
    }
    const std::string instead =
        !use.empty() ? "use weight_sync.transport " + use
        : !with_nccl.empty()
            ? fmt::format(
                  "no transport of this build serves {}: rebuild with NCCL (cmake -DARLO_WITH_NCCL=ON) and "
                  "use weight_sync.transport {}",
                  server->title, with_nccl)
            : fmt::format("no registered transport serves {}", server->title);
    add(fmt::format("weight_sync.transport {} ({}) with {}: {}; {}", d->name, cfg.where("weight_sync.transport"),
                    servers_of, why, instead));
  }
  if (cfg.string("weight_sync.topology") == "chain" && !server->relays)
    add(fmt::format(
        "weight_sync.topology chain ({}) with {}: {} servers do not relay a version to the next one; use topology "
        "star{}",
        cfg.where("weight_sync.topology"), servers_of, server->title,
        collective(d->capabilities) ? " (one broadcast reaches every server of the group)" : ""));
  if (problems.empty()) return ok();
  return make_error(ErrorCode::kInvalidArgument, problems);
}

}  // namespace arlo::session
