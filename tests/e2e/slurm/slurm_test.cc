// deploy/slurm/arlo.sbatch on a real Slurm cluster: the test starts munged, slurmctld and three
// slurmd daemons on this host (nodes n1-n3, each its own slurmd on its own port, as on a cluster
// of three machines), submits the script with the built-in policy on the arithmetic task
// (configs/quickstart.yaml, shortened), waits for the job, and checks the run: every step done, the
// trainer's last version on every server (its checksum), the orchestrator, servers and trainer
// each a job step, addressed through what Slurm set. Skipped with the reason where the
// daemons cannot run (not root, slurm-wlm or munge not installed: scripts/bootstrap installs them).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "testing/process.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

bool port_is_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// `count` consecutive free ports (the script gives a node's k-th server the base port + k).
int free_port_run(int count) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int base = arlo::e2e::free_loopback_port();
    bool all = base + count < 65536;
    for (int k = 1; all && k < count; ++k) all = port_is_free(base + k);
    if (all) return base;
  }
  return 0;
}

// The program `name` on PATH or in the sbin directories (where the daemons live); empty if none.
std::string find_program(const std::string& name) {
  std::string dirs = std::getenv("PATH") ? std::getenv("PATH") : "";
  dirs += ":/usr/sbin:/sbin:/usr/bin:/bin";
  std::stringstream in(dirs);
  for (std::string dir; std::getline(in, dir, ':');) {
    if (dir.empty()) continue;
    const fs::path p = fs::path(dir) / name;
    if (::access(p.c_str(), X_OK) == 0) return p.string();
  }
  return {};
}

struct Ran {
  int status = -1;  // the exit status, -1 if it did not exit normally
  std::string output;
};

// Runs argv to completion (stdout and stderr to `log`), at most `timeout`.
Ran run(const std::vector<std::string>& argv, const fs::path& log, std::chrono::seconds timeout = 60s) {
  Ran r;
  const pid_t pid = arlo::e2e::spawn_logged(argv, log);
  if (pid <= 0) return r;
  const auto end = Clock::now() + timeout;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > end) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      r.output = arlo::e2e::read_text(log) + "\n(killed after " + std::to_string(timeout.count()) + " s)";
      return r;
    }
    std::this_thread::sleep_for(50ms);
  }
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.output = arlo::e2e::read_text(log);
  return r;
}

// A one-host Slurm cluster in a temporary directory. Everything it starts is stopped and reaped
// by the destructor, whatever the test did: jobs cancelled (and waited for, so no job step
// outlives the test), then the daemons.
class Cluster {
 public:
  struct Daemon {
    std::string name;
    pid_t pid = -1;
    fs::path log;
  };

  Cluster() {
    char templ[] = "/tmp/arlo-slurm-XXXXXX";
    if (::mkdtemp(templ) != nullptr) dir_ = templ;
  }
  ~Cluster() {
    if (!dir_.empty() && !daemons_.empty()) cancel_jobs();
    for (auto it = daemons_.rbegin(); it != daemons_.rend(); ++it) stop(*it);
    if (!dir_.empty()) {
      std::error_code ec;
      fs::remove_all(dir_, ec);
    }
  }
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  const fs::path& dir() const { return dir_; }
  fs::path conf() const { return dir_ / "slurm.conf"; }
  // argv of a Slurm client program against this cluster's config.
  std::vector<std::string> client(const std::string& program, std::vector<std::string> args) const {
    std::vector<std::string> argv = {"/usr/bin/env", "SLURM_CONF=" + conf().string(), find_program(program)};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }
  Ran query(const std::string& program, std::vector<std::string> args) const {
    return run(client(program, std::move(args)), dir_ / ("query-" + program + ".log"));
  }

  // Starts a daemon (in the foreground: its child until stopped); false if it could not be forked.
  bool start(const std::string& name, const std::vector<std::string>& argv) {
    Daemon d{name, -1, dir_ / (name + ".log")};
    d.pid = arlo::e2e::spawn_logged(argv, d.log);
    if (d.pid <= 0) return false;
    daemons_.push_back(d);
    return true;
  }
  // The first daemon that exited, with its log; empty while all run.
  std::string exited() {
    for (auto& d : daemons_) {
      if (d.pid <= 0) continue;
      int status = 0;
      if (::waitpid(d.pid, &status, WNOHANG) == d.pid) {
        d.pid = -1;
        return d.name + " exited (" +
               (WIFEXITED(status) ? "status " + std::to_string(WEXITSTATUS(status))
                                  : "signal " + std::to_string(WTERMSIG(status))) +
               "); its log (" + d.log.string() + "):\n" + arlo::e2e::tail(arlo::e2e::read_text(d.log), 3000);
      }
    }
    return {};
  }
  std::string logs() const {
    std::string out;
    for (const auto& d : daemons_)
      out +=
          "--- " + d.name + " (" + d.log.string() + ")\n" + arlo::e2e::tail(arlo::e2e::read_text(d.log), 2000) + "\n";
    return out;
  }

 private:
  void cancel_jobs() {
    run(client("scancel", {"--full", "--user=root"}), dir_ / "scancel.log");
    const auto end = Clock::now() + 90s;
    while (Clock::now() < end) {
      const Ran q = query("squeue", {"-h", "-o", "%i"});
      if (q.status == 0 && q.output.find_first_not_of(" \n") == std::string::npos) return;
      std::this_thread::sleep_for(200ms);
    }
  }
  static void stop(Daemon& d) {
    if (d.pid <= 0) return;
    ::kill(d.pid, SIGTERM);
    const auto end = Clock::now() + 20s;
    int status = 0;
    while (::waitpid(d.pid, &status, WNOHANG) == 0) {
      if (Clock::now() > end) {
        ::kill(d.pid, SIGKILL);
        ::waitpid(d.pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(20ms);
    }
    d.pid = -1;
  }

  fs::path dir_;
  std::vector<Daemon> daemons_;
};

std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  std::string h = buf;
  return h.substr(0, h.find('.'));
}

// JobState of the job's first component ("" when scontrol does not know the job).
std::string job_state(const Cluster& c, const std::string& job) {
  const Ran r = c.query("scontrol", {"show", "job", job});
  std::smatch m;
  static const std::regex state("JobState=([A-Z_]+)");
  return std::regex_search(r.output, m, state) ? m[1].str() : std::string();
}

bool terminal(const std::string& s) {
  for (const char* t : {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                        "BOOT_FAIL", "DEADLINE"})
    if (s == t) return true;
  return false;
}

TEST(SlurmE2E, HeterogeneousJobRunsTheBuiltInPolicyToTheEnd) {
  const char* src = std::getenv("ARLO_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  if (::geteuid() != 0)
    GTEST_SKIP() << "the test cluster's slurmd must run as root to start job steps (CI runs as root)";
  for (const char* p : {"munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "squeue", "scancel", "srun"})
    if (find_program(p).empty())
      GTEST_SKIP() << p << " is not installed: scripts/bootstrap installs the slurm-wlm and munge packages";
  // The script finds the three programs under one directory: the build tree's apps/.
  const fs::path apps = fs::path(ARLO_BINARY).parent_path().parent_path();
  ASSERT_EQ(fs::path(ARLO_WORKER_BINARY), apps / "arlo-worker" / "arlo-worker");
  ASSERT_EQ(fs::path(ARLO_TRAINER_BINARY), apps / "arlo-trainer" / "arlo-trainer");

  Cluster cluster;
  ASSERT_FALSE(cluster.dir().empty()) << "mkdtemp failed";
  const fs::path d = cluster.dir();
  // munged wants its socket's directory searchable by everyone.
  fs::permissions(d, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec | fs::perms::others_read |
                         fs::perms::others_exec);
  for (const char* sub : {"state", "run"}) fs::create_directories(d / sub);

  // munge: a fresh key (owner-only, as munged requires) and a daemon on its own socket.
  {
    std::ifstream urandom("/dev/urandom", std::ios::binary);
    std::string key(1024, '\0');
    urandom.read(key.data(), static_cast<std::streamsize>(key.size()));
    std::ofstream(d / "munge.key", std::ios::binary) << key;
    fs::permissions(d / "munge.key", fs::perms::owner_read | fs::perms::owner_write);
  }
  const fs::path socket = d / "munge.socket";
  ASSERT_TRUE(
      cluster.start("munged", {find_program("munged"), "--foreground", "--force", "--socket=" + socket.string(),
                               "--key-file=" + (d / "munge.key").string(), "--pid-file=" + (d / "munged.pid").string(),
                               "--seed-file=" + (d / "munged.seed").string(), "--num-threads=4"}));
  for (const auto end = Clock::now() + 30s; !fs::exists(socket);) {
    if (auto why = cluster.exited(); !why.empty()) GTEST_SKIP() << "munged cannot start here: " << why;
    ASSERT_LT(Clock::now(), end) << "munged did not create " << socket << " within 30 s:\n" << cluster.logs();
    std::this_thread::sleep_for(20ms);
  }

  // slurm.conf: the controller and three nodes on this host, each slurmd on its own port. No
  // cgroups (proctrack/linuxproc, task/none); slurmd takes the CPU count from the conf
  // (config_overrides), so three nodes of 4 CPUs fit a 2-core machine. Heterogeneous jobs are
  // started only by the backfill scheduler: every second here.
  const std::string host = hostname();
  const int node_port = free_port_run(3);  // n1, n2, n3
  ASSERT_GT(node_port, 0);
  std::ofstream(cluster.conf())
      << "ClusterName=arlotest\n"
      << "SlurmctldHost=" << host << "(127.0.0.1)\n"
      << "SlurmctldPort=" << arlo::e2e::free_loopback_port() << "\n"
      << "SlurmUser=root\nSlurmdUser=root\n"
      << "AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket=" << socket.string() << "\n"
      << "StateSaveLocation=" << (d / "state").string() << "\n"
      << "SlurmdSpoolDir=" << (d / "spool-%n").string() << "\n"
      << "SlurmctldPidFile=" << (d / "slurmctld.pid").string() << "\n"
      << "SlurmdPidFile=" << (d / "slurmd-%n.pid").string() << "\n"
      << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nMpiDefault=none\n"
      << "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
      << "SchedulerType=sched/backfill\nSchedulerParameters=bf_interval=1\n"
      << "SlurmdParameters=config_overrides\nReturnToService=2\nKillWait=5\nMailProg=/bin/true\n"
      << "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/"
         "none\n"
      << "NodeName=n[1-3] NodeHostname=" << host << " NodeAddr=127.0.0.1 Port=[" << node_port << "-" << node_port + 2
      << "] CPUs=4 RealMemory=1000 State=UNKNOWN\n"
      << "PartitionName=test Nodes=ALL Default=YES MaxTime=30 State=UP\n";
  ASSERT_TRUE(cluster.start("slurmctld", {find_program("slurmctld"), "-D", "-i", "-f", cluster.conf().string()}));
  for (const char* node : {"n1", "n2", "n3"})
    ASSERT_TRUE(cluster.start(std::string("slurmd-") + node,
                              {find_program("slurmd"), "-D", "-N", node, "-f", cluster.conf().string()}));

  // Up when sinfo shows the three nodes idle.
  for (const auto end = Clock::now() + 90s;;) {
    if (auto why = cluster.exited(); !why.empty()) GTEST_SKIP() << "the Slurm daemons cannot run here: " << why;
    const Ran r = cluster.query("sinfo", {"-h", "-o", "%T %D"});
    if (r.status == 0 && r.output.find("idle 3") != std::string::npos) break;
    ASSERT_LT(Clock::now(), end) << "the three nodes were not idle within 90 s; sinfo: " << r.output << "\n"
                                 << cluster.logs();
    std::this_thread::sleep_for(200ms);
  }

  // The job: the script as a user submits it, with the quickstart's built-in policy, shortened.
  const int steps = 12;
  const fs::path run_dir = d / "run" / "arith";
  const fs::path job_out = d / "job.out";
  const int worker_port = free_port_run(2);
  ASSERT_GT(worker_port, 0);
  int bridge_port = arlo::e2e::free_loopback_port();
  while (bridge_port == worker_port || bridge_port == worker_port + 1) bridge_port = arlo::e2e::free_loopback_port();
  std::vector<std::string> submit = {
      "/usr/bin/env",
      "SLURM_CONF=" + cluster.conf().string(),
      "ARLO_BIN=" + apps.string(),
      "ARLO_RUN_DIR=" + run_dir.string(),
      "ARLO_CONFIG=" + std::string(src) + "/configs/quickstart.yaml",
      "ARLO_ARGS=--set run.max_steps=" + std::to_string(steps) +
          " --set orchestrator.sft_warmup_steps=4 --set eval.interval=0 --set log.progress=false",
      "ARLO_BRIDGE_PORT=" + std::to_string(bridge_port),
      "ARLO_STATUS_PORT=0",
      "ARLO_WORKER_PORT=" + std::to_string(worker_port),
      find_program("sbatch"),
      "--parsable",
      "--output=" + job_out.string(),
      "--chdir=" + d.string(),
      std::string(src) + "/deploy/slurm/arlo.sbatch"};
  const Ran sb = run(submit, d / "sbatch.log");
  ASSERT_EQ(sb.status, 0) << "sbatch: " << sb.output << "\n" << cluster.logs();
  const std::string job = sb.output.substr(0, sb.output.find_first_of(";\n"));
  ASSERT_FALSE(job.empty());

  std::string state;
  for (const auto end = Clock::now() + 480s; !terminal(state = job_state(cluster, job));) {
    if (auto why = cluster.exited(); !why.empty()) FAIL() << "a daemon died during the job: " << why;
    if (Clock::now() > end) {
      FAIL() << "job " << job << " not done within 480 s (state " << state << "); its output:\n"
             << arlo::e2e::tail(arlo::e2e::read_text(job_out)) << "\n"
             << cluster.logs();
    }
    std::this_thread::sleep_for(500ms);
  }
  const std::string output = arlo::e2e::read_text(job_out);
  auto logs_of_run = [&] {
    std::string out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(run_dir / "logs", ec))
      if (e.path().extension() == ".log")
        out +=
            "--- " + e.path().filename().string() + "\n" + arlo::e2e::tail(arlo::e2e::read_text(e.path()), 2500) + "\n";
    return out;
  };
  ASSERT_EQ(state, "COMPLETED") << "job output:\n"
                                << arlo::e2e::tail(output) << "\n"
                                << logs_of_run() << cluster.logs();

  // The parts were placed by Slurm and addressed through what it set: the bridge on component 0's
  // node, the servers on component 1's node (NodeAddr, one port per task), the trainer on
  // component 2's node.
  const std::regex placed("orchestrator on n[1-3] \\(127\\.0\\.0\\.1:" + std::to_string(bridge_port) +
                          "\\), 2 server\\(s\\) \\[\"http://127\\.0\\.0\\.1:" + std::to_string(worker_port) +
                          "\",\"http://127\\.0\\.0\\.1:" + std::to_string(worker_port + 1) +
                          "\"\\], trainer: arlo-trainer on n[1-3],");
  EXPECT_TRUE(std::regex_search(output, placed)) << output;
  EXPECT_NE(output.find("2 worker(s) healthy"), std::string::npos) << output;
  EXPECT_EQ(output.find("left out of updates"), std::string::npos) << output;
  for (const std::string& log : {"server-" + job + "-0.log", "server-" + job + "-1.log", "trainer-" + job + ".log"})
    EXPECT_TRUE(fs::exists(run_dir / "logs" / log)) << log << "\n" << logs_of_run();

  // The run: every step, and every server on the trainer's last version (its checksum).
  const auto summary = nlohmann::json::parse(arlo::e2e::read_text(run_dir / "summary.json"), nullptr, false);
  ASSERT_FALSE(summary.is_discarded()) << "no summary.json in " << run_dir << "; job output:\n"
                                       << arlo::e2e::tail(output);
  EXPECT_TRUE(summary.at("ok").get<bool>()) << summary.dump(2);
  EXPECT_EQ(summary.at("steps").get<int>(), steps) << summary.dump(2);
  const auto& trainer = summary.at("trainer");
  ASSERT_EQ(trainer.at("version").get<std::int64_t>(), steps) << summary.dump(2);
  ASSERT_EQ(summary.at("workers").size(), 2u) << summary.dump(2);
  for (const auto& [name, w] : summary.at("workers").items()) {
    EXPECT_EQ(w.at("version").get<std::int64_t>(), steps) << name << ": " << summary.dump(2);
    EXPECT_EQ(w.at("checksum"), trainer.at("checksum")) << name << ": " << summary.dump(2);
  }
}

}  // namespace
