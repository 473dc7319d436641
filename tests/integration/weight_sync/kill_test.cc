// Real processes: a receiver or the sender is killed mid-transfer (it stops itself with SIGSTOP at
// a chosen bucket through faults::stop_before_bucket of testing/fault_injection.h, the test then SIGKILLs it), and
// every survivor must end on a consistent version. Runs for every registered streaming transport.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>

#include "testing/fault_injection.h"
#include "tests/unit/weight_sync/test_util.h"
#include "weight_sync/transport.h"
#include "weight_sync/weight_sync.h"

namespace arlo::weight_sync {
namespace {

using namespace std::chrono_literals;
using namespace testing;

Options base_options(const std::string& transport, const std::string& shm) {
  Options o;
  o.transport = transport;
  o.bucket_bytes = testing::kTestBucket;
  o.bucket_timeout = 10s;
  o.params = testing::isolated_params(transport, shm, std::filesystem::temp_directory_path() / ("arlo-ws-kill-" + shm));
  if (find_transport(transport).value()->option("reconnect_window_ms")) o.params["reconnect_window_ms"] = 500;
  return o;
}

std::string shm_channel(const char* tag) { return std::string(tag) + "-" + std::to_string(::getpid()); }

// Kills `pid` as soon as it stops itself, and reaps it.
std::thread kill_when_stopped(pid_t pid) {
  return std::thread([pid] {
    int st = 0;
    if (::waitpid(pid, &st, WUNTRACED) == pid && WIFSTOPPED(st)) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &st, 0);
    }
  });
}

// A publisher in a child process, created with `tap` (a fault): it hands its endpoint to this
// process through a pipe, publishes version `v` of odd_specs() filled from `seed` and exits 0 when
// every receiver got it (20: not created, 21: the endpoint not handed on, 22: a receiver failed).
struct SenderProcess {
  pid_t pid = -1;
  nlohmann::json endpoint;  // discarded where the child handed none on
};
SenderProcess fork_sender(const std::string& transport, const std::string& channel, std::shared_ptr<BucketTap> tap,
                          Version v, std::uint64_t seed) {
  int fds[2];
  if (::pipe(fds) != 0) return {};
  const pid_t pid = ::fork();
  if (pid == 0) {
    auto pub = Publisher::create(base_options(transport, channel), std::move(tap));
    if (!pub) ::_exit(20);
    const std::string ep = (*pub)->endpoint().dump() + "\n";
    if (::write(fds[1], ep.data(), ep.size()) < 0) ::_exit(21);
    auto r = (*pub)->publish(v, filled(seed), deadline_in(30s));
    ::_exit(r && r->all_ok() ? 0 : 22);
  }
  ::close(fds[1]);  // a child that ends without writing ends the read below
  std::string ep;
  char c;
  while (pid > 0 && ::read(fds[0], &c, 1) == 1 && c != '\n') ep += c;
  ::close(fds[0]);
  return {pid, nlohmann::json::parse(ep, nullptr, /*allow_exceptions=*/false)};
}

// Child: receive one version and compare with the deterministic expectation. Never returns.
[[noreturn]] void run_receiver(Options o, std::uint64_t seed, std::shared_ptr<BucketTap> tap = nullptr) {
  auto sub = Subscriber::create(o, std::move(tap));
  if (!sub) ::_exit(10);
  HostWeights sink(odd_specs());
  auto r = (*sub)->receive(sink, deadline_in(30s));
  if (!r) {
    std::fprintf(stderr, "receiver %s: %s\n", o.peer_name.c_str(), r.error().what().c_str());
    ::_exit(11);
  }
  ::_exit(same_bytes(sink, filled(seed)) ? 0 : 12);
}

class WeightSyncKillTest : public ::testing::TestWithParam<std::string> {};

TEST_P(WeightSyncKillTest, KilledReceiverLeavesTheOtherReceiverConsistent) {
  const std::string channel = shm_channel("kr");
  Options po = base_options(GetParam(), channel);
  po.expected_receivers = 2;
  auto pub = Publisher::create(po).value();
  Options so = testing::reaching(base_options(GetParam(), channel), pub->endpoint());

  so.peer_name = "survivor";
  const pid_t survivor = ::fork();
  if (survivor == 0) run_receiver(so, 5);
  so.peer_name = "victim";
  const pid_t victim = ::fork();
  if (victim == 0) run_receiver(so, 5, faults::stop_before_bucket(1));
  auto killer = kill_when_stopped(victim);

  auto report = pub->publish(1, filled(5), deadline_in(30s));
  killer.join();
  int st = 0;
  ASSERT_EQ(::waitpid(survivor, &st, 0), survivor);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "survivor status " << st;
  ASSERT_TRUE(report) << report.error().what();
  ASSERT_EQ(report->peers.size(), 2u);
  for (const auto& p : report->peers) {
    if (p.peer == "survivor") {
      EXPECT_TRUE(p.ok) << p.error;
    } else {
      EXPECT_FALSE(p.ok);
      EXPECT_NE(p.error.find("bucket"), std::string::npos) << p.error;
    }
  }
}

// A receiver that stalls mid-transfer without dying (its host unreachable: its socket stays open,
// nothing is read, the sender's writes block) must not stall the others. Two of three receivers
// stop themselves before bucket 0 and stay stopped; the third must receive the whole version while
// they are still stopped. The bucket is larger than the socket buffers, so writes to a stopped
// receiver block; a stalled link may be the one that hashes the bucket for all, so the test has two.
TEST_P(WeightSyncKillTest, StalledReceiversDoNotHoldTheOthers) {
  const std::string channel = shm_channel("st");
  const std::vector<TensorSpec> specs = {{"model.big.f32", DType::F32, {4096, 4096}}};  // 64 MiB
  Options po = base_options(GetParam(), channel);
  po.bucket_bytes = 128ull << 20;
  po.bucket_timeout = 120s;  // a survivor that waits for a stalled link waits far past the check below
  po.expected_receivers = 3;
  po.gather_window = 10s;  // all three take part in the transfer
  auto pub = Publisher::create(po).value();
  Options so = testing::reaching(po, pub->endpoint());
  auto receive = [&](const char* name, std::shared_ptr<BucketTap> tap) {
    const pid_t pid = ::fork();
    if (pid != 0) return pid;
    so.peer_name = name;
    auto sub = Subscriber::create(so, std::move(tap));
    if (!sub) ::_exit(10);
    HostWeights sink(specs), expect(specs);
    auto r = (*sub)->receive(sink, deadline_in(120s));
    if (!r) {
      std::fprintf(stderr, "receiver %s: %s\n", name, r.error().what().c_str());
      ::_exit(11);
    }
    fill(expect, 9);
    ::_exit(same_bytes(sink, expect) ? 0 : 12);
  };
  std::vector<pid_t> stalled = {receive("stalled-0", faults::stop_before_bucket(0)),
                                receive("stalled-1", faults::stop_before_bucket(0))};
  const pid_t survivor = receive("survivor", nullptr);
  std::thread publisher([&] {
    HostWeights w(specs);
    fill(w, 9);
    (void)pub->publish(1, w, deadline_in(120s));
  });
  // The survivor ends while the stalled ones are still stopped (60 s: it normally takes well under one).
  int st = -1;
  for (const auto end = Clock::now() + 60s; Clock::now() < end;) {
    if (::waitpid(survivor, &st, WNOHANG) == survivor) break;
    st = -1;
    std::this_thread::sleep_for(50ms);
  }
  for (pid_t pid : stalled) {
    int s = 0;
    EXPECT_EQ(::waitpid(pid, &s, WUNTRACED | WNOHANG), pid) << "a stalled receiver did not stop itself";
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &s, 0);
  }
  if (st == -1) {
    ::kill(survivor, SIGKILL);
    ::waitpid(survivor, &st, 0);
    ADD_FAILURE() << "the survivor did not receive the version within 60 s while two receivers were stalled";
  } else {
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "survivor status " << st;
  }
  publisher.join();
}

TEST_P(WeightSyncKillTest, KilledSenderLeavesReceiversOnTheirPreviousVersion) {
  for (auto mode : {ApplyMode::kStaging, ApplyMode::kInPlace}) {
    const std::string channel = shm_channel(mode == ApplyMode::kStaging ? "ks" : "ki");
    const auto sender = fork_sender(GetParam(), channel, faults::stop_before_bucket(1), 2, 99);
    ASSERT_GT(sender.pid, 0) << "fork: " << std::strerror(errno);
    auto killer = kill_when_stopped(sender.pid);
    if (!sender.endpoint.is_object()) killer.join();  // the child ended: nothing to receive
    ASSERT_TRUE(sender.endpoint.is_object()) << "the sender process handed on no endpoint";

    Options so = testing::reaching(base_options(GetParam(), channel), sender.endpoint);
    so.apply_mode = mode;
    so.peer_name = "worker";
    auto sub = Subscriber::create(so).value();
    HostWeights v1 = filled(1);
    HostWeights sink = testing::copy_of(v1);
    ASSERT_TRUE(sink.commit(1));
    sub->assume_version(1);
    auto r = sub->receive(sink, deadline_in(30s));
    killer.join();
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().what().find("bucket"), std::string::npos) << r.error().what();
    if (mode == ApplyMode::kStaging) {
      EXPECT_EQ(sub->version(), std::optional<Version>(1));
      EXPECT_TRUE(same_bytes(sink, v1));
      EXPECT_EQ(sink.committed(), std::optional<Version>(1));
    } else {
      // Some bytes were overwritten in place: the sink is told, and nothing claims a version.
      EXPECT_FALSE(sub->version().has_value());
      EXPECT_FALSE(sink.committed().has_value());
    }
    // A transport with a named segment leaves nothing behind once its sender is gone.
    if (find_transport(GetParam()).value()->option("shm_name")) {
      EXPECT_FALSE(std::filesystem::exists("/dev/shm/arlo-ws-" + channel));
    }
  }
}

// A sender process that flips one byte of bucket 1 on the wire (faults::corrupt_bucket, after the
// checksum was taken): the receiver detects it and never applies wrong weights. A transport that resends
// (tcp) ends with the exact version; one that does not (shm) fails the receive naming the bucket's
// checksum and applies nothing.
TEST_P(WeightSyncKillTest, ACorruptedByteNeverYieldsWrongWeights) {
  const std::string channel = shm_channel("kc");
  const auto sender = fork_sender(GetParam(), channel, faults::corrupt_bucket(1), 3, 77);
  ASSERT_GT(sender.pid, 0) << "fork: " << std::strerror(errno);
  int status = 0;
  if (!sender.endpoint.is_object()) ::waitpid(sender.pid, &status, 0);
  ASSERT_TRUE(sender.endpoint.is_object()) << "the sender process handed on no endpoint (status " << status << ")";
  Options so = testing::reaching(base_options(GetParam(), channel), sender.endpoint);
  so.peer_name = "worker";
  auto sub = Subscriber::create(so).value();
  HostWeights sink(odd_specs());
  auto r = sub->receive(sink, deadline_in(30s));
  ::waitpid(sender.pid, &status, 0);
  if (r) {
    EXPECT_EQ(r->version, 3u);
    EXPECT_GE(r->retried_buckets, 1u);
    EXPECT_TRUE(same_bytes(sink, filled(77)));
  } else {
    const std::string why = r.error().what();
    EXPECT_TRUE(why.find("checksum") != std::string::npos && why.find("bucket") != std::string::npos) << why;
    EXPECT_FALSE(sink.committed().has_value()) << why;
    EXPECT_FALSE(sub->version().has_value()) << why;
  }
  EXPECT_TRUE(WIFEXITED(status)) << status;
}

// Every registered streaming transport (a durable one has no transfer to cut: its receivers read
// finished files; a collective one is tested in tests/unit/nccl_transport).
std::vector<std::string> streaming_transports() {
  std::vector<std::string> out;
  for (const auto& d : transports())
    if (!d.capabilities.durable && !d.capabilities.collective) out.push_back(d.name);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Transports, WeightSyncKillTest, ::testing::ValuesIn(streaming_transports()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace arlo::weight_sync
