// `arlo replay RUN_DIR [--config CONFIG] [--set k=v]... [-o OUT]`: scores the run's stored rollouts
// again with a reward configuration and compares (session/replay.h does the work).
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "apps/arlo/commands.h"
#include "session/replay.h"
#include "session/rollout_parts.h"

namespace arlo::cli {

namespace fs = std::filesystem;

namespace {

// Progress on stderr, at most once a second, and at the end.
struct Progress {
  std::chrono::steady_clock::time_point last{};
  void operator()(std::size_t done, std::size_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (done < total && now - last < std::chrono::seconds(1)) return;
    last = now;
    std::fprintf(stderr, "replay: %zu/%zu groups scored\n", done, total);
  }
};

}  // namespace

int replay(const ReplayArgs& args) {
  const fs::path dir(args.run_dir);
  const auto rollouts = dir / "rollouts.jsonl";
  if (!fs::is_regular_file(rollouts)) {
    std::fprintf(stderr, "replay: %s: no such file (is %s a run directory? log.rollouts_every 0 writes none)\n",
                 rollouts.c_str(), args.run_dir.c_str());
    return kExitBadConfig;
  }
  const auto config = args.config ? fs::path(*args.config) : dir / session::kRunConfigFile;
  if (!args.config && !fs::is_regular_file(config)) {
    std::fprintf(stderr, "replay: %s: no such file (a run before arlo wrote it?): pass --config CONFIG\n",
                 config.c_str());
    return kExitBadConfig;
  }
  const auto cfg = load_config_or_report("replay", config.string(), args.overrides, "; nothing was scored");
  if (!cfg) return kExitBadConfig;
  auto module = session::build_reward(*cfg);
  if (!module) {
    std::fprintf(stderr, "replay: %s: %s\n", config.c_str(), module.error().what().c_str());
    return kExitBadConfig;
  }
  session::ReplayOptions options;
  options.rollouts = rollouts.string();
  options.output = args.output ? *args.output : (dir / "replay.jsonl").string();
  options.progress = Progress{};
  auto summary = session::replay_rollouts(std::move(*module), session::replay_scorer_options(*cfg), options);
  if (!summary) {
    std::fprintf(stderr, "replay: %s\n", summary.error().what().c_str());
    return summary.error().code() == ErrorCode::kInvalidArgument || summary.error().code() == ErrorCode::kNotFound
               ? kExitBadConfig
               : kExitFailure;
  }
  for (const auto& w : summary->warnings) std::fprintf(stderr, "replay: warning: %s\n", w.c_str());
  const auto text = session::format_replay_summary(*summary);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::printf("replay: wrote %s\n", options.output.c_str());
  return kExitOk;
}

}  // namespace arlo::cli
