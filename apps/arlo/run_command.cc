// `arlo run`: the command line around session::RunSession. Loads and validates the configuration,
// sets up logging, creates the session (which prepares the run directory, the launch plan and the
// run's token) and runs it; turns its outcome into the last line and the exit status.
#include "apps/arlo/run_command.h"

#include <cstdio>

#include "apps/arlo/commands.h"
#include "config/config.h"
#include "common/log.h"
#include "session/run_session.h"

namespace arlo::cli {

namespace {

// Logging as the configuration says (log.level, log.file), before anything else is logged.
Status init_logging(const config::Config& cfg) {
  log::Options lo;
  lo.level = cfg.string("log.level");
  if (!cfg.string("log.file").empty()) lo.file = cfg.string("log.file");
  return log::init(lo);
}

// The run's last line (stdout when it finished, stderr otherwise) and the process exit status.
int report_outcome(const session::RunOutcome& o, const std::string& run_dir) {
  switch (o.end) {
    case session::RunOutcome::End::kFinished:
      std::fprintf(stdout, "arlo run: finished %lld step(s) in %.1f s; run dir %s\n", static_cast<long long>(o.steps),
                   o.seconds, run_dir.c_str());
      return kExitOk;
    case session::RunOutcome::End::kStopped:
      std::fprintf(stderr, "arlo run: stopped by %s after %lld step(s); run dir %s\n", o.stop_reason.c_str(),
                   static_cast<long long>(o.steps), run_dir.c_str());
      return kExitFailure;
    case session::RunOutcome::End::kFailed: break;
  }
  std::fprintf(stderr, "arlo run: %s\n", o.error.c_str());
  return kExitFailure;
}

}  // namespace

int run_command(const RunArgs& args) {
  const auto loaded = load_config_or_report("arlo run", args.config, args.overrides, "; nothing was started");
  if (!loaded) return kExitBadConfig;
  const config::Config& cfg = *loaded;
  if (auto st = init_logging(cfg); !st) {
    std::fprintf(stderr, "arlo run: %s\n", st.error().what().c_str());
    return kExitBadConfig;
  }
  auto run = session::RunSession::create(cfg, {.resume = args.resume, .overwrite = args.overwrite});
  if (!run) {
    std::fprintf(stderr, "arlo run: %s\n", run.error().what().c_str());
    return kExitBadConfig;
  }
  ARLO_INFO("arlo run: {} -> {}", args.config, (*run)->run_dir());
  return report_outcome((*run)->run(), (*run)->run_dir());
}

}  // namespace arlo::cli
