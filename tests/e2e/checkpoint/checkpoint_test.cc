// The orchestrator-trainer checkpoint protocol (docs/checkpoints.md) under faults, through real
// processes: `arlo run` (one arlo-worker, arlo-trainer) is killed with SIGKILL at each point of the
// crash window, killed from outside, stopped with SIGTERM, or runs out of disk space, and then
// `arlo run --resume` finishes it. The run is made deterministic (one worker, one group in flight,
// async level 0, seeded sampling, single-threaded libtorch), so an uninterrupted run of the same
// configuration is the reference: after the fault and the resume, the trainer's final weights must
// have exactly the reference's checksum and lineage (the digest of the batch each step 1..N was
// trained on). That holds only if every step was applied exactly once, in order, to batches cut
// from the same data positions (no task batched twice, none lost). Every batch the trainer ever
// trained for step s, before or after the fault (trainer_metrics.jsonl), must also be the one in
// the lineage: a step redone after a crash is redone on the very same batch.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "testing/process.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int kSteps = 12;  // steps 1..6 supervised, 7..12 GRPO
constexpr int kWarmup = 6;
constexpr auto kRunDeadline = std::chrono::seconds(100);

std::string read_file(const fs::path& p) { return arlo::e2e::read_text(p); }

std::string tail(const std::string& s) { return s.size() > 5000 ? s.substr(s.size() - 5000) : s; }

fs::path scratch(const std::string& name) {
  return fs::temp_directory_path() / ("arlo_ckpt_e2e_" + name + "_" + std::to_string(::getpid()));
}

std::vector<std::string> run_args(const fs::path& run_dir, bool resume) {
  const char* src = std::getenv("ARLO_SOURCE_DIR");
  const std::vector<std::string> sets = {"run.dir=" + run_dir.string(),
                                         "log.progress=false",
                                         "status.port=0",
                                         "run.max_steps=" + std::to_string(kSteps),
                                         "orchestrator.sft_warmup_steps=6",
                                         "eval.interval=0",
                                         "inference.num_workers=1",
                                         "orchestrator.max_async_level=0",
                                         "orchestrator.max_inflight=8",
                                         "orchestrator.batch_size=16",
                                         "ckpt.interval=4",
                                         "weight_sync.transport=filesystem"};
  auto args = arlo::e2e::arlo_run_argv(ARLO_BINARY, std::string(src ? src : ".") + "/configs/quickstart.yaml", sets);
  if (resume) args.push_back("--resume");
  return args;
}

// A started `arlo run`; env: "NAME=value" entries the child gets on top of ours. Its output goes to
// `log`, by default next to the run dir (`<run dir>.log`, `<run dir>.resume.log`).
struct Arlo {
  pid_t pid = -1;
  fs::path log;
};

Arlo start(const fs::path& run_dir, bool resume, const std::vector<std::pair<std::string, std::string>>& env = {},
           fs::path log = {}) {
  for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
  Arlo a;
  a.log = log.empty() ? fs::path(run_dir.string() + (resume ? ".resume.log" : ".log")) : std::move(log);
  a.pid = arlo::e2e::spawn_logged(run_args(run_dir, resume), a.log);
  for (const auto& [k, v] : env) ::unsetenv(k.c_str());
  return a;
}

// Waits for the process (bounded: SIGKILL past the deadline) and every process whose command line
// names the run dir (its children, which die with it), so the next run starts on a quiet dir.
int finish(const Arlo& a, const fs::path& run_dir) {
  int status = 0;
  const auto end = Clock::now() + kRunDeadline;
  while (::waitpid(a.pid, &status, WNOHANG) == 0) {
    if (Clock::now() > end) {
      ::kill(a.pid, SIGKILL);
      ::waitpid(a.pid, &status, 0);
      ADD_FAILURE() << "arlo run did not end within " << kRunDeadline.count() << " s:\n" << tail(read_file(a.log));
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const auto quiet = Clock::now() + std::chrono::seconds(30);
  for (bool found = true; found && Clock::now() < quiet;) {
    found = false;
    std::error_code ec;
    for (const auto& p : fs::directory_iterator("/proc", ec)) {
      const auto name = p.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::string cmd = read_file(p.path() / "cmdline");
      for (auto& c : cmd)
        if (c == '\0') c = ' ';
      if (cmd.find(run_dir.string() + " ") != std::string::npos ||
          cmd.find(run_dir.string() + "/") != std::string::npos)
        found = true;
    }
    if (found) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return status;
}

bool exited_ok(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

// True once `pred` holds; false at the deadline or when `pid` exited.
template <typename Pred>
bool wait_until(Pred pred, pid_t pid, std::chrono::seconds timeout = kRunDeadline) {
  const auto end = Clock::now() + timeout;
  while (Clock::now() < end) {
    if (pred()) return true;
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid)
      return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

std::int64_t trainer_latest(const fs::path& run_dir) {
  std::ifstream in(run_dir / "checkpoints" / "trainer" / "latest");
  std::int64_t s = -1;
  return in >> s ? s : -1;
}

// What the trainer's newest checkpoint holds.
struct TrainerState {
  std::int64_t step = -1;
  std::vector<std::string> lineage;
};

TrainerState trainer_state(const fs::path& run_dir) {
  TrainerState t;
  t.step = trainer_latest(run_dir);
  if (t.step < 0) return t;
  const auto j =
      json::parse(read_file(run_dir / "checkpoints" / "trainer" / ("step_" + std::to_string(t.step)) / "state.json"),
                  nullptr, false);
  if (j.is_object() && j.contains("lineage")) t.lineage = j["lineage"].get<std::vector<std::string>>();
  return t;
}

std::vector<json> trained_lines(const fs::path& run_dir) {
  std::vector<json> out;
  std::ifstream in(run_dir / "trainer_metrics.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

json summary_of(const fs::path& run_dir) {
  const auto text = read_file(run_dir / "summary.json");
  return text.empty() ? json::object() : json::parse(text);
}

struct Reference {
  std::vector<std::string> lineage;
  std::string checksum;
};

// The uninterrupted run.
Reference reference(const std::string& name) {
  const auto dir = scratch(name + "_ref");
  fs::remove_all(dir);
  const auto a = start(dir, false);
  const int status = finish(a, dir);
  EXPECT_TRUE(exited_ok(status)) << "reference run: status " << status << "\n" << tail(read_file(a.log));
  Reference r{trainer_state(dir).lineage, summary_of(dir).value("trainer", json::object()).value("checksum", "")};
  EXPECT_EQ(r.lineage.size(), static_cast<std::size_t>(kSteps));
  EXPECT_FALSE(r.checksum.empty());
  fs::remove_all(dir);
  fs::remove(a.log);
  return r;
}

// After the fault and the resume: the run finished all its steps, the weights are the reference's,
// and every batch ever trained for a step is the one the final weights hold for it. Returns how
// many step trainings were redone (trained more than once over the run's lives).
int expect_same_as_reference(const fs::path& run_dir, const Reference& ref, const Arlo& resumed, int status) {
  EXPECT_TRUE(exited_ok(status)) << "arlo run --resume: status " << status << "\n" << tail(read_file(resumed.log));
  const auto summary = summary_of(run_dir);
  EXPECT_TRUE(summary.value("ok", false)) << summary.dump(2);
  EXPECT_EQ(summary.value("steps", 0), kSteps);
  const auto state = trainer_state(run_dir);
  EXPECT_EQ(state.step, kSteps);
  // The supervised steps' batches depend only on the data position: they must be the reference's.
  // (The GRPO batches depend on sampling, which is not bit-for-bit repeatable across runs here.)
  EXPECT_EQ(state.lineage.size(), static_cast<std::size_t>(kSteps));
  if (state.lineage.size() != static_cast<std::size_t>(kSteps) ||
      ref.lineage.size() != static_cast<std::size_t>(kSteps))
    return -1;
  for (int s = 0; s < kWarmup; ++s)
    EXPECT_EQ(state.lineage[static_cast<std::size_t>(s)], ref.lineage[static_cast<std::size_t>(s)])
        << "step " << s + 1 << " was trained on another batch than in the uninterrupted run";
  int lines = 0;
  for (const auto& l : trained_lines(run_dir)) {
    ++lines;
    const auto s = l.at("step").get<std::int64_t>();
    EXPECT_TRUE(s >= 1 && s <= kSteps) << l.dump();
    if (s >= 1 && static_cast<std::size_t>(s) <= state.lineage.size()) {
      EXPECT_EQ(l.at("batch").get<std::string>(), state.lineage[static_cast<std::size_t>(s - 1)])
          << "step " << s << " was once trained on another batch: " << l.dump();
    }
  }
  // A trainer killed after its checkpoint of a step but before logging it leaves that one step
  // without a line (the log is not part of the checkpoint); every other step has one.
  EXPECT_GE(lines, kSteps - 1);
  // Nothing is left waiting: the journal and the trainer's kept batches are empty at the end.
  for (const auto& dir : {run_dir / "orchestrator" / "batches", run_dir / "checkpoints" / "trainer" / "batches"}) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (!e.path().filename().string().starts_with(".")) ADD_FAILURE() << "left behind: " << e.path();
  }
  std::set<std::int64_t> steps;
  for (const auto& l : trained_lines(run_dir)) steps.insert(l.at("step").get<std::int64_t>());
  return lines - static_cast<int>(steps.size());
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One fault test's runs: the uninterrupted reference first, then the faulted run and its --resume
// in a fresh run dir (`dir`: scratch(name) unless given). When the test passed, the run dir and
// every log and marker file of the test are removed at the end; when it failed they stay for a look.
struct FaultedRun {
  Reference ref;
  fs::path dir;
  std::vector<fs::path> files;  // logs and markers, removed at the end

  explicit FaultedRun(const std::string& name, fs::path run_dir = {})
      : ref(reference(name)), dir(run_dir.empty() ? scratch(name) : std::move(run_dir)) {
    fs::remove_all(dir);
  }
  ~FaultedRun() {
    if (::testing::Test::HasFailure()) return;
    fs::remove_all(dir);
    for (const auto& f : files) fs::remove(f);
  }
  // The faulted run, started (start()).
  Arlo start_first(const std::vector<std::pair<std::string, std::string>>& env = {}, fs::path log = {}) {
    auto a = start(dir, false, env, std::move(log));
    files.push_back(a.log);
    return a;
  }
  // True once the trainer checkpointed `step` (or a later one); false when `a` ended first.
  bool trainer_checkpointed(const Arlo& a, std::int64_t step) const {
    return wait_until([&] { return trainer_latest(dir) >= step; }, a.pid);
  }
  // `arlo run --resume` to its end, checked against the reference (expect_same_as_reference);
  // returns how many step trainings were redone.
  int resume(fs::path log = {}) {
    const auto r = start(dir, true, {}, std::move(log));
    files.push_back(r.log);
    const int status = finish(r, dir);
    return expect_same_as_reference(dir, ref, r, status);
  }
};

// kill -9 at one crash point (common/crash_point.h), then --resume.
void crash_then_resume(const std::string& name, const std::string& point, bool kills_arlo) {
  FaultedRun run(name);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const fs::path once = run.dir.string() + ".crashed";
  fs::remove(once);
  run.files.push_back(once);
  const auto t0 = Clock::now();
  const auto a = run.start_first({{"ARLO_CRASH_AT", point}, {"ARLO_CRASH_ONCE", once.string()}});
  const int first = finish(a, run.dir);
  const double crashed_after = seconds_since(t0);
  const std::string out = read_file(a.log);
  ASSERT_TRUE(fs::exists(once)) << "the crash point " << point << " was never reached:\n" << tail(out);
  if (kills_arlo) {
    ASSERT_TRUE(WIFSIGNALED(first) && WTERMSIG(first) == SIGKILL) << "status " << first << "\n" << tail(out);
  } else {
    // The trainer died; the run either stopped with the reason or (supervised) restarted it.
    EXPECT_NE(out.find("crash point " + point), std::string::npos) << tail(out);
  }
  const auto t1 = Clock::now();
  const int redone = run.resume();
  const double resume_s = seconds_since(t1);
  std::printf("%s: first run ended after %.1f s (status %d); resume %.1f s; step trainings redone: %d\n", point.c_str(),
              crashed_after, first, resume_s, redone);
}

// The orchestrator cut step 8 (an RL step) and dies before journaling it: the trainer never saw it;
// the resume cuts it again from the checkpoint of step 7.
TEST(CheckpointFaults, OrchestratorKilledBeforeItsCheckpoint) {
  crash_then_resume("orch_before", "orchestrator.before_checkpoint:8", true);
}

// The orchestrator journaled step 8 and its checkpoint, and dies before the batch left: the resume
// sends the journaled batch, unchanged.
TEST(CheckpointFaults, OrchestratorKilledAfterItsCheckpoint) {
  crash_then_resume("orch_after", "orchestrator.after_checkpoint:8", true);
}

// The trainer trained step 8 and dies before its checkpoint: steps 5..7 (acknowledged, kept) are
// replayed from its copies, step 8 (not acknowledged) comes again from the bridge.
TEST(CheckpointFaults, TrainerKilledBeforeItsCheckpoint) {
  crash_then_resume("trainer_before", "trainer.before_checkpoint:8", false);
}

// The trainer checkpointed step 8 and dies before acknowledging it: it resumes at 8 and drops the
// batch of step 8 when the bridge delivers it again.
TEST(CheckpointFaults, TrainerKilledAfterItsCheckpoint) {
  crash_then_resume("trainer_after", "trainer.after_checkpoint:8", false);
}

// Both killed from outside with kill -9, arlo and the trainer at once, the moment the trainer's
// checkpoint of step 8 appears (wherever the orchestrator is then).
TEST(CheckpointFaults, BothKilledFromOutside) {
  FaultedRun run("both");
  ASSERT_FALSE(HasFailure());
  const auto a = run.start_first();
  ASSERT_TRUE(run.trainer_checkpointed(a, 8)) << tail(read_file(a.log));
  const pid_t trainer = arlo::e2e::child_with_arg(a.pid, "arlo-trainer");
  if (trainer > 0) ::kill(trainer, SIGKILL);
  ::kill(a.pid, SIGKILL);
  const int first = finish(a, run.dir);
  ASSERT_TRUE(WIFSIGNALED(first) && WTERMSIG(first) == SIGKILL) << "status " << first;
  const int redone = run.resume();
  std::printf("both killed at the trainer's checkpoint of step 8: step trainings redone: %d\n", redone);
}

// SIGTERM to `arlo run` once the trainer checkpointed step 4: it stops gracefully (exit 1, "stopped
// by signal 15"), the orchestrator checkpoints, the trainer gets SIGTERM from arlo and checkpoints
// the last step it trained (nothing left to replay), and --resume finishes the run as if uninterrupted.
TEST(CheckpointFaults, SigtermStopsWithACheckpointAndResumes) {
  FaultedRun run("sigterm");
  ASSERT_FALSE(HasFailure());
  const auto& dir = run.dir;
  const auto a = run.start_first();
  ASSERT_TRUE(run.trainer_checkpointed(a, 4)) << tail(read_file(a.log));
  const auto t0 = Clock::now();
  ASSERT_EQ(::kill(a.pid, SIGTERM), 0);
  const int first = finish(a, dir);
  const double stop_s = seconds_since(t0);
  const std::string out = read_file(a.log);
  ASSERT_TRUE(WIFEXITED(first) && WEXITSTATUS(first) == 1) << "status " << first << "\n" << tail(out);
  EXPECT_NE(out.find("stopped by signal 15"), std::string::npos) << tail(out);
  // The trainer's checkpoint holds every step it trained: nothing to replay.
  const auto lines = trained_lines(dir);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(trainer_latest(dir), lines.back().at("step").get<std::int64_t>()) << tail(out);
  std::error_code ec;
  EXPECT_TRUE(fs::is_empty(dir / "checkpoints" / "trainer" / "batches", ec) || ec) << "kept batches after a clean stop";
  const auto cp = json::parse(read_file(dir / "orchestrator" / "checkpoint.json"));
  EXPECT_GE(cp.at("step").get<std::int64_t>(), trainer_latest(dir));
  const int redone = run.resume();
  std::printf("SIGTERM: stopped in %.1f s after step %lld; step trainings redone: %d\n", stop_s,
              static_cast<long long>(lines.back().at("step").get<std::int64_t>()), redone);
  EXPECT_EQ(redone, 0);
}

// The run dir on a small tmpfs that the test fills once the trainer checkpointed step 4: the run
// stops with an error naming the disk ("No space left on device") and the file, the last good
// checkpoints stay readable, and once there is room again --resume finishes the run. Which write
// fails first depends on timing (arlo's journal or checkpoint, the trainer's kept batch, weights or
// version notice: a trainer that fails is restarted until its bound, then the run stops); each must
// stop the run with that reason. arlo's output goes to a log off the tmpfs, where it can be written.
TEST(CheckpointFaults, FullDiskStopsWithAClearErrorAndResumes) {
  const auto mnt = scratch("disk_mnt");
  FaultedRun run("disk", mnt / "run");
  ASSERT_FALSE(HasFailure());
  fs::remove_all(mnt);
  fs::create_directories(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=48m") != 0) {
    const std::string why = std::strerror(errno);
    fs::remove_all(mnt);
    GTEST_SKIP() << "cannot mount a tmpfs at " << mnt << " (" << why << "; the test needs root or CAP_SYS_ADMIN)";
  }
  struct Unmount {
    fs::path p;
    ~Unmount() {
      ::umount2(p.c_str(), MNT_DETACH);
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } unmount{mnt};
  const auto& dir = run.dir;
  const fs::path filler = mnt / "filler";
  // The logs live off the filled disk: what arlo says about the full disk must be readable.
  const auto log_base = scratch("disk");
  const auto a = run.start_first({}, log_base.string() + ".log");
  ASSERT_TRUE(run.trainer_checkpointed(a, 4)) << tail(read_file(a.log));
  {  // fill the disk to the last byte
    std::FILE* f = std::fopen(filler.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::vector<char> block(64 * 1024, 'x');
    while (std::fwrite(block.data(), 1, block.size(), f) == block.size()) {
    }
    std::fclose(f);
    for (std::FILE* g = std::fopen(filler.c_str(), "a"); g != nullptr; g = nullptr) {
      while (std::fputc('x', g) != EOF && std::fflush(g) == 0) {
      }
      std::fclose(g);
    }
  }
  const int first = finish(a, dir);
  const std::string out = read_file(a.log);
  EXPECT_FALSE(exited_ok(first)) << "the run went on with a full disk:\n" << tail(out);
  // The reason arlo exits with (its last line that starts with "arlo run: ", with the last lines of
  // a child it quotes) names the full disk and a file of the run dir on it.
  const auto reason_at = out.rfind("\narlo run: ");
  ASSERT_NE(reason_at, std::string::npos) << "arlo run gave no reason for stopping:\n" << tail(out);
  bool names_disk_and_file = false;
  std::istringstream reason(out.substr(reason_at + 1));
  for (std::string line; std::getline(reason, line);)
    if (line.find("No space left on device") != std::string::npos && line.find(dir.string() + "/") != std::string::npos)
      names_disk_and_file = true;
  EXPECT_TRUE(names_disk_and_file) << "the reason does not name the full disk and the file:\n" << tail(out);
  // The last good checkpoints are whole.
  const auto cp = json::parse(read_file(dir / "orchestrator" / "checkpoint.json"), nullptr, false);
  ASSERT_TRUE(cp.is_object()) << "orchestrator checkpoint unreadable";
  const auto state = trainer_state(dir);
  ASSERT_GE(state.step, 4);
  EXPECT_EQ(state.lineage.size(), static_cast<std::size_t>(state.step));
  std::printf("full disk: the run stopped (status %d); checkpoints: orchestrator step %lld, trainer step %lld\n", first,
              static_cast<long long>(cp.at("step").get<std::int64_t>()), static_cast<long long>(state.step));
  fs::remove(filler);  // room again
  const int redone = run.resume(log_base.string() + ".resume.log");
  std::printf("full disk: resumed; step trainings redone: %d\n", redone);
}

}  // namespace
