// arlo: the command-line interface. Wires arguments to the subcommands in commands.h and
// run_command.h; the work itself lives there.
#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <vector>

#include "apps/arlo/commands.h"
#include "apps/arlo/run_command.h"

int main(int argc, char** argv) {
  CLI::App app{"arlo: asynchronous reinforcement learning for language models"};
  app.set_version_flag("--version", std::string("arlo ") + ARLO_VERSION);
  app.require_subcommand(1);

  arlo::cli::ConfigArgs check;
  auto* check_cmd =
      app.add_subcommand("check-config", "Validate a config; print it resolved, or every problem (exit 2)");
  check_cmd->add_option("file", check.file, "YAML config file")->required();
  check_cmd->add_option("--set", check.overrides, "Override a key: section.key=value (repeatable)");

  std::optional<std::string> doc_output;
  auto* doc_cmd = app.add_subcommand("config-doc", "Print the configuration reference (docs/configuration.md)");
  doc_cmd->add_option("--output,-o", doc_output, "Write to this file instead of stdout");

  std::string bench_name;
  auto* bench_cmd =
      app.add_subcommand("bench", "Run the benchmark binary arlo-bench-NAME with the remaining arguments");
  bench_cmd->add_option("name", bench_name, "Benchmark name (e.g. weight-sync)")->required();
  bench_cmd->prefix_command();

  arlo::cli::RunArgs run;
  auto* run_cmd = app.add_subcommand("run", "Run training with a config");
  run_cmd->add_option("config", run.config, "YAML config file")->required();
  run_cmd->add_option("--set", run.overrides, "Override a key: section.key=value (repeatable)");
  run_cmd->add_flag("--resume", run.resume, "Continue from the run directory's last checkpoint");
  run_cmd
      ->add_flag("--overwrite", run.overwrite,
                 "Start over in a run directory that holds a previous run (removes its checkpoints, batches, "
                 "weights and metrics)")
      ->excludes("--resume");

  arlo::cli::ReportArgs report;
  auto* report_cmd = app.add_subcommand("report", "Write one HTML report (and PNG charts) of one or more run dirs");
  report_cmd->add_option("run_dirs", report.run_dirs, "Run directories (each holds metrics.jsonl)")->required();
  report_cmd->add_option("--output,-o", report.output, "The HTML file to write; the PNGs go next to it")
      ->capture_default_str();

  arlo::cli::ReplayArgs replay;
  auto* replay_cmd = app.add_subcommand(
      "replay",
      "Score a run's stored rollouts (RUN_DIR/rollouts.jsonl) again with a reward config, without generating");
  replay_cmd->add_option("run_dir", replay.run_dir, "Run directory (holds rollouts.jsonl)")->required();
  replay_cmd->add_option("--config", replay.config, "YAML config (default: RUN_DIR/resolved_config.yaml)");
  replay_cmd->add_option("--set", replay.overrides, "Override a key: section.key=value (repeatable)");
  replay_cmd->add_option("--output,-o", replay.output,
                         "Per-sample old and new rewards (default: RUN_DIR/replay.jsonl)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version end parsing "successfully"; real usage errors exit 2 like config errors.
    const int status = app.exit(e);
    return status == 0 ? arlo::cli::kExitOk : arlo::cli::kExitBadConfig;
  }

  if (*check_cmd) return arlo::cli::check_config(check);
  if (*doc_cmd) return arlo::cli::config_doc(doc_output);
  if (*bench_cmd) return arlo::cli::bench(bench_name, bench_cmd->remaining());
  if (*run_cmd) return arlo::cli::run_command(run);
  if (*report_cmd) return arlo::cli::report(report);
  if (*replay_cmd) return arlo::cli::replay(replay);
  return arlo::cli::kExitFailure;
}
