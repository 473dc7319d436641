// External arlo-workers under `arlo run` (inference.launch: external), started by the test as a
// user would, from another seed than the trainer's model: arlo waits until they answer /health
// (they start only after arlo said it waits), gives them the trainer's v0 before any rollout, and
// the run ends with every worker serving the trainer's final weights (its checksum). One restarted
// by its user between two updates is synced again before the next update.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "testing/process.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// `arlo run configs/quickstart.yaml` with two external arlo-workers on loopback ports (over tcp),
// which the test starts once arlo waits for them.
class ExternalRun {
 public:
  ExternalRun(const std::string& name, int steps, std::string transport = "tcp")
      : steps_(steps), transport_(std::move(transport)) {
    const char* src = std::getenv("ARLO_SOURCE_DIR");
    EXPECT_NE(src, nullptr);
    const std::string config = std::string(src ? src : ".") + "/configs/quickstart.yaml";
    auto resolved = arlo::config::resolve_file(config, {});
    EXPECT_TRUE(resolved.config.has_value());
    if (resolved.config) {
      const auto& cfg = *resolved.config;
      model_ = {std::to_string(cfg.integer("model.layers")), std::to_string(cfg.integer("model.hidden")),
                std::to_string(cfg.integer("model.heads")), std::to_string(cfg.integer("model.context"))};
    }
    dir = arlo::e2e::fresh_temp_dir("arlo-e2e-external-" + name);
    log = dir / "arlo.log";
    for (auto& p : ports) p = arlo::e2e::free_loopback_port();
    const std::string urls = "[\"" + url(0) + "\", \"" + url(1) + "\"]";
    arlo = arlo::e2e::spawn_logged(
        arlo::e2e::arlo_run_argv(
            ARLO_BINARY, config,
            {"run.dir=" + (dir / "run").string(), "log.progress=false", "status.port=0",
             "run.max_steps=" + std::to_string(steps), "orchestrator.sft_warmup_steps=4", "eval.interval=0",
             "weight_sync.transport=" + transport_, "inference.launch=external", "inference.urls=" + urls}),
        log);
  }
  ~ExternalRun() {
    for (pid_t w : workers) {
      ::kill(w, SIGTERM);
      ::waitpid(w, nullptr, 0);
    }
    if (arlo > 0 && !ended_) {
      ::kill(arlo, SIGKILL);
      ::waitpid(arlo, nullptr, 0);
    }
    if (!::testing::Test::HasFailure()) fs::remove_all(dir);
  }

  std::string url(int i) const { return "http://127.0.0.1:" + std::to_string(ports[i]); }
  // Worker i starts from seed 7: its own v0 is not the trainer's (model.seed). Its log: worker<i>.<n>.log.
  pid_t start_worker(int i) {
    std::vector<std::string> w = {
        ARLO_WORKER_BINARY,
        "--bind",
        "127.0.0.1",
        "--port",
        std::to_string(ports[i]),
        "--init-seed",
        "7",
        "--seed",
        std::to_string(100 + i),
        "--threads",
        "1",
        "--layers",
        model_[0],
        "--hidden",
        model_[1],
        "--heads",
        model_[2],
        "--context",
        model_[3],
        "--weight-sync",
        R"({"transport": ")" + transport_ + R"(", "peer_name": "external-)" + std::to_string(i) + R"("})"};
    if (transport_ == "filesystem") w.insert(w.end(), {"--allow-weights-from", (dir / "run" / "weights").string()});
    const auto worker_log = dir / ("worker" + std::to_string(i) + "." + std::to_string(++starts_[i]) + ".log");
    const pid_t pid = arlo::e2e::spawn_logged(w, worker_log);
    if (static_cast<std::size_t>(i) < workers.size())
      workers[i] = pid;
    else
      workers.push_back(pid);
    return pid;
  }
  fs::path worker_log(int i) const {
    return dir / ("worker" + std::to_string(i) + "." + std::to_string(starts_[i]) + ".log");
  }
  std::vector<nlohmann::json> syncs() const {
    std::vector<nlohmann::json> out;
    for (auto& r : arlo::e2e::read_jsonl(dir / "run" / "metrics.jsonl"))
      if (r.value("kind", "") == "weight_sync" && r.value("applied", false)) out.push_back(std::move(r));
    return out;
  }
  // Waits for arlo run to end; its output.
  std::string wait_end(int& status) {
    ::waitpid(arlo, &status, 0);
    ended_ = true;
    return arlo::e2e::read_text(log);
  }
  // The end every run of these tests reaches: steps trained, every worker on the trainer's final weights.
  void expect_every_worker_on_the_final_version() const {
    const auto summary = nlohmann::json::parse(arlo::e2e::read_text(dir / "run" / "summary.json"));
    EXPECT_TRUE(summary.at("ok").get<bool>()) << summary.dump(2);
    EXPECT_EQ(summary.at("steps").get<int>(), steps_);
    const auto& trainer = summary.at("trainer");
    ASSERT_EQ(trainer.at("version").get<std::int64_t>(), steps_) << summary.dump(2);
    ASSERT_EQ(summary.at("workers").size(), 2u) << summary.dump(2);
    for (const auto& [name, w] : summary.at("workers").items()) {
      EXPECT_EQ(w.at("version").get<std::int64_t>(), steps_) << name;
      EXPECT_EQ(w.at("checksum"), trainer.at("checksum")) << name;  // the trainer's weights, not seed 7's
    }
  }

  fs::path dir, log;
  int ports[2] = {0, 0};
  pid_t arlo = -1;
  std::vector<pid_t> workers;

 private:
  int steps_;
  std::string transport_;
  std::vector<std::string> model_ = {"2", "64", "4", "64"};
  int starts_[2] = {0, 0};
  bool ended_ = false;
};

TEST(ExternalWorkersE2E, AreHealthWaitedGivenV0AndEndOnTheFinalVersion) {
  ExternalRun run("waited", 8);
  ASSERT_GT(run.arlo, 0);
  ASSERT_TRUE(arlo::e2e::wait_for_text(run.log, "to answer /health", run.arlo, 60s)) << arlo::e2e::read_text(run.log);
  for (int i = 0; i < 2; ++i) ASSERT_GT(run.start_worker(i), 0);
  int status = 0;
  const std::string output = run.wait_end(status);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << arlo::e2e::tail(output);
  // They were waited for, not tried and left out.
  EXPECT_NE(output.find("2 worker(s) healthy"), std::string::npos);
  EXPECT_EQ(output.find("left out of updates"), std::string::npos) << output;
  run.expect_every_worker_on_the_final_version();
  // v0 went to both workers before anything else.
  const auto syncs = run.syncs();
  ASSERT_FALSE(syncs.empty());
  EXPECT_EQ(syncs.front().at("version").get<std::int64_t>(), 0) << syncs.front().dump();
  int ok = 0;
  for (const auto& w : syncs.front().at("workers")) ok += w.value("ok", false);
  EXPECT_EQ(ok, 2) << syncs.front().dump();
}

// A user restarts an external server between two updates, and no update fails meanwhile (the trainer
// is stopped, so there is none; over filesystem its versions can still be read): the restarted process serves its own
// seeded weights. The pool sees it answer again, the WeightWatcher asks what it holds and syncs the current version to
// it before the trainer makes another one, so no rollout runs on weights the run never had.
TEST(ExternalWorkersE2E, OneRestartedBetweenUpdatesIsSyncedAgainBeforeTheNextUpdate) {
  ExternalRun run("restarted", 24, "filesystem");  // the versions stay on disk while the trainer is stopped
  ASSERT_GT(run.arlo, 0);
  ASSERT_TRUE(arlo::e2e::wait_for_text(run.log, "to answer /health", run.arlo, 60s)) << arlo::e2e::read_text(run.log);
  for (int i = 0; i < 2; ++i) ASSERT_GT(run.start_worker(i), 0);
  // Past the warm-up, stop the trainer: no version comes until it continues.
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  while (run.syncs().empty() || run.syncs().back().at("version").get<std::int64_t>() < 6) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << arlo::e2e::tail(arlo::e2e::read_text(run.log));
    std::this_thread::sleep_for(20ms);
  }
  const pid_t trainer = arlo::e2e::child_with_arg(run.arlo, "arlo-trainer");
  ASSERT_GT(trainer, 0);
  ASSERT_EQ(::kill(trainer, SIGSTOP), 0);
  ::kill(run.workers[1], SIGKILL);
  ::waitpid(run.workers[1], nullptr, 0);
  ASSERT_TRUE(arlo::e2e::wait_for_text(run.log, "circuit open for " + run.url(1), run.arlo, 60s))
      << arlo::e2e::tail(arlo::e2e::read_text(run.log));
  ASSERT_GT(run.start_worker(1), 0);  // a new process on the same port, holding its seed-7 v0
  // It is given the synced version while the trainer is still stopped.
  ASSERT_TRUE(arlo::e2e::wait_for_text(run.worker_log(1), "serving weights v", run.workers[1], 60s))
      << arlo::e2e::tail(arlo::e2e::read_text(run.log));
  std::smatch m;
  const std::string worker_output = arlo::e2e::read_text(run.worker_log(1));
  ASSERT_TRUE(std::regex_search(worker_output, m, std::regex("serving weights v([0-9]+)"))) << worker_output;
  EXPECT_EQ(std::stoll(m[1]), run.syncs().back().at("version").get<std::int64_t>());
  const std::string before = arlo::e2e::read_text(run.log);
  // It was restarted unseen (asked after its circuit closed), or had failed a round and was probed back.
  EXPECT_TRUE(before.find(run.url(1) + " answers again and holds v0") != std::string::npos ||
              before.find(run.url(1) + " answers again (it holds") != std::string::npos)
      << arlo::e2e::tail(before);
  ASSERT_EQ(::kill(trainer, SIGCONT), 0);
  int status = 0;
  const std::string output = run.wait_end(status);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << arlo::e2e::tail(output);
  run.expect_every_worker_on_the_final_version();
}

}  // namespace
