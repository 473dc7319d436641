#pragma once
// The subcommands of the arlo CLI, one function each, so main.cc only wires arguments.
// Each returns the process exit status (see kExit* below).
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"

namespace arlo::cli {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;      // something went wrong while doing the work
constexpr int kExitBadConfig = 2;    // the configuration (or a usage) is invalid; every problem printed
constexpr int kExitUnavailable = 3;  // the command exists but is not available in this build

struct ConfigArgs {
  std::string file;
  std::vector<std::string> overrides;  // "section.key=value"
};

// Loads `file` with `overrides`. On failure prints every problem to stderr, then
// "<command>: N problem(s) in FILE<consequence>", and returns nullopt (callers exit kExitBadConfig).
std::optional<config::Config> load_config_or_report(const std::string& command, const std::string& file,
                                                    const std::vector<std::string>& overrides,
                                                    const std::string& consequence = "");

// Prints the resolved configuration as YAML to stdout, or every problem to stderr (exit 2).
int check_config(const ConfigArgs& args);

// Writes docs/configuration.md generated from the schema to `output`, or to stdout when unset.
int config_doc(const std::optional<std::string>& output);

// Replaces this process with the benchmark binary arlo-bench-<name>, found next to the arlo binary
// or under <build>/bench/*/, passing `args`. When it is missing, lists the benchmarks that exist.
int bench(const std::string& name, const std::vector<std::string>& args);

struct ReportArgs {
  std::vector<std::string> run_dirs;
  std::string output = "report.html";
};

// Writes one self-contained HTML report of the runs to args.output and PNG charts next to it
// (<stem>-reward.png, -eval.png, -loss.png). A run dir that cannot be read is named with the
// problem (file and line for a corrupt metrics.jsonl line) and nothing is written (exit 2).
int report(const ReportArgs& args);

struct ReplayArgs {
  std::string run_dir;
  std::optional<std::string> config;   // default: RUN_DIR/resolved_config.yaml (written by arlo run)
  std::vector<std::string> overrides;  // "section.key=value"
  std::optional<std::string> output;   // default: RUN_DIR/replay.jsonl
};

// Scores the samples of RUN_DIR/rollouts.jsonl again with the configuration's reward modules
// (session/replay.h), prints per module the old and the new mean reward and writes one line per
// sample with both to the output. A missing file, a line that is not a group (named) or a reward
// configuration that cannot be built: exit 2; scoring that fails under reward.on_failure fail: exit 1.
// A build without the session's rollout parts says replay is unavailable (exit 3).
int replay(const ReplayArgs& args);

}  // namespace arlo::cli
