#pragma once
// `arlo run CONFIG [--set k=v]... [--resume]`. Kept apart from the other subcommands so the
// orchestrator can replace this one file (run_command.cc) without touching the CLI wiring.
#include <string>
#include <vector>

namespace arlo::cli {

struct RunArgs {
  std::string config;                  // path of the YAML config
  std::vector<std::string> overrides;  // "section.key=value"
  bool resume = false;                 // continue from the run directory's last checkpoint
  bool overwrite = false;              // start over in a run directory that holds a previous run
};

// Returns the process exit status.
int run_command(const RunArgs& args);

}  // namespace arlo::cli
