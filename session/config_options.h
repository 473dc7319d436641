#pragma once
// Maps the loaded configuration (config/) onto the orchestrator's Options: the only place
// that knows config key names. Sections read: run, orchestrator, sampling, eval, inference, ckpt,
// log, status, weight_sync.
#include "config/config.h"
#include "common/result.h"
#include "orchestrator/options.h"

namespace arlo::session {

// Fails (kInvalidArgument, citing the config location) when the values are inconsistent.
Result<orch::Options> options_from_config(const config::Config& cfg);
// An env.sources item's name (its tasks' env): its `name`, else its kind.
std::string source_name(const config::Config& item);

}  // namespace arlo::session
