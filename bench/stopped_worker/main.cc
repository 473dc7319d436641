// arlo-bench-stopped-worker: does a stopped worker hold the trainer?
//
// Runs the quickstart (`arlo run configs/quickstart.yaml`, tcp weight sync, two arlo-workers,
// arlo-trainer) twice with the same seeds and steps: once as is, once with worker-1 stopped
// (SIGSTOP) from the moment both workers are healthy to the end. Prints, per run, the trainer's
// own time per step from trainer_metrics.jsonl (step_seconds, the compute, plus stage_seconds, how
// long staging the new version held it; waiting for the next batch is not the trainer's step;
// median over the run's RL steps) and
// the run's wall time, then the ratio stopped / baseline against the target (within 10%: at most
// 1.10x), and whether the live worker took every version the orchestrator moved.
//
//   arlo bench stopped-worker [--steps 60] [--repeat 3] [--keep]
//
// The trainer's step is measured as the median over the RL steps of a run, and the runs of each
// kind are compared by their medians: the two workers generating beside the trainer on a small
// machine make single steps (and single runs) noisy.
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "testing/process.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct RunResult {
  bool ok = false;
  std::string error;
  double wall_s = 0;
  double trainer_step_s = 0;  // median over RL steps of step_seconds + stage_seconds
  double stage_s = 0;         // median stage_seconds
  std::size_t steps = 0;
  int syncs = 0;
  int syncs_live_ok = 0;  // syncs a live worker took
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::vector<json> read_jsonl(const fs::path& p) {
  std::vector<json> out;
  std::stringstream in(arlo::e2e::read_text(p));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(json::parse(line, nullptr, false));
  return out;
}

RunResult run(const fs::path& dir, int steps, int warmup, bool stop_one) {
  RunResult r;
  fs::remove_all(dir);
  const fs::path log = dir.string() + ".log";
  std::vector<std::string> args = {ARLO_BINARY, "run", std::string(ARLO_SOURCE_DIR) + "/configs/quickstart.yaml"};
  for (const std::string& s : std::vector<std::string>{
           "run.dir=" + dir.string(), "log.progress=false", "status.port=0", "run.max_steps=" + std::to_string(steps),
           "orchestrator.sft_warmup_steps=" + std::to_string(warmup), "eval.interval=0", "weight_sync.transport=tcp",
           "inference.admin_timeout_s=2"})
    args.insert(args.end(), {"--set", s});
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t arlo = arlo::e2e::spawn_logged(args, log);
  pid_t stopped = -1;
  if (stop_one) {
    if (!arlo::e2e::wait_for_text(log, "worker(s) healthy", arlo, std::chrono::seconds(300))) {
      r.error = "the workers did not become healthy";
    } else if ((stopped = arlo::e2e::child_with_arg(arlo, "\"peer_name\":\"worker-1\"")) > 0) {
      ::kill(stopped, SIGSTOP);
    } else {
      r.error = "worker-1 not found among arlo's children";
    }
  }
  int status = 0;
  ::waitpid(arlo, &status, 0);
  if (stopped > 0) ::kill(stopped, SIGCONT);
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    if (r.error.empty()) r.error = "arlo run failed; see " + log.string();
    return r;
  }
  std::vector<double> step, stage;
  for (const auto& m : read_jsonl(dir / "trainer_metrics.jsonl")) {
    if (!m.is_object() || m.value("step", 0) <= warmup) continue;  // RL steps only
    step.push_back(m.value("step_seconds", 0.0) + m.value("stage_seconds", 0.0));
    stage.push_back(m.value("stage_seconds", 0.0));
  }
  r.steps = step.size();
  if (r.steps == 0) {
    r.error = "no trainer metrics in " + dir.string();
    return r;
  }
  r.trainer_step_s = median(step);
  r.stage_s = median(stage);
  for (const auto& rec : read_jsonl(dir / "metrics.jsonl")) {
    if (!rec.is_object() || rec.value("kind", "") != "weight_sync" || !rec.value("applied", false)) continue;
    ++r.syncs;
    // The stopped worker takes none, so a worker that took it is the live one (in the baseline: any).
    const auto workers = rec.value("workers", json::array());
    r.syncs_live_ok += std::any_of(workers.begin(), workers.end(), [](const json& w) { return w.value("ok", false); });
  }
  r.ok = true;
  fs::remove(log);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"arlo-bench-stopped-worker: the trainer's step time with one of two workers stopped (SIGSTOP)"};
  int steps = 60, warmup = 10, repeat = 3;
  bool keep = false;
  app.add_option("--steps", steps, "steps per run")->check(CLI::Range(warmup + 2, 100000));
  app.add_option("--repeat", repeat, "runs of each kind (the medians are compared)")->check(CLI::Range(1, 20));
  app.add_flag("--keep", keep, "keep the run directories");
  CLI11_PARSE(app, argc, argv);
  const fs::path root = fs::temp_directory_path() / ("arlo-bench-stopped-" + std::to_string(::getpid()));
  fs::create_directories(root);
  std::vector<RunResult> base, stopped;
  for (int i = 0; i < repeat; ++i) {
    base.push_back(run(root / ("base-" + std::to_string(i)), steps, warmup, false));
    stopped.push_back(run(root / ("stopped-" + std::to_string(i)), steps, warmup, true));
  }
  auto median = [](std::vector<RunResult> v) {
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.trainer_step_s < b.trainer_step_s; });
    return v[v.size() / 2];
  };
  std::printf("arlo run configs/quickstart.yaml, tcp, 2 workers, %d steps (%d warm-up), %d run(s) each\n", steps,
              warmup, repeat);
  std::printf("%-22s %10s %16s %14s %12s %18s\n", "run", "wall s", "trainer step ms", "of it stage ms", "syncs",
              "live worker took");
  for (const auto* set : {&base, &stopped}) {
    for (std::size_t i = 0; i < set->size(); ++i) {
      const auto& r = (*set)[i];
      const std::string name = (set == &base ? "both workers #" : "worker-1 stopped #") + std::to_string(i + 1);
      if (!r.ok) {
        std::printf("%-22s FAILED: %s\n", name.c_str(), r.error.c_str());
        continue;
      }
      std::printf("%-22s %10.1f %16.2f %14.3f %12d %18d\n", name.c_str(), r.wall_s, r.trainer_step_s * 1e3,
                  r.stage_s * 1e3, r.syncs, r.syncs_live_ok);
    }
  }
  for (const auto* set : {&base, &stopped})
    for (const auto& r : *set)
      if (!r.ok) return 1;
  const auto b = median(base), s = median(stopped);
  const double ratio = s.trainer_step_s / b.trainer_step_s;
  std::printf("trainer step time, stopped / both: %.3fx (target <= 1.10x: %s)\n", ratio,
              ratio <= 1.10 ? "PASS" : "MISS");
  std::printf("the live worker took %d of %d versions moved with worker-1 stopped: %s\n", s.syncs_live_ok, s.syncs,
              s.syncs_live_ok == s.syncs ? "every one" : "MISSED some");
  std::printf("run wall time, stopped / both: %.2fx (the first update waits out the stopped worker once)\n",
              s.wall_s / b.wall_s);
  std::printf("ratio_vs_baseline=%.3f\n", ratio);
  if (!keep) fs::remove_all(root);
  return 0;
}
