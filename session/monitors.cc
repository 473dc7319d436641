#include "session/monitors.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/async/coro.h"
#include "common/file.h"
#include "common/log.h"
#include "session/launch_plan.h"

namespace arlo::session {

namespace {

namespace fs = std::filesystem;

// A monitor is restarted for as long as a run lasts, unless it keeps dying at once.
constexpr RestartLimits kMonitorRestarts{10, std::chrono::minutes(10), std::chrono::milliseconds(500),
                                         std::chrono::seconds(30)};

// A monitor's own settings, from monitors.<kind>_* (the helper's --options).
nlohmann::json monitor_options(const config::Config& cfg, const std::string& kind, const std::string& run_dir) {
  if (kind == "tensorboard") return {{"dir", cfg.string("monitors.tensorboard_dir")}};
  return {{"project", cfg.string("monitors.wandb_project")},
          {"entity", cfg.string("monitors.wandb_entity")},
          {"name", cfg.string("monitors.wandb_name")},
          {"mode", cfg.string("monitors.wandb_mode")},
          {"tags", cfg.strings("monitors.wandb_tags")},
          {"dir", cfg.string("monitors.wandb_dir")},
          {"config_path", (fs::path(run_dir) / "monitors" / "config.yaml").string()}};
}

}  // namespace

std::vector<ChildSpec> monitor_specs(const config::Config& cfg, const std::string& run_dir) {
  std::vector<ChildSpec> specs;
  for (const auto& kind : cfg.strings("monitors.use")) {
    ChildSpec spec;
    spec.name = "monitor-" + kind;
    spec.argv = {project_python(cfg.string("monitors.python")),
                 ARLO_MONITOR_SCRIPT,
                 "--kind",
                 kind,
                 "--run-dir",
                 run_dir,
                 "--options",
                 monitor_options(cfg, kind, run_dir).dump()};
    spec.env = {{"PYTHONUNBUFFERED", "1"}, {"OMP_NUM_THREADS", "1"}, {"WANDB_SILENT", "true"}};
    specs.push_back(std::move(spec));
  }
  return specs;
}

Monitors::Monitors(boost::asio::io_context& io, std::vector<ChildSpec> specs)
    : specs_(std::move(specs)),
      clock_(io.get_executor()),
      supervisor_(io, clock_, [this](const SupervisionEvent& e) { on_event(e); }) {}

Monitors::~Monitors() { finished_ = true; }

Status Monitors::start() {
  if (specs_.empty()) return ok();
  const auto& python = specs_.front().argv.at(0);
  if (::access(python.c_str(), X_OK) != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("monitors: no Python interpreter at {}: `scripts/bootstrap --python` creates the "
                                  "project's environment (make test does), or set monitors.python or $ARLO_PYTHON",
                                  python));
  supervisor_.use_restart_argv(true);  // a monitor has none: it starts again as it first did
  for (const auto& spec : specs_) {
    ARLO_TRY(supervisor_.start(spec, Supervision{kMonitorRestarts, std::nullopt, {}}));
    restarts_[spec.name] = 0;
  }
  return ok();
}

// The log lines of what the supervisor saw; a monitor's end never stops the run.
void Monitors::on_event(const SupervisionEvent& e) {
  if (finished_) return;
  switch (e.kind) {
    case SupervisionEventKind::kRestarting:
      ARLO_WARN(
          "arlo run: {}; its last lines:\n{}; restarting it in {:.1f} s (the run goes on; it catches up from "
          "where it was)",
          e.exit->describe(), e.last_lines, std::chrono::duration<double>(e.delay).count());
      break;
    case SupervisionEventKind::kGaveUp:
      if (e.gave_up == GaveUpReason::kRestartFailed) {
        ARLO_ERROR("arlo run: {}; the run goes on without it", e.reason);
      } else {
        ARLO_ERROR(
            "arlo run: {}; its last lines:\n{}, after {} restarts within {} s: given up, the run goes on "
            "without it",
            e.exit->describe(), e.last_lines, e.max_restarts,
            std::chrono::duration_cast<std::chrono::seconds>(e.window).count());
      }
      break;
    case SupervisionEventKind::kStarted:
      if (e.restarted) {
        ++restarts_[e.name];
        ARLO_INFO("arlo run: {} restarted", e.name);
      }
      break;
    default: break;
  }
}

void Monitors::finish(std::chrono::seconds grace) {
  if (finished_) return;
  finished_ = true;
  if (specs_.empty()) return;
  ARLO_INFO("arlo run: monitors: logging the last records and the summary (up to {} s)", grace.count());
  supervisor_.stop(grace);
}

}  // namespace arlo::session
