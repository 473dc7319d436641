#pragma once
// Loads a reward plugin (include/arlo/reward_plugin.h) with dlopen and adapts it to RewardModule,
// either into this process (isolate: none) or into a child host process (isolate: process, see
// rollout/reward_process.h), where a crash or a hang costs the calls in flight, not the process.
//
// Ownership: the returned module shares ownership of the library handle and the plugin instance
// with every score() call in progress, so a call abandoned after a timeout can still return safely;
// the instance is destroyed and the library closed only when the last holder lets go.
#include <memory>
#include <optional>
#include <string>

#include "common/result.h"
#include "rollout/reward.h"
#include "rollout/reward_process.h"

namespace arlo::rollout {

enum class PluginIsolation { kNone, kProcess };
Result<PluginIsolation> parse_plugin_isolation(std::string_view name);  // none | process

struct PluginOptions {
  PluginIsolation isolate = PluginIsolation::kNone;
  RewardHostOptions host;  // isolate: process only
};

// Errors: kNotFound (library or entry point missing; with isolate: process also the host program),
// kMismatch (ABI version differs: rebuild the plugin against this arlo's header), kInvalidArgument
// (create() refused the config); with isolate: process, kUnavailable when the host died loading it.
Result<std::unique_ptr<RewardModule>> load_reward_plugin(const std::string& path, const std::string& config,
                                                         std::optional<std::string> name = std::nullopt,
                                                         PluginOptions options = {});

}  // namespace arlo::rollout
