// `arlo run` across simulated hosts (testing/netns.h: network namespaces on a bridge, links
// shaped by tc): every part in a host of its own, reaching the others by address, with the run's
// token (security.token_file; the children read $ARLO_TOKEN_FILE):
// - star: the orchestrator (host 0), an external arlo-trainer (host 1) publishing on every
//   interface and announcing its host's address (weight_sync.advertise_host), two arlo-workers
//   (hosts 2, 3) from another seed: they get the trainer's v0 before serving, the run learns as the
//   single-host short run does (its reward figures), and both end on the trainer's last version;
// - chain: the orchestrator with its embedded trainer (host 0, publisher off loopback) and three
//   workers, each relaying to the next on weight_sync.relay_port + k of its own host;
// - a relay killed mid-transfer (kill -9 the middle worker): the run finishes, the last worker
//   retries the version in flight from the trainer, pulls from the first one's relay from then on,
//   and ends on the trainer's last version.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "testing/netns.h"
#include "tests/cluster/argv.h"
#include "testing/process.h"

namespace {

using arlo::e2e::read_jsonl;
using arlo::e2e::tail;

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using arlo::cluster::Cluster;

constexpr int kHttpPort = 8000;
constexpr int kBridgePort = 29400;
constexpr int kPublisherPort = 29500;
constexpr int kRelayPort = 29600;
constexpr double kLinkMbit = 1000;  // every host's link, each direction

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Polls until pred() holds, `pid` exits (not reaped) or the deadline passes.
template <typename Pred>
bool wait_until(Pred pred, pid_t pid, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid)
      return pred();
    std::this_thread::sleep_for(50ms);  // polling files the processes write
  }
  return false;
}

// Waits for `pid` for at most `limit`; its exit status, or -1 when it did not end (then killed).
int wait_exit(pid_t pid, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (std::chrono::steady_clock::now() < end) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0) return -1;
    std::this_thread::sleep_for(50ms);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return -1;
}

class ClusterRun : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const auto why = Cluster::unavailable(); !why.empty()) GTEST_SKIP() << why;
    const char* src = std::getenv("ARLO_SOURCE_DIR");
    ASSERT_NE(src, nullptr);
    config_ = std::string(src) + "/configs/quickstart.yaml";
    auto resolved = arlo::config::resolve_file(config_, {});
    ASSERT_TRUE(resolved.config.has_value());
    cfg_.emplace(*resolved.config);
    dir_ = arlo::e2e::fresh_temp_dir(std::string("arlo_cluster_run_") +
                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    // The run's token: every part off loopback needs it (the worker admin plane, the bridge, the
    // weight publisher and relays).
    token_file_ = dir_ / "token";
    std::ofstream(token_file_) << "cluster-run-token-" << ::getpid() << "\n";
    ::chmod(token_file_.c_str(), 0600);
    ::unsetenv("ARLO_TOKEN");
    ::unsetenv("ARLO_TOKEN_FILE");
  }

  void TearDown() override {
    for (pid_t pid : pids_) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    pids_.clear();
    cluster_.reset();  // every namespace, veth and the bridge
    if (!HasFailure() && !dir_.empty()) fs::remove_all(dir_);
  }

  void make_cluster(int hosts) {
    auto c = Cluster::create(hosts, {.rate_mbit = kLinkMbit});
    ASSERT_TRUE(c.has_value()) << c.error().what();
    cluster_ = std::move(*c);
  }

  std::vector<std::pair<std::string, std::string>> env() const {
    return {{"ARLO_TOKEN_FILE", token_file_.string()}, {"OMP_NUM_THREADS", "1"}, {"MKL_NUM_THREADS", "1"}};
  }

  pid_t spawn(int host, const std::vector<std::string>& argv, const fs::path& log) {
    auto pid = cluster_->spawn(host, argv, log.string(), env());
    EXPECT_TRUE(pid.has_value()) << pid.error().what();
    if (!pid) return -1;
    pids_.push_back(*pid);
    return *pid;
  }

  std::string url(int host) const { return "http://" + cluster_->address(host) + ":" + std::to_string(kHttpPort); }

  // An arlo-worker in `host` on its own address, from seed 7 (its own v0 is not the trainer's),
  // taking weights from the hosts `sources` (the trainer's, and in a chain the other workers').
  pid_t start_worker(int host, int index, const std::vector<int>& sources) {
    auto argv = arlo::cluster::worker_argv(*cfg_, cluster_->address(host), kHttpPort, index, "7", "tcp");
    for (int s : sources) argv.insert(argv.end(), {"--allow-weights-from", cluster_->address(s)});
    return spawn(host, argv, dir_ / ("worker-" + std::to_string(index) + ".log"));
  }

  // `arlo run configs/quickstart.yaml` in host 0 with `sets`; the workers are external (hosts `workers`).
  pid_t start_arlo(const std::vector<int>& workers, const std::vector<std::string>& sets) {
    std::string urls = "[";
    for (std::size_t i = 0; i < workers.size(); ++i) urls += (i ? ", \"" : "\"") + url(workers[i]) + "\"";
    urls += "]";
    std::vector<std::string> all = {"run.dir=" + (dir_ / "run").string(),
                                    "log.progress=false",
                                    "status.port=0",
                                    "eval.interval=0",
                                    "weight_sync.transport=tcp",
                                    "inference.launch=external",
                                    "inference.urls=" + urls,
                                    "security.token_file=" + token_file_.string()};
    all.insert(all.end(), sets.begin(), sets.end());
    return spawn(0, arlo::e2e::arlo_run_argv(ARLO_BINARY, config_, all), arlo_log());
  }

  fs::path arlo_log() const { return dir_ / "arlo.log"; }
  fs::path run_dir() const { return dir_ / "run"; }
  std::string worker_log(int index) const { return read_text(dir_ / ("worker-" + std::to_string(index) + ".log")); }

  // The run's exit status, its output's tail on failure; summary.json.
  nlohmann::json finish(pid_t arlo) {
    const int status = wait_exit(arlo, 300s);
    pids_.erase(std::remove(pids_.begin(), pids_.end(), arlo), pids_.end());
    const std::string output = read_text(arlo_log());
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "arlo run (status " << status << "):\n"
                                                               << tail(output);
    auto summary = nlohmann::json::parse(read_text(run_dir() / "summary.json"), nullptr, false);
    EXPECT_FALSE(summary.is_discarded()) << "no summary.json; output:\n" << tail(output);
    return summary;
  }

  // Every worker of `names` holds the trainer's last version (max_steps) and its checksum.
  void expect_final_weights(const nlohmann::json& summary, int steps, const std::set<std::string>& names) {
    const auto& trainer = summary.at("trainer");
    ASSERT_EQ(trainer.at("version").get<std::int64_t>(), steps) << summary.dump(2);
    const auto checksum = trainer.at("checksum").get<std::string>();
    EXPECT_FALSE(checksum.empty()) << summary.dump(2);
    std::set<std::string> seen;
    for (const auto& [name, w] : summary.at("workers").items()) {  // keyed by the worker's URL
      if (!names.count(name)) continue;
      seen.insert(name);
      ASSERT_FALSE(w.contains("error")) << name << ": " << w.dump();
      EXPECT_EQ(w.at("version").get<std::int64_t>(), steps) << name;
      EXPECT_EQ(w.at("checksum").get<std::string>(), checksum) << name << " holds other weights than the trainer's";
    }
    EXPECT_EQ(seen, names) << summary.at("workers").dump(2);
  }

  std::unique_ptr<Cluster> cluster_;
  std::string config_;
  std::optional<arlo::config::Config> cfg_;
  fs::path dir_, token_file_;
  std::vector<pid_t> pids_;
};

// What summary.json says of worker `url` (summary.workers is keyed by the workers' URLs).
nlohmann::json worker_entry(const nlohmann::json& summary, const std::string& url) {
  const auto& workers = summary.at("workers");
  return workers.contains(url) ? workers.at(url) : nlohmann::json::object();
}

TEST_F(ClusterRun, StarAcrossFourHostsLearnsAndEndsOnTheTrainersWeights) {
  make_cluster(4);
  const int steps = 8, warmup = 4;
  const std::string orchestrator = cluster_->address(0), trainer_host = cluster_->address(1);
  for (int w = 0; w < 2; ++w) ASSERT_GT(start_worker(2 + w, w, {1}), 0);
  const pid_t arlo = start_arlo(
      {2, 3}, {"run.max_steps=" + std::to_string(steps), "orchestrator.sft_warmup_steps=" + std::to_string(warmup),
               "trainer.launch=external", "bridge.transport=socket",
               "bridge.address=" + orchestrator + ":" + std::to_string(kBridgePort)});
  ASSERT_GT(arlo, 0);
  ASSERT_TRUE(
      wait_until([&] { return read_text(arlo_log()).find("waiting for a trainer on the bridge") != std::string::npos; },
                 arlo, 120s))
      << tail(read_text(arlo_log()));
  // The trainer of its own host: the bridge on the orchestrator's address, its publisher on every
  // interface, announcing its host's address.
  const nlohmann::json block = {{"transport", "tcp"},
                                {"address", "0.0.0.0:" + std::to_string(kPublisherPort)},
                                {"advertise_host", trainer_host},
                                {"expected_receivers", 2}};
  const auto trainer =
      arlo::cluster::trainer_argv(*cfg_, (dir_ / "trainer").string(), orchestrator, kBridgePort, block);
  fs::create_directories(dir_ / "trainer");
  ASSERT_GT(spawn(1, trainer, dir_ / "trainer.log"), 0);

  const auto summary = finish(arlo);
  ASSERT_FALSE(HasFailure()) << "trainer:\n" << tail(read_text(dir_ / "trainer.log"));
  const std::string output = read_text(arlo_log());
  EXPECT_NE(output.find("2 worker(s) healthy"), std::string::npos);
  EXPECT_EQ(output.find("left out of updates"), std::string::npos) << tail(output);
  EXPECT_TRUE(summary.at("ok").get<bool>()) << summary.dump(2);
  EXPECT_EQ(summary.at("steps").get<int>(), steps);
  expect_final_weights(summary, steps, {url(2), url(3)});
  // The trainer announced where the workers reach it: its host's address, not 0.0.0.0.
  const auto announced = summary.at("trainer").at("weight_sync").at("endpoint").value("address", std::string());
  EXPECT_EQ(announced.rfind(trainer_host + ":", 0), 0u) << summary.at("trainer").dump(2);

  // v0 went to both workers before anything else; every update reached both.
  bool first = true;
  int rl_steps = 0;
  for (const auto& r : read_jsonl(run_dir() / "metrics.jsonl")) {
    const std::string line = r.dump();
    if (r.value("kind", "") == "weight_sync") {
      if (first) {
        EXPECT_EQ(r.at("version").get<std::int64_t>(), 0) << line;
      }
      first = false;
      int ok = 0;
      for (const auto& w : r.at("workers")) ok += w.value("ok", false);
      EXPECT_EQ(ok, 2) << line;
      continue;
    }
    if (r.value("kind", "") != "step" || r.value("train/supervised", false)) continue;
    // The reward figures the single-host short run asserts (tests/e2e/quickstart).
    ++rl_steps;
    const double reward = r.at("train/reward/mean").get<double>();
    EXPECT_TRUE(reward >= 0.0 && reward <= 1.0) << line;
    EXPECT_DOUBLE_EQ(r.at("train/reward/exact_match/mean").get<double>(), reward) << line;
    EXPECT_EQ(r.at("train/reward/failed").get<double>(), 0.0) << line;
    EXPECT_EQ(r.at("train/samples/trainable").get<int>(), cfg_->integer("orchestrator.batch_size")) << line;
    EXPECT_EQ(r.at("rollouts/failed").get<int>(), 0) << line;
    for (const char* key : {"trainer/loss", "trainer/grad_norm", "trainer/lr", "trainer/entropy"}) {
      ASSERT_TRUE(r.contains(key)) << key << " missing in " << line;
      EXPECT_TRUE(std::isfinite(r.at(key).get<double>())) << line;
    }
  }
  EXPECT_FALSE(first) << "no weight update was recorded";
  EXPECT_EQ(rl_steps, steps - warmup);
}

// The chain's settings: the orchestrator's embedded trainer publishes on every interface of host 0
// and announces its address; worker k relays on kRelayPort + k of its own host.
std::vector<std::string> chain_sets(const std::string& orchestrator, int steps) {
  return {"run.max_steps=" + std::to_string(steps), "orchestrator.sft_warmup_steps=2", "weight_sync.topology=chain",
          "weight_sync.relay_port=" + std::to_string(kRelayPort),
          "weight_sync.address=0.0.0.0:" + std::to_string(kPublisherPort), "weight_sync.advertise_host=" + orchestrator,
          // A stuck transfer fails the test in a minute, not the default two.
          "weight_sync.timeout_s=60"};
}

TEST_F(ClusterRun, ChainOverThreeWorkersRelaysOnEveryLink) {
  make_cluster(4);
  const int steps = 6;
  for (int w = 0; w < 3; ++w) ASSERT_GT(start_worker(1 + w, w, {0, 1, 2, 3}), 0);
  const pid_t arlo = start_arlo({1, 2, 3}, chain_sets(cluster_->address(0), steps));
  ASSERT_GT(arlo, 0);
  const auto summary = finish(arlo);
  ASSERT_FALSE(HasFailure());
  EXPECT_TRUE(summary.at("ok").get<bool>()) << summary.dump(2);
  expect_final_weights(summary, steps, {url(1), url(2), url(3)});
  const auto announced = summary.at("trainer").at("weight_sync").at("endpoint").value("address", std::string());
  EXPECT_EQ(announced.rfind(cluster_->address(0) + ":", 0), 0u) << summary.at("trainer").dump(2);
  // Each worker pulled from the one before it (the first from the trainer's announced address)
  // and each but the last relayed on its own host.
  const std::string relay0 = cluster_->address(1) + ":" + std::to_string(kRelayPort);
  const std::string relay1 = cluster_->address(2) + ":" + std::to_string(kRelayPort + 1);
  EXPECT_NE(worker_log(0).find("from " + announced + ", relaying at " + relay0), std::string::npos)
      << tail(worker_log(0));
  EXPECT_NE(worker_log(1).find("from " + relay0 + ", relaying at " + relay1), std::string::npos) << tail(worker_log(1));
  EXPECT_NE(worker_log(2).find("from " + relay1 + "\n"), std::string::npos) << tail(worker_log(2));
  EXPECT_EQ(worker_log(2).find("relaying at"), std::string::npos) << "the end of the chain relays to nobody";
  for (const auto& r : read_jsonl(run_dir() / "metrics.jsonl")) {
    if (r.value("kind", "") != "weight_sync") continue;
    for (const auto& w : r.at("workers")) EXPECT_TRUE(w.value("ok", false)) << r.dump();
  }
}

TEST_F(ClusterRun, ARelayKilledMidTransferIsSkippedAndTheNextWorkerKeepsUp) {
  make_cluster(4);
  const int steps = 10, kill_after = 4;
  std::vector<pid_t> workers;
  for (int w = 0; w < 3; ++w) workers.push_back(start_worker(1 + w, w, {0, 1, 2, 3}));
  for (pid_t p : workers) ASSERT_GT(p, 0);
  const pid_t arlo = start_arlo({1, 2, 3}, chain_sets(cluster_->address(0), steps));
  ASSERT_GT(arlo, 0);
  // Once version kill_after reached the whole chain, the middle worker's link slows to 1 Mbit/s (a
  // version then takes seconds to cross it) and it dies in its next transfer: the first worker's
  // relay loses its downstream and the last worker its upstream, both mid-version.
  auto synced_to_all = [&] {
    for (const auto& r : read_jsonl(run_dir() / "metrics.jsonl"))
      if (r.value("kind", "") == "weight_sync" && r.value("version", std::int64_t{-1}) >= kill_after &&
          r.value("applied", false))
        return true;
    return false;
  };
  ASSERT_TRUE(wait_until(synced_to_all, arlo, 180s)) << tail(read_text(arlo_log()));
  ASSERT_TRUE(cluster_->shape(2, {.rate_mbit = 1}).has_value());
  const std::size_t middle_at = worker_log(1).size(), last_at = worker_log(2).size();
  // Both started the next version (the last one is connected to the middle one's relay, which
  // listens across versions).
  ASSERT_TRUE(wait_until(
      [&] {
        return worker_log(1).find("receiving weights v", middle_at) != std::string::npos &&
               worker_log(2).find("receiving weights v", last_at) != std::string::npos;
      },
      arlo, 120s))
      << tail(read_text(arlo_log()));
  ASSERT_EQ(::kill(workers[1], SIGKILL), 0);

  const auto summary = finish(arlo);
  ASSERT_FALSE(HasFailure());
  // The transfer it started after the link slowed did not finish (one in flight when the link
  // slowed may finish first: the next one starts after it).
  const std::size_t killed_in = worker_log(1).find("receiving weights v", middle_at);
  EXPECT_EQ(worker_log(1).find("received weights", killed_in), std::string::npos)
      << "the middle worker finished its transfer before it was killed: " << worker_log(1).substr(middle_at);
  EXPECT_TRUE(summary.at("ok").get<bool>()) << summary.dump(2);
  EXPECT_EQ(summary.at("steps").get<int>(), steps);
  // Both live workers end on the trainer's last version; the dead one is reported, not waited for.
  expect_final_weights(summary, steps, {url(1), url(3)});
  EXPECT_TRUE(worker_entry(summary, url(2)).contains("error")) << summary.at("workers").dump(2);
  // The last worker retried the version in flight from the trainer, then pulled from the first
  // worker's relay (the dead one skipped).
  const auto trainer_at = summary.at("trainer").at("weight_sync").at("endpoint").value("address", std::string());
  const std::string relay0 = cluster_->address(1) + ":" + std::to_string(kRelayPort);
  const std::string after = worker_log(2).substr(last_at);
  EXPECT_NE(after.find("from " + trainer_at + "\n"), std::string::npos) << after;
  EXPECT_NE(after.find("from " + relay0), std::string::npos) << after;
  // No version was lost on the way: the last worker took every update, the one in flight at the
  // kill included, and the final one went around the dead relay.
  std::int64_t last_version = -1;
  for (const auto& r : read_jsonl(run_dir() / "metrics.jsonl")) {
    if (r.value("kind", "") != "weight_sync") continue;
    bool last_ok = false;
    for (const auto& w : r.at("workers"))
      if (w.value("worker", "") == url(3)) last_ok = w.value("ok", false);
    EXPECT_TRUE(last_ok) << "the last worker missed an update: " << r.dump();
    last_version = std::max(last_version, r.at("version").get<std::int64_t>());
  }
  EXPECT_EQ(last_version, steps);
}

}  // namespace
