// Restarts with real processes. The orchestrator side runs here on an io_context thread; the
// trainer is arlo_bridge_test_trainer (C, on libarlo_bridge.so), whose log is its checkpoint.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "tests/temp_dir.h"
#include "trainer_bridge/bridge.h"
#include "trainer_bridge/server_thread.h"

namespace arlo::bridge {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

StepBatch make_step(std::int64_t step) {
  std::vector<Sample> samples;
  for (int i = 0; i < 4; ++i) {
    Sample s;
    s.prompt_tokens.assign(5, static_cast<std::int32_t>(i));
    s.completion_tokens.assign(7, static_cast<std::int32_t>(step));
    s.completion_logprobs.assign(7, -1.0f);
    s.token_versions.assign(7, static_cast<std::int32_t>(step - 1));
    samples.push_back(std::move(s));
  }
  return std::move(*pack(step, samples, {.seq_len = 32}));
}

pid_t spawn_trainer(const std::string& config, const fs::path& log, std::int64_t last, std::int64_t die_at = -1) {
  std::vector<std::string> args{ARLO_BRIDGE_TEST_TRAINER, config, log.string(), std::to_string(last)};
  if (die_at >= 0) args.push_back(std::to_string(die_at));
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

int wait_status(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

std::vector<std::int64_t> trained(const fs::path& log) {
  std::vector<std::int64_t> steps;
  std::ifstream in(log);
  std::string word;
  std::int64_t s = 0;
  while (in >> word >> s) steps.push_back(s);
  return steps;
}

class Restart : public ::testing::TestWithParam<std::string> {
 protected:
  void start_server(std::uint16_t port = 0) {
    ServerOptions o;
    o.transport = GetParam();
    o.run_dir = run_dir_.path();
    o.port = port;
    o.max_pending_batches = 4;
    o.heartbeat_timeout = 60s;  // a dead trainer closes its socket; slowness must never drop it
    auto started = loop_.start(o, [this](BridgeServer& server) {
      server.on_ack([this](std::int64_t step) {
        std::lock_guard lock(mu_);
        acks_.push_back(step);
        cv_.notify_all();
      });
      server.on_version([this](VersionEvent v) {
        std::lock_guard lock(mu_);
        versions_.push_back(v.version);
        cv_.notify_all();
      });
    });
    ASSERT_TRUE(started) << started.error().what();
  }
  Status send(std::int64_t step) { return loop_.send(make_step(step)); }
  std::string config() const {
    return GetParam() == "dir" ? R"({"transport":"dir","run_dir":")" + run_dir_.path().string() + "\"}"
                               : R"({"transport":"socket","port":)" + std::to_string(loop_.port()) +
                                     R"(,"heartbeat_interval_ms":100,"heartbeat_timeout_ms":60000})";
  }
  bool wait_acked(std::int64_t step) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, 30s, [&] { return !acks_.empty() && acks_.back() >= step; });
  }

  test_files::TempDir run_dir_{"arlo_bridge_restart"};
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::int64_t> acks_, versions_;
  ServerThread loop_;  // last: destroyed first, its server with it, before what the callbacks use
};

TEST_P(Restart, TrainerKilledMidBatchGetsItAgainAndTrainsItOnce) {
  start_server();
  for (int s = 1; s <= 4; ++s) ASSERT_TRUE(send(s));
  const fs::path log = run_dir_.path() / "trainer.log";
  const int first = wait_status(spawn_trainer(config(), log, 4, /*die_at=*/2));
  ASSERT_TRUE(WIFSIGNALED(first) && WTERMSIG(first) == SIGKILL) << "status " << first;
  EXPECT_EQ(trained(log), (std::vector<std::int64_t>{1}));
  const int second = wait_status(spawn_trainer(config(), log, 4));
  ASSERT_TRUE(WIFEXITED(second) && WEXITSTATUS(second) == 0) << "status " << second;
  EXPECT_EQ(trained(log), (std::vector<std::int64_t>{1, 2, 3, 4}));
  ASSERT_TRUE(wait_acked(4));
  std::unique_lock lock(mu_);
  EXPECT_EQ(acks_, (std::vector<std::int64_t>{1, 2, 3, 4}));
  // The trainer announces v4 after acking step 4.
  ASSERT_TRUE(cv_.wait_for(lock, 30s, [&] { return !versions_.empty() && versions_.back() == 4; }));
  EXPECT_TRUE(std::is_sorted(versions_.begin(), versions_.end()));
}

TEST_P(Restart, TrainerReconnectsAfterOrchestratorRestart) {
  start_server();
  const fs::path log = run_dir_.path() / "trainer.log";
  const pid_t trainer = spawn_trainer(config(), log, 3);
  ASSERT_TRUE(send(1));
  ASSERT_TRUE(wait_acked(1));
  const std::uint16_t port = loop_.port();
  loop_.stop();  // the orchestrator goes away (its in-memory state with it) and comes back
  {
    std::lock_guard lock(mu_);
    acks_.clear();
  }
  start_server(port);
  ASSERT_TRUE(send(1));  // re-cut from the orchestrator's checkpoint: already trained
  ASSERT_TRUE(send(2));
  ASSERT_TRUE(send(3));
  const int status = wait_status(trainer);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  EXPECT_EQ(trained(log), (std::vector<std::int64_t>{1, 2, 3}));
  ASSERT_TRUE(wait_acked(3));
  EXPECT_EQ(loop_.run([&] { return loop_.server()->last_acked_step(); }), 3);
}

INSTANTIATE_TEST_SUITE_P(Both, Restart, ::testing::Values("dir", "socket"));

}  // namespace
}  // namespace arlo::bridge
