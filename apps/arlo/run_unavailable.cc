// `arlo run` in a build without the orchestrator adapters or the tokenizer (see CMakeLists.txt): it
// validates the configuration (so `make run` still catches config mistakes) and says plainly that
// running is not available in this build.
#include "apps/arlo/run_command.h"

#include <cstdio>

#include "apps/arlo/commands.h"

namespace arlo::cli {

int run_command(const RunArgs& args) {
  if (!load_config_or_report("arlo run", args.config, args.overrides, "; nothing was started")) return kExitBadConfig;
  std::fprintf(stderr,
               "arlo run: the configuration %s is valid, but the run command is not available yet: this arlo "
               "was built without the orchestrator. Use `arlo check-config %s` to see the resolved "
               "configuration.\n",
               args.config.c_str(), args.config.c_str());
  return kExitUnavailable;
}

int replay(const ReplayArgs&) {
  std::fprintf(stderr,
               "arlo replay: not available: this arlo was built without the orchestrator and reward modules.\n");
  return kExitUnavailable;
}

}  // namespace arlo::cli
