#pragma once
// Which weight sources a /weights/prepare block may name (WorkerOptions: the worker's own block,
// --allow-weights-from), and how a block's sources are named in messages.
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "apps/arlo-worker/worker_server.h"
#include "weight_sync/weight_sync.h"

namespace arlo::worker {

// The network addresses an endpoint object names ("10.0.0.2:29500"), comma-separated; "" when none.
std::string addresses_of(const nlohmann::json& endpoint);

// Whether the update block `block` (resolved into `o`) names only sources this worker allows (see
// WorkerOptions); the error is the 403 to answer.
std::optional<std::string> refused_source(const nlohmann::json& block, const weight_sync::Options& o,
                                          const WorkerOptions& w);

}  // namespace arlo::worker
