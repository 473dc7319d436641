// Faults across simulated hosts (testing/netns.h): `arlo run` in host 0 with an external
// trainer and external workers, arlo-trainer in host 1 (socket bridge to host 0), two arlo-workers
// in hosts 2 and 3, each started as an operator starts them on their machines, one token file
// shared. Each test puts one network fault on a link at a moment chosen by what the run wrote
// (a step record in metrics.jsonl), never by sleeping; the fault's own duration is the only wait.
// Checked from the outside (exit status, summary.json, metrics.jsonl, the trainer's metrics, the
// workers' own /health and /metrics):
// - a worker's link down for 10 s mid-run: its requests fail over to the other worker while the
//   link is down (the run trains steps during the outage), it is left out of updates, rejoins when
//   its link is back, is resynced and serves again; the run finishes with no rollout lost or failed
//   and both workers on the trainer's final weights (checksum);
// - 1% packet loss on one worker's link and on the trainer's for the whole run: the run finishes,
//   every worker holds the trainer's final checksum, every step trained once;
// - the trainer's host unreachable for longer than trainer.silence_timeout_s: the run stops with a
//   reason naming the trainer and the key (exit 1, summary.json); with trainer.silence_timeout_s 0
//   it waits for the trainer, which reconnects when its link is back, and the run finishes.
// What each fault cost is printed for docs/reliability.md.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "testing/netns.h"
#include "tests/cluster/argv.h"
#include "tests/e2e/run_checks.h"
#include "testing/process.h"

namespace {

using arlo::e2e::read_jsonl;
using arlo::e2e::tail;

namespace fs = std::filesystem;
using arlo::cluster::Cluster;
using arlo::cluster::LinkShape;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr int kArloHost = 0, kTrainerHost = 1, kFirstWorkerHost = 2, kWorkers = 2;
constexpr int kBridgePort = 29400, kWeightsPort = 29500, kWorkerPort = 8000;  // fresh namespaces: all free
constexpr int kWarmup = 5;
constexpr auto kWait = 150s;  // generous: a loaded 2-core machine
// Weights travel over the links too: tcp from the trainer's publisher on host 1 (star).
constexpr const char* kTransport = "tcp";
const std::string kToken = "arlo-cluster-faults-test-token-0123456789abcdef";

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

bool exited(pid_t pid) {
  siginfo_t info{};
  return ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid;
}

// GET http://address:port/path from inside host `from` (a thread that joins the host's network
// namespace), with the run's token. {HTTP status, body}; status -1 when nothing answered in 5 s.
std::pair<int, std::string> http_get(const Cluster& c, int from, const std::string& address, int port,
                                     const std::string& path) {
  std::pair<int, std::string> out{-1, ""};
  std::thread t([&] {
    const int ns = ::open(("/var/run/netns/" + c.netns(from)).c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0) return;
    const bool joined = ::setns(ns, CLONE_NEWNET) == 0;  // this thread only
    ::close(ns);
    if (!joined) return;
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return;
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);  // bounds connect() too
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    ::inet_pton(AF_INET, address.c_str(), &a.sin_addr);
    std::string response;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      const std::string request = "GET " + path + " HTTP/1.1\r\nHost: " + address + "\r\nAuthorization: Bearer " +
                                  kToken + "\r\nConnection: close\r\n\r\n";
      if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
        char buf[4096];
        for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) response.append(buf, static_cast<std::size_t>(n));
      }
    }
    ::close(fd);
    std::smatch m;
    if (!std::regex_search(response, m, std::regex(R"(^HTTP/1\.[01] (\d{3}))"))) return;
    const auto body = response.find("\r\n\r\n");
    out = {std::stoi(m[1]), body == std::string::npos ? std::string() : response.substr(body + 4)};
  });
  t.join();
  return out;
}

// Packets the loss rules of a host dropped so far: {in, out} (iptables' counters in its namespace).
std::pair<long long, long long> dropped(const Cluster& c, int host) {
  long long counts[2] = {0, 0};
  const char* chains[2] = {"INPUT", "OUTPUT"};
  for (int i = 0; i < 2; ++i) {
    std::string cmd;
    for (const auto& a : c.exec_prefix(host)) cmd += a + " ";
    cmd += std::string("iptables -L ") + chains[i] + " -v -x -n 2>/dev/null";
    std::FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) continue;
    char line[512];
    while (std::fgets(line, sizeof line, p)) {
      std::istringstream fields(line);  // pkts bytes target ...
      long long pkts = 0, bytes = 0;
      std::string target;
      if (fields >> pkts >> bytes >> target && target == "DROP") counts[i] += pkts;
    }
    ::pclose(p);
  }
  return {counts[0], counts[1]};
}

// A Prometheus gauge of a worker's /metrics (-1 when absent).
double gauge(const std::string& metrics, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(metrics, m, std::regex("(^|\n)" + name + R"( ([0-9.eE+-]+))"))) return -1;
  return std::stod(m[2]);
}

// Four hosts: `arlo run` (host 0), arlo-trainer (host 1), two arlo-workers (hosts 2, 3), the
// quickstart configuration shortened with --set. Everything is stopped and removed on the way out
// (the files stay when the test failed, for a look).
class Deployment {
 public:
  Deployment(const std::string& name, int steps) : steps(steps) {
    dir = arlo::e2e::fresh_temp_dir("arlo_cluster_faults_" + name);
    run_dir = dir / "run";
    log = dir / "arlo.log";
    token_file = dir / "token";
    std::ofstream(token_file) << kToken << "\n";
    ::chmod(token_file.c_str(), 0600);
  }
  ~Deployment() {
    if (arlo > 0 && !exited(arlo)) ::kill(arlo, SIGKILL);
    if (arlo > 0) ::waitpid(arlo, nullptr, 0);
    for (pid_t p : others) ::kill(p, SIGTERM);
    const auto end = Clock::now() + 10s;
    for (pid_t p : others) {
      while (!exited(p) && Clock::now() < end) std::this_thread::sleep_for(20ms);
      if (!exited(p)) ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
    cluster.reset();
    if (!::testing::Test::HasFailure()) fs::remove_all(dir);
  }

  // The hosts (`shapes`: links shaped before anything starts) and every part; "" when they
  // started, else why not.
  std::string start(const std::vector<std::string>& extra_sets,
                    const std::vector<std::pair<int, LinkShape>>& shapes = {}) {
    const char* src = std::getenv("ARLO_SOURCE_DIR");
    if (!src) return "ARLO_SOURCE_DIR is not set";
    const std::string config = std::string(src) + "/configs/quickstart.yaml";
    auto resolved = arlo::config::resolve_file(config, {});
    if (!resolved.config) return "the quickstart config does not load";
    const auto& cfg = *resolved.config;
    auto hosts = Cluster::create(kFirstWorkerHost + kWorkers);
    if (!hosts) return hosts.error().what();
    cluster = std::move(*hosts);
    for (const auto& [host, shape] : shapes)
      if (auto st = cluster->shape(host, shape); !st) return st.error().what();
    const std::string seed = std::to_string(cfg.integer("model.seed"));
    const std::vector<std::pair<std::string, std::string>> env = {
        {"ARLO_TOKEN_FILE", token_file.string()}, {"OMP_NUM_THREADS", "1"}, {"MKL_NUM_THREADS", "1"}};
    // The workers, each on its host's address.
    std::string urls;
    for (int i = 0; i < kWorkers; ++i) {
      const int host = kFirstWorkerHost + i;
      auto w = arlo::cluster::worker_argv(cfg, cluster->address(host), kWorkerPort, i, seed, kTransport);
      w.insert(w.end(), {"--max-batch", "64", "--token-file", token_file.string()});
      w.insert(w.end(), {"--allow-weights-from", cluster->address(kTrainerHost)});
      auto pid = cluster->spawn(host, w, (dir / (worker(i) + ".log")).string(), env);
      if (!pid) return pid.error().what();
      others.push_back(*pid);
      urls += (urls.empty() ? "[" : ", ") + std::string("\"") + url(i) + "\"";
    }
    urls += "]";
    // arlo run: its bridge on host 0's address; the trainer and the workers are the ones above.
    std::vector<std::string> sets = {
        "run.dir=" + run_dir.string(),
        "log.progress=false",
        "status.port=0",
        "run.max_steps=" + std::to_string(steps),
        "orchestrator.sft_warmup_steps=" + std::to_string(kWarmup),
        "eval.interval=0",
        "log.step_interval_s=0",
        "inference.launch=external",
        "inference.urls=" + urls,
        "trainer.launch=external",
        "bridge.transport=socket",
        "bridge.address=" + cluster->address(kArloHost) + ":" + std::to_string(kBridgePort),
        "security.token_file=" + token_file.string(),
        std::string("weight_sync.transport=") + kTransport,
        "weight_sync.timeout_s=20",
        "inference.admin_timeout_s=2"};
    sets.insert(sets.end(), extra_sets.begin(), extra_sets.end());
    auto pid = cluster->spawn(kArloHost, arlo::e2e::arlo_run_argv(ARLO_BINARY, config, sets), log.string(),
                              {{"OMP_NUM_THREADS", "1"}});
    if (!pid) return pid.error().what();
    arlo = *pid;
    // The trainer, as `arlo run` would start it, but on its own host with its own directory; it
    // connects to the bridge (retrying until arlo listens), publishes v0 from --seed and announces
    // its publisher's address, which the workers are told to fetch from.
    const nlohmann::json block = {{"transport", kTransport},
                                  {"address", cluster->address(kTrainerHost) + ":" + std::to_string(kWeightsPort)},
                                  {"expected_receivers", kWorkers},
                                  {"timeout_ms", 20000}};
    const auto t =
        arlo::cluster::trainer_argv(cfg, (dir / "trainer").string(), cluster->address(kArloHost), kBridgePort, block);
    pid = cluster->spawn(kTrainerHost, t, (dir / "trainer.log").string(), env);
    if (!pid) return pid.error().what();
    trainer = *pid;
    others.push_back(trainer);
    return "";
  }

  static std::string worker(int i) { return "worker-" + std::to_string(i); }
  std::string url(int i) const {
    return "http://" + cluster->address(kFirstWorkerHost + i) + ":" + std::to_string(kWorkerPort);
  }
  std::string output() const { return read_text(log); }
  // What the run, the trainer and the workers printed, for a failure message.
  std::string outputs() const {
    std::string s = "--- arlo run:\n" + tail(output()) + "\n--- trainer:\n" + tail(read_text(dir / "trainer.log"));
    for (int i = 0; i < kWorkers; ++i) s += "\n--- " + worker(i) + ":\n" + tail(read_text(dir / (worker(i) + ".log")));
    return s;
  }

  // Until metrics.jsonl has a step record for `step` or later; false at the deadline or when arlo exited.
  bool wait_for_step(int step) const {
    const auto end = Clock::now() + kWait;
    while (Clock::now() < end && !exited(arlo)) {
      if (last_step() >= step) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }
  int last_step() const {
    int last = 0;
    for (const auto& j : read_jsonl(run_dir / "metrics.jsonl"))
      if (j.value("kind", "") == "step") last = std::max(last, j.at("step").get<int>());
    return last;
  }
  // arlo's exit status once it exited (-1 past the deadline).
  int wait(std::chrono::seconds limit = kWait) {
    const auto end = Clock::now() + limit;
    while (!exited(arlo) && Clock::now() < end) std::this_thread::sleep_for(20ms);
    if (!exited(arlo)) return -1;
    int status = 0;
    ::waitpid(arlo, &status, 0);
    arlo = -1;
    return status;
  }
  nlohmann::json summary() const {
    auto j = nlohmann::json::parse(read_text(run_dir / "summary.json"), nullptr, false);
    return j.is_discarded() ? nlohmann::json::object() : j;
  }

  std::unique_ptr<Cluster> cluster;
  fs::path dir, run_dir, log, token_file;
  pid_t arlo = -1, trainer = -1;
  std::vector<pid_t> others;  // the trainer and the workers
  int steps;
};

// Exit 0, every step, the ledger adding up (no rollout lost), both workers on the trainer's final
// version with its checksum, every step trained exactly once by the trainer. Returns summary.json.
nlohmann::json expect_finished(Deployment& d) {
  const int status = d.wait();
  EXPECT_TRUE(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << "\n"
                                                                            << d.outputs();
  const auto summary = d.summary();
  if (!summary.contains("ledger")) {
    ADD_FAILURE() << "no summary.json\n" << d.outputs();
    return summary;
  }
  arlo::e2e::expect_every_step_trained(summary, d.run_dir, d.steps, kWorkers);
  // The trainer trained each step once, on one batch.
  std::map<int, std::set<std::string>> batches;
  for (const auto& j : read_jsonl(d.dir / "trainer" / "trainer_metrics.jsonl"))
    if (j.contains("step") && j.contains("batch"))
      batches[j.at("step").get<int>()].insert(j.at("batch").get<std::string>());
  for (int s = 1; s <= d.steps; ++s)
    EXPECT_EQ(batches[s].size(), 1u) << "step " << s << " trained on " << batches[s].size() << " batches";
  return summary;
}

#define SKIP_WITHOUT_HOSTS()                                                        \
  do {                                                                              \
    if (const auto why = Cluster::unavailable(); !why.empty()) GTEST_SKIP() << why; \
  } while (0)

// One of the two workers loses its link for 10 s mid-run (no packet in or out; its connections
// stay open, unanswered). Its first health check that gets no answer while it holds requests opens
// its circuit (inference.failover_on_silence): the requests it held move to the other worker and
// the run goes on during the outage (steps trained, the other worker serving, no rollout failed).
// Its update fails or it is left out of the round unasked; once its link is back it answers, is
// resynced the current version and serves again.
TEST(ClusterFaults, AWorkersLinkDownFor10sFailsOverRejoinsAndResyncs) {
  SKIP_WITHOUT_HOSTS();
  Deployment d("link_down", 100);
  // A version move to worker-0 in flight when its link goes down fails within 3 s (not when the
  // link is back), so whenever the cut comes, worker-0 misses an update and the run goes on.
  const auto why = d.start({"weight_sync.timeout_s=3"});
  ASSERT_EQ(why, "");
  ASSERT_TRUE(d.wait_for_step(kWarmup + 2)) << d.outputs();
  const int cut = kFirstWorkerHost;  // worker-0
  // What worker-1 had generated when worker-0's link went down, and when it came back.
  auto served_by_other = [&] {
    auto [status, body] =
        http_get(*d.cluster, kArloHost, d.cluster->address(kFirstWorkerHost + 1), kWorkerPort, "/metrics");
    return status == 200 ? gauge(body, "arlo_worker_engine_requests_finished") : -1.0;
  };
  const double other_at_cut = served_by_other();
  ASSERT_TRUE(d.cluster->link_down(cut));
  const auto down_at = Clock::now();
  const int step_at_cut = d.last_step();
  std::this_thread::sleep_for(5s);  // the fault itself, in two halves
  const int step_at_half = d.last_step();
  std::this_thread::sleep_for(5s);
  const int step_before_up = d.last_step();
  const double other_before_up = served_by_other();
  ASSERT_TRUE(d.cluster->link_up(cut));
  const double link_down_s = std::chrono::duration<double>(Clock::now() - down_at).count();
  const int step_at_up = d.last_step();
  ASSERT_FALSE(exited(d.arlo)) << "the run ended during the fault: give it more steps\n" << d.outputs();
  // What worker-0 had generated when its link came back (reached from host 0, as arlo does).
  double served_at_up = -1;
  for (const auto end = Clock::now() + 30s; served_at_up < 0 && Clock::now() < end;) {
    auto [status, body] = http_get(*d.cluster, kArloHost, d.cluster->address(cut), kWorkerPort, "/metrics");
    if (status == 200) served_at_up = gauge(body, "arlo_worker_engine_requests_finished");
  }
  ASSERT_GE(served_at_up, 0) << "worker-0's /metrics did not answer after its link came back";
  const auto summary = expect_finished(d);
  // The run went on while the link was down: the groups worker-0 held moved to worker-1 (which
  // generated meanwhile) and steps were trained; nothing waited for the link to come back, and no
  // rollout failed (the moved requests completed on worker-1; the ledger above counts each once).
  EXPECT_GT(step_before_up, step_at_cut) << "no step trained while worker-0's link was down\n" << d.outputs();
  // Not only the steps that needed nothing from worker-0: the run also trained in the outage's
  // second half (its requests had moved; without the fail-over they waited for the link).
  EXPECT_GT(step_before_up, step_at_half) << "no step trained in the second half of the outage\n" << d.outputs();
  EXPECT_GT(other_before_up, other_at_cut) << "worker-1 generated nothing while worker-0's link was down";
  if (summary.contains("ledger")) {
    EXPECT_EQ(arlo::e2e::sum_counts(summary.at("ledger").at("failed")), 0u) << summary.at("ledger").dump(2);
  }
  // worker-0 missed an update while cut off, and took one after: it rejoined and was resynced.
  int failed_updates = 0, synced_after = 0;
  for (const auto& r : read_jsonl(d.run_dir / "metrics.jsonl")) {
    if (r.value("kind", "") != "weight_sync") continue;
    for (const auto& w : r.at("workers")) {
      if (w.value("worker", "") != d.url(0)) continue;
      if (!w.value("ok", false))
        ++failed_updates;
      else if (failed_updates > 0)
        ++synced_after;
    }
  }
  EXPECT_GE(failed_updates, 1) << "worker-0 never missed an update: was its link cut?";
  EXPECT_GE(synced_after, 1) << "worker-0 took no version after it missed one";
  // It serves again: it answers /health with the final version, and it generated after the fault.
  auto [status, body] = http_get(*d.cluster, kArloHost, d.cluster->address(cut), kWorkerPort, "/health");
  EXPECT_EQ(status, 200) << body;
  const auto health = nlohmann::json::parse(body, nullptr, false);
  EXPECT_EQ(health.is_object() ? health.value("version", -1) : -1, d.steps) << body;
  auto [mstatus, metrics] = http_get(*d.cluster, kArloHost, d.cluster->address(cut), kWorkerPort, "/metrics");
  EXPECT_EQ(mstatus, 200);
  EXPECT_GT(gauge(metrics, "arlo_worker_engine_requests_finished"), served_at_up)
      << "worker-0 generated nothing after its link came back\n"
      << d.outputs();
  std::printf(
      "worker-0's link down for %.1f s, during steps %d..%d (%d trained while it was down, %d in its second "
      "half); worker-1 finished %.0f requests meanwhile\n",
      link_down_s, step_at_cut, step_at_up, step_before_up - step_at_cut, step_before_up - step_at_half,
      other_before_up - other_at_cut);
  arlo::e2e::print_fault_cost("a worker's link down for 10 s", d.run_dir, summary);
}

// 1% of the packets in each direction of worker-0's link and of the trainer's link dropped for the
// whole run: TCP resends what was lost (the requests, the admin calls, the bridge's batches and
// acks), nothing gives up, and the weights every worker ends on are the trainer's.
TEST(ClusterFaults, OnePercentLossOnAWorkersAndTheTrainersLinkLosesNothing) {
  SKIP_WITHOUT_HOSTS();
  Deployment d("loss", 40);
  const LinkShape lossy{0, 0, 1.0};
  ASSERT_EQ(d.start({}, {{kFirstWorkerHost, lossy}, {kTrainerHost, lossy}}), "");
  const auto summary = expect_finished(d);
  // The loss was real: both hosts dropped packets, in and out.
  for (int host : {kFirstWorkerHost, kTrainerHost}) {
    const auto [in, out] = dropped(*d.cluster, host);
    EXPECT_GT(in, 0) << "host " << host << " dropped no incoming packet";
    EXPECT_GT(out, 0) << "host " << host << " dropped no outgoing packet";
    std::printf("host %d dropped %lld packets in, %lld out\n", host, in, out);
  }
  // Every version the trainer published after v0 reached both workers.
  int applied = 0;
  for (const auto& r : read_jsonl(d.run_dir / "metrics.jsonl")) {
    if (r.value("kind", "") != "weight_sync" || !r.value("applied", false)) continue;
    ++applied;
  }
  EXPECT_GE(applied, 2);
  arlo::e2e::print_fault_cost("1% loss on a worker's and the trainer's link", d.run_dir, summary);
}

// The trainer's host unreachable (its link down) for longer than trainer.silence_timeout_s: the
// run stops with the reason, naming the trainer and the key, in its output and summary.json (exit
// 1), a few seconds past the deadline, not minutes.
TEST(ClusterFaults, TheTrainersHostUnreachablePastTheDeadlineStopsTheRunWithTheReason) {
  SKIP_WITHOUT_HOSTS();
  Deployment d("trainer_stop", 60);
  ASSERT_EQ(d.start({"trainer.silence_timeout_s=4", "trainer.alarm_s=1"}), "");
  ASSERT_TRUE(d.wait_for_step(kWarmup + 3)) << d.outputs();
  ASSERT_TRUE(d.cluster->link_down(kTrainerHost));
  const auto down_at = Clock::now();
  const int status = d.wait(90s);
  const double stopped_after = std::chrono::duration<double>(Clock::now() - down_at).count();
  ASSERT_GE(status, 0) << "the run did not stop within 90 s of the trainer's link going down\n" << d.outputs();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << "status " << status << "\n" << d.outputs();
  const auto summary = d.summary();
  ASSERT_TRUE(summary.contains("error")) << d.outputs();
  EXPECT_FALSE(summary.value("ok", true));
  const auto error = summary.value("error", std::string());
  EXPECT_NE(error.find("the trainer has not been heard from"), std::string::npos) << error;
  EXPECT_NE(error.find("trainer.silence_timeout_s (4 s)"), std::string::npos) << error;
  EXPECT_LT(summary.value("steps", 0), d.steps);
  EXPECT_NE(d.output().find(error), std::string::npos) << "the reason is in arlo's output too\n" << tail(d.output());
  std::printf(
      "the trainer's host unreachable: the run stopped %.1f s after its link went down "
      "(trainer.silence_timeout_s 4)\n",
      stopped_after);
}

// The same outage with trainer.silence_timeout_s 0 (and no accept deadline): the run waits. The
// link stays down for 12 s, past the 4 s deadline of the test above and past the bridge's 10 s
// heartbeat timeout, so both ends drop the connection; when the link is back the trainer
// reconnects, the bridge sends it what it had not acknowledged, and the run finishes with every step
// trained once.
TEST(ClusterFaults, TheTrainersHostUnreachableIsWaitedForWhenConfiguredTo) {
  SKIP_WITHOUT_HOSTS();
  Deployment d("trainer_wait", 40);
  ASSERT_EQ(d.start({"trainer.silence_timeout_s=0", "trainer.accept_timeout_s=0", "trainer.alarm_s=1"}), "");
  ASSERT_TRUE(d.wait_for_step(kWarmup + 3)) << d.outputs();
  ASSERT_TRUE(d.cluster->link_down(kTrainerHost));
  const int step_at_cut = d.last_step();
  std::this_thread::sleep_for(12s);  // the fault itself
  ASSERT_FALSE(exited(d.arlo)) << "the run did not wait for the trainer\n" << d.outputs();
  ASSERT_TRUE(d.cluster->link_up(kTrainerHost));
  const auto up_at = Clock::now();
  const auto summary = expect_finished(d);
  EXPECT_LT(step_at_cut, d.steps);
  std::printf("the trainer's host unreachable for 12 s, waited for: the run finished %.1f s after its link came back\n",
              std::chrono::duration<double>(Clock::now() - up_at).count());
  arlo::e2e::print_fault_cost("the trainer's host unreachable for 12 s (waited for)", d.run_dir, summary);
}

}  // namespace
