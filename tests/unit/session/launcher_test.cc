// The launcher with real processes: output is forwarded with the child's name, exits are
// reported, and stop() leaves no process of the group behind (grandchildren included).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <thread>

#include "session/launcher.h"

namespace arlo::session {
namespace {

struct Lines {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<std::string, std::string>> lines;
  Launcher::LineSink sink() {
    return [this](const std::string& n, const std::string& l) {
      std::lock_guard lock(mu);
      lines.emplace_back(n, l);
      cv.notify_all();
    };
  }
  bool wait_for(std::size_t count) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(20), [&] { return lines.size() >= count; });
  }
};

// Running (a zombie waiting for a reaper that is not us counts as gone).
bool alive(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string pid_s, comm, state;
  stat >> pid_s >> comm >> state;
  return state != "Z";
}

TEST(Launcher, ForwardsPrefixedLinesAndReportsExit) {
  Lines out;
  Launcher l(out.sink());
  ASSERT_TRUE(l.spawn({"echo-child", {"sh", "-c", "echo one; echo \"two $ARLO_T\"; exit 3"}, {{"ARLO_T", "x"}}}));
  ASSERT_TRUE(out.wait_for(2));
  {
    std::lock_guard lock(out.mu);
    EXPECT_EQ(out.lines[0], (std::pair<std::string, std::string>{"echo-child", "one"}));
    EXPECT_EQ(out.lines[1], (std::pair<std::string, std::string>{"echo-child", "two x"}));
  }
  std::optional<ChildExit> e;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!e && std::chrono::steady_clock::now() < until) {
    e = l.exited();
    if (!e) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // waiting on a real process
  }
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(WIFEXITED(e->status));
  EXPECT_EQ(WEXITSTATUS(e->status), 3);
  EXPECT_NE(e->describe().find("exited with code 3"), std::string::npos);
}

TEST(Launcher, StopLeavesNoOrphansIncludingGrandchildren) {
  Lines out;
  Launcher l(out.sink());
  auto a = l.spawn({"worker-0", {"sh", "-c", "sleep 60 & echo $!; wait"}, {}});
  auto b = l.spawn({"worker-1", {"sh", "-c", "trap '' TERM; echo ready; sleep 60"}, {}});  // ignores SIGTERM
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(out.wait_for(2));
  pid_t grandchild = 0;
  {
    std::lock_guard lock(out.mu);
    for (const auto& [n, line] : out.lines)
      if (n == "worker-0") grandchild = std::stoi(line);
  }
  ASSERT_GT(grandchild, 0);
  EXPECT_TRUE(alive(grandchild));
  l.stop(std::chrono::milliseconds(300));  // worker-1 ignores SIGTERM: the grace always runs out
  EXPECT_TRUE(l.running().empty());
  EXPECT_FALSE(alive(*a));
  EXPECT_FALSE(alive(*b));
  // The grandchild was reparented (to init or a subreaper) when its parent died; it got the
  // group's SIGKILL all the same. Give its new parent a moment to reap it.
  bool gone = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!gone && std::chrono::steady_clock::now() < until) {
    gone = !alive(grandchild);
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(gone);
}

TEST(Launcher, FreeLoopbackPortIsBindable) {
  auto p = free_loopback_port();
  ASSERT_TRUE(p);
  EXPECT_GT(*p, 0);
}

}  // namespace
}  // namespace arlo::session
