// plugin: a shared library through the C ABI (include/arlo/reward_plugin.h), in process or isolated.
#include "rollout/reward.h"
#include "rollout/reward_plugin_loader.h"

namespace arlo::rollout {

namespace {
Result<std::unique_ptr<RewardModule>> make(const RewardSpec& s) {
  const std::string path = s.options["path"].get<std::string>();
  if (path.empty()) return make_error(ErrorCode::kInvalidArgument, "reward 'plugin': needs 'path' to a shared library");
  std::string config;
  if (s.options.contains("config"))
    config = s.options["config"].is_string() ? s.options["config"].get<std::string>() : s.options["config"].dump();
  PluginOptions po;
  ARLO_ASSIGN_OR_RETURN(po.isolate, parse_plugin_isolation(s.options["isolate"].get<std::string>()));
  po.host.call_timeout =
      std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s.options["timeout_s"].get<double>()));
  return load_reward_plugin(path, config, s.named ? std::optional<std::string>(s.name) : std::nullopt, po);
}
}  // namespace

RewardKind plugin_reward() {
  return {"plugin",
          "a shared library (include/arlo/reward_plugin.h)",
          {string_option("path", "", "path of the shared library.").user_key().must_be_given(),
           any_option("config", "settings handed to the plugin (a string, or JSON text of anything else)"),
           string_option("isolate", "none",
                         "process (loaded in its own arlo-reward-host process: a crash or hang costs the groups in "
                         "flight, the host is restarted) or none (loaded into arlo: a crash ends the run).")
               .one_of({"none", "process"})
               .user_key("process"),
           float_option("timeout_s", 30.0, "isolate process: deadline of one call (arlo run: reward.timeout_s)")},
          true,
          make};
}

}  // namespace arlo::rollout
