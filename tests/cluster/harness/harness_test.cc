// The harness of tests/cluster (netns.h) against the real kernel: two hosts, a TCP transfer from one
// to the other by address (python3's socket module on both ends, each inside its host), the link cut
// and restored, and every namespace, veth and bridge gone after the Cluster is destroyed.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "testing/netns.h"

namespace {

namespace fs = std::filesystem;
using arlo::cluster::Cluster;

// Receiver: listens on PORT, counts the bytes of one connection, prints the count.
constexpr const char* kServer = R"(
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1)
open(sys.argv[3], "w").write("listening\n")
c, _ = s.accept(); n = 0
while True:
    b = c.recv(1 << 20)
    if not b: break
    n += len(b)
print(n, flush=True)
)";
// Sender: connects within a deadline, sends N bytes; exit 3 when it cannot connect.
constexpr const char* kClient = R"(
import socket, sys, time
end = time.time() + float(sys.argv[4])
while True:
    try:
        c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1); break
    except OSError:
        if time.time() > end: sys.exit(3)
        time.sleep(0.05)
c.sendall(b"x" * int(sys.argv[3])); c.close()
)";

int wait_exit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), {}};
}

bool wait_for_file(const fs::path& p, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!fs::exists(p)) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling a file the peer writes
  }
  return true;
}

std::string leftovers(const std::string& prefix) {
  std::string out;
  for (const char* cmd : {"ip netns list", "ip -o link show"}) {
    FILE* f = ::popen(cmd, "r");
    char line[512];
    while (f && std::fgets(line, sizeof line, f))
      if (std::string(line).find(prefix) != std::string::npos) out += line;
    if (f) ::pclose(f);
  }
  return out;
}

TEST(ClusterHarness, HostsTalkByAddressALinkGoesDownAndUpAndNothingIsLeft) {
  if (const auto why = Cluster::unavailable(); !why.empty()) GTEST_SKIP() << why;
  const fs::path dir = fs::temp_directory_path() / ("arlo-cluster-harness-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string prefix = "arlo" + std::to_string(::getpid());
  {
    auto c = Cluster::create(2, {.rate_mbit = 200});
    ASSERT_TRUE(c.has_value()) << c.error().what();
    auto& cluster = **c;
    EXPECT_NE(cluster.address(0), cluster.address(1));
    EXPECT_FALSE(leftovers(prefix).empty());

    auto transfer = [&](const std::string& tag, double connect_s) {
      const fs::path ready = dir / (tag + ".ready"), out = dir / (tag + ".out");
      auto server =
          cluster.spawn(1, {"python3", "-c", kServer, cluster.address(1), "7000", ready.string()}, out.string());
      EXPECT_TRUE(server.has_value());
      EXPECT_TRUE(wait_for_file(ready, std::chrono::seconds(30)));
      auto client =
          cluster.spawn(0, {"python3", "-c", kClient, cluster.address(1), "7000", "5000000", std::to_string(connect_s)},
                        (dir / (tag + ".client")).string());
      const int rc = wait_exit(*client);
      if (rc != 0) ::kill(*server, SIGKILL);
      wait_exit(*server);
      return std::pair{rc, read_text(out)};
    };

    auto [rc, received] = transfer("up", 30);
    EXPECT_EQ(rc, 0);
    EXPECT_NE(received.find("5000000"), std::string::npos) << received;

    ASSERT_TRUE(cluster.link_down(0).has_value());
    auto [rc_down, ignored] = transfer("down", 1.5);
    EXPECT_EQ(rc_down, 3) << "a host whose link is down reached its peer";

    ASSERT_TRUE(cluster.link_up(0).has_value());
    ASSERT_TRUE(cluster.shape(0, {.rate_mbit = 100, .loss_pct = 1}).has_value());
    auto [rc_again, again] = transfer("again", 30);
    EXPECT_EQ(rc_again, 0);
    EXPECT_NE(again.find("5000000"), std::string::npos) << again;
  }
  EXPECT_EQ(leftovers(prefix), "") << "the Cluster left these behind";
  fs::remove_all(dir);
}

TEST(ClusterHarness, ADelayWithoutNetemIsRefusedWithTheReason) {
  if (const auto why = Cluster::unavailable(); !why.empty()) GTEST_SKIP() << why;
  auto c = Cluster::create(1);
  ASSERT_TRUE(c.has_value()) << c.error().what();
  auto r = (*c)->shape(0, {.rate_mbit = 100, .delay_ms = 0.5});
  if (r) GTEST_SKIP() << "this kernel has sch_netem: delays work";
  EXPECT_NE(r.error().what().find("sch_netem"), std::string::npos) << r.error().what();
}

}  // namespace
