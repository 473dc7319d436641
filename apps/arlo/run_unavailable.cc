// `arlo run` in a build without the orchestrator adapters or the tokenizer (see CMakeLists.txt): it
// validates the configuration (so `make run` still catches config mistakes) and says plainly that
// running is not available in this build.
#include "apps/arlo/run_command.h"

#include <cstdio>

#include "apps/arlo/commands.h"
#include "common/config/config.h"

namespace arlo::cli {

int run_command(const RunArgs& args) {
  config::LoadOptions options;
  options.overrides = args.overrides;
  const config::Resolution resolution = config::resolve_file(args.config, options);
  if (!resolution.config) {
    for (const auto& d : resolution.diagnostics) std::fprintf(stderr, "%s\n", d.text().c_str());
    std::fprintf(stderr, "arlo run: %zu problem(s) in %s; nothing was started\n", resolution.diagnostics.size(),
                 args.config.c_str());
    return kExitBadConfig;
  }
  std::fprintf(stderr,
               "arlo run: the configuration %s is valid, but the run command is not available yet: this arlo "
               "was built without the orchestrator. Use `arlo check-config %s` to see the resolved "
               "configuration.\n",
               args.config.c_str(), args.config.c_str());
  return kExitUnavailable;
}

}  // namespace arlo::cli
