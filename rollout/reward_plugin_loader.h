#pragma once
// Loads a reward plugin (include/arlo/reward_plugin.h) with dlopen and adapts it to RewardModule.
//
// Ownership: the returned module shares ownership of the library handle and the plugin instance
// with every score() call in progress, so a call abandoned after a timeout can still return safely;
// the instance is destroyed and the library closed only when the last holder lets go.
#include <memory>
#include <optional>
#include <string>

#include "common/result.h"
#include "rollout/reward.h"

namespace arlo::rollout {

// Errors: kNotFound (library or entry point missing), kMismatch (ABI version differs: rebuild the
// plugin against this arlo's header), kInvalidArgument (create() refused the config).
Result<std::unique_ptr<RewardModule>> load_reward_plugin(const std::string& path, const std::string& config,
                                                         std::optional<std::string> name = std::nullopt);

}  // namespace arlo::rollout
