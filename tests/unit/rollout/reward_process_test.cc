// Reward plugins with isolate: process: a real arlo-reward-host child per module, the test plugin in
// it. Scores and errors as in-process; a crash (segfault, abort, exit) fails the group in flight and
// the next call restarts the host; a hang is cut off at the call timeout by killing the host;
// restarts past the bound make the scorer report kResourceExhausted; no host outlives its module.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#include "rollout/reward_plugin_loader.h"
#include "rollout/reward_scorer.h"
#include "tests/unit/rollout/rollout_test_util.h"

namespace arlo::rollout {
namespace {

using test::run;
using namespace std::chrono_literals;

using test::group;
using test::task;

PluginOptions isolated(Duration timeout = 20s, int max_restarts = 5) {
  PluginOptions o;
  o.isolate = PluginIsolation::kProcess;
  o.host.program = ARLO_REWARD_HOST_PATH;
  o.host.call_timeout = timeout;
  o.host.max_restarts = max_restarts;
  o.host.backoff = 10ms;
  return o;
}

std::shared_ptr<RewardModule> load(const std::string& mode, PluginOptions options = isolated()) {
  auto m = load_reward_plugin(ARLO_TEST_PLUGIN_PATH, mode, std::nullopt, options);
  EXPECT_TRUE(m) << (m ? "" : m.error().what());
  return m ? std::shared_ptr<RewardModule>(std::move(*m)) : nullptr;
}

// "" when the file cannot be read: a /proc file of a process reaped since it was listed fails the
// read itself (ESRCH, which libstdc++ throws as basic_filebuf::underflow; CI: 1 run in ~5 suites).
std::string read_text(const std::filesystem::path& p) {
  try {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  } catch (const std::exception&) {
    return {};
  }
}

// The pids of this process's arlo-reward-host children (zombies included until reaped).
std::vector<pid_t> hosts() {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& t : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::stringstream children(read_text(t.path() / "children"));
    for (pid_t c; children >> c;)
      if (read_text("/proc/" + std::to_string(c) + "/cmdline").find("arlo-reward-host") != std::string::npos)
        out.push_back(c);
  }
  return out;
}

// Polls until no arlo-reward-host child is left (or 20 s).
bool no_hosts_left() {
  const auto until = std::chrono::steady_clock::now() + 20s;
  while (!hosts().empty() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(10ms);
  return hosts().empty();
}

struct Scored {
  Status status = ok();
  ScorerStats stats;
  double seconds = 0;
};

Scored score_with(RewardScorer& scorer, boost::asio::io_context& io, std::vector<Rollout>& g) {
  Scored out;
  const auto t0 = std::chrono::steady_clock::now();
  run(io, [&]() -> boost::asio::awaitable<void> { out.status = co_await scorer.score_group(task(), g); }());
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.stats = scorer.stats();
  return out;
}

// Scores a group of `texts` that the host dies on: the group is lost (kCancelled), never scored.
void expect_group_lost(RewardScorer& scorer, boost::asio::io_context& io, std::initializer_list<const char*> texts) {
  auto g = group(texts);
  auto r = score_with(scorer, io, g);
  ASSERT_FALSE(r.status);
  EXPECT_EQ(r.status.error().code(), ErrorCode::kCancelled) << r.status.error().what();
}

TEST(RewardHost, ScoresAndReportsErrorsLikeInProcess) {
  {
    auto m = load("ok");
    ASSERT_TRUE(m);
    EXPECT_EQ(m->name(), "test_plugin");
    EXPECT_EQ(hosts().size(), 1u);
    auto s = m->score(task(), group({"68"})[0]);
    ASSERT_TRUE(s) << s.error().what();
    EXPECT_EQ(s->reward, 1.0);
    EXPECT_EQ(s->metrics.at("len"), 2.0);
    EXPECT_EQ(m->score(task(), group({"67"})[0])->reward, 0.0);
    // What the process boundary costs per call (printed, not asserted: the machine is shared).
    auto in_process = load("ok", PluginOptions{});
    const auto sample = group({"68"})[0];
    for (auto* module : {in_process.get(), m.get()}) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 1000; ++i) ASSERT_TRUE(module->score(task(), sample));
      std::printf("%s: %.1f us per call\n", module == m.get() ? "isolate: process" : "isolate: none",
                  std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 1000);
    }

    // A plugin's own error comes back with its message; a thrown exception too.
    auto e = load("error")->score(task(), group({"68"})[0]);
    ASSERT_FALSE(e);
    EXPECT_NE(e.error().what().find("cannot score task t-7"), std::string::npos) << e.error().what();
    auto t = load("throw")->score(task(), group({"68"})[0]);
    ASSERT_FALSE(t);
    EXPECT_NE(t.error().what().find("plugin exploded on purpose"), std::string::npos) << t.error().what();

    // NaN crosses the pipe and the scorer rejects it naming the plugin, as in-process.
    boost::asio::io_context io;
    RewardScorer scorer(io, load("nan"), {.timeout = 20s, .on_failure = FailurePolicy::kFail});
    auto g = group({"68"});
    auto r = score_with(scorer, io, g);
    ASSERT_FALSE(r.status);
    EXPECT_NE(r.status.error().what().find("reward module 'test_plugin' returned a non-finite reward"),
              std::string::npos)
        << r.status.error().what();
  }
  EXPECT_TRUE(no_hosts_left());

  // Load errors are the loader's, reported from the host.
  auto bad = load_reward_plugin(ARLO_TEST_PLUGIN_ABI99_PATH, "ok", std::nullopt, isolated());
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), ErrorCode::kMismatch);
  EXPECT_NE(bad.error().what().find("ABI version 99"), std::string::npos) << bad.error().what();
  bad = load_reward_plugin(ARLO_TEST_PLUGIN_PATH, "reject", std::nullopt, isolated());
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().what().find("refuses to start"), std::string::npos) << bad.error().what();
  bad = load_reward_plugin("/nonexistent/libnothing.so", "", std::nullopt, isolated());
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), ErrorCode::kNotFound);
  bad = load_reward_plugin(ARLO_TEST_PLUGIN_PATH, "segv_in_create", std::nullopt, isolated());
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().what().find("died while loading it: signal 11 (SIGSEGV"), std::string::npos)
      << bad.error().what();
  auto no_host = isolated();
  no_host.host.program = "/nonexistent/arlo-reward-host";
  bad = load_reward_plugin(ARLO_TEST_PLUGIN_PATH, "ok", std::nullopt, no_host);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().what().find("cannot start the reward host"), std::string::npos) << bad.error().what();
  EXPECT_TRUE(no_hosts_left());
}

// Each way of dying costs the group in flight only; the next group is scored by a new host.
TEST(RewardHost, CrashFailsTheGroupInFlightAndTheHostIsRestarted) {
  struct Case {
    const char* mode;
    const char* reason;
  };
  for (const Case c :
       {Case{"segv_on_crash", "crashed: signal 11 (SIGSEGV"}, Case{"abort_on_crash", "crashed: signal 6 (SIGABRT"},
        Case{"exit_on_crash", "crashed: exit status 3"}}) {
    SCOPED_TRACE(c.mode);
    boost::asio::io_context io;
    {
      RewardScorer scorer(io, load(c.mode), {.timeout = 20s, .on_failure = FailurePolicy::kAssign, .assign_value = -1});
      const auto first = hosts();
      ASSERT_EQ(first.size(), 1u);
      auto g = group({"68", "crash", "68"});
      auto r = score_with(scorer, io, g);
      ASSERT_FALSE(r.status);
      EXPECT_EQ(r.status.error().code(), ErrorCode::kCancelled);
      EXPECT_NE(r.status.error().what().find(std::string("reward plugin 'test_plugin' ") + c.reason), std::string::npos)
          << r.status.error().what();
      EXPECT_NE(r.status.error().what().find("the group is dropped"), std::string::npos) << r.status.error().what();
      for (const auto& s : g) EXPECT_FALSE(s.reward.has_value()) << "no made-up reward for a lost group";
      EXPECT_EQ(r.stats.groups_lost, 1u);
      EXPECT_EQ(r.stats.assigned, 0u);
      std::printf("%s: the crashed group took %.3f s\n", c.mode, r.seconds);

      auto g2 = group({"68", "67"});
      auto r2 = score_with(scorer, io, g2);
      ASSERT_TRUE(r2.status) << r2.status.error().what();
      EXPECT_EQ(g2[0].reward, 1.0);
      EXPECT_EQ(g2[1].reward, 0.0);
      const auto second = hosts();
      ASSERT_EQ(second.size(), 1u);
      EXPECT_NE(second[0], first[0]) << "a new host serves after the crash";
      std::printf("%s: the next group (restart included) took %.3f s\n", c.mode, r2.seconds);
    }
    test::drain(io);
    EXPECT_TRUE(no_hosts_left());
  }
}

TEST(RewardHost, HangIsCutOffAtTheCallTimeoutByKillingTheHost) {
  boost::asio::io_context io;
  {
    const auto timeout = 1000ms;
    RewardScorer scorer(io, load("hang_on_crash", isolated(timeout)),
                        {.timeout = timeout, .on_failure = FailurePolicy::kAssign, .assign_value = 0.25, .threads = 2});
    const auto first = hosts();
    ASSERT_EQ(first.size(), 1u);
    auto g = group({"crash"});
    auto r = score_with(scorer, io, g);
    // The hung sample gets the policy's value, as an in-process hang does.
    ASSERT_TRUE(r.status) << r.status.error().what();
    EXPECT_EQ(g[0].reward, 0.25);
    EXPECT_EQ(r.stats.timeouts, 1u);
    EXPECT_GE(r.seconds, 0.9);
    std::printf("the hung group took %.3f s (timeout 1 s)\n", r.seconds);
    // The host that hung is killed (not left running with a stuck thread) ...
    // One snapshot per check: the host may be reaped between two reads of /proc.
    auto still_first = [&] {
      const auto now = hosts();
      return std::find(now.begin(), now.end(), first[0]) != now.end();
    };
    const auto until = std::chrono::steady_clock::now() + 20s;
    while (still_first() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(10ms);
    EXPECT_FALSE(still_first());
    // ... and the next group is scored by a new one.
    auto g2 = group({"68", "67", "68"});
    auto r2 = score_with(scorer, io, g2);
    ASSERT_TRUE(r2.status) << r2.status.error().what();
    EXPECT_EQ(g2[0].reward, 1.0);
    EXPECT_EQ(g2[1].reward, 0.0);
    EXPECT_EQ(hosts().size(), 1u);
  }
  test::drain(io);
  EXPECT_TRUE(no_hosts_left());
}

TEST(RewardHost, RestartsAreBoundedThenTheScorerReportsThatItCannotGoOn) {
  boost::asio::io_context io;
  {
    RewardScorer scorer(io, load("segv_always", isolated(20s, /*max_restarts=*/2)), {.timeout = 20s});
    for (int i = 0; i < 3; ++i) {  // three deaths in a row: each costs its group
      ASSERT_NO_FATAL_FAILURE(expect_group_lost(scorer, io, {"68"}));
    }
    auto g = group({"68"});
    auto r = score_with(scorer, io, g);
    ASSERT_FALSE(r.status);
    EXPECT_EQ(r.status.error().code(), ErrorCode::kResourceExhausted) << r.status.error().what();
    EXPECT_NE(r.status.error().what().find("died 3 times in a row (the bound is 2 restarts); giving up"),
              std::string::npos)
        << r.status.error().what();
    EXPECT_NE(r.status.error().what().find("signal 11"), std::string::npos) << r.status.error().what();
    EXPECT_TRUE(hosts().empty()) << "no host is started past the bound";
  }
  test::drain(io);
}

// A success between deaths resets the count: a plugin that crashes now and then is never given up on.
TEST(RewardHost, AnAnswerBetweenCrashesResetsTheBound) {
  boost::asio::io_context io;
  {
    RewardScorer scorer(io, load("segv_on_crash", isolated(20s, /*max_restarts=*/1)), {.timeout = 20s});
    for (int i = 0; i < 4; ++i) {
      ASSERT_NO_FATAL_FAILURE(expect_group_lost(scorer, io, {"crash"}));
      auto ok_group = group({"68"});
      auto r2 = score_with(scorer, io, ok_group);
      ASSERT_TRUE(r2.status) << r2.status.error().what();
      EXPECT_EQ(ok_group[0].reward, 1.0);
    }
    EXPECT_EQ(scorer.stats().groups_lost, 4u);
  }
  test::drain(io);
  EXPECT_TRUE(no_hosts_left());
}

}  // namespace
}  // namespace arlo::rollout
