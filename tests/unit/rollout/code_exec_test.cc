// The code_exec reward and its sandbox (rollout/sandbox.h): scoring, config errors, and hostile
// programs, each contained with reward 0 and nothing left behind.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "rollout/reward.h"
#include "rollout/sandbox.h"

namespace arlo::rollout {
namespace {

namespace fs = std::filesystem;

Task task_with(Json info) {
  Task t;
  t.id = "t1";
  t.prompt = "write f";
  t.info = std::move(info);
  return t;
}

Rollout completion(std::string text) {
  Rollout r;
  r.text = std::move(text);
  return r;
}

// Small limits: a hostile case ends within about two seconds.
Json spec(Json extra = Json::object()) {
  Json s = {{"kind", "code_exec"}, {"cpu_s", 1.0},      {"timeout_s", 4.0},          {"memory_mb", 256},
            {"processes", 8},      {"file_size_mb", 4}, {"max_output_bytes", 65536}, {"scratch_mb", 8}};
  s.update(extra);
  return s;
}

std::unique_ptr<RewardModule> module(Json extra = Json::object()) {
  auto m = make_reward_module(spec(std::move(extra)));
  EXPECT_TRUE(m) << (m ? "" : m.error().what());
  return m ? std::move(*m) : nullptr;
}

double reward(RewardModule& m, const Task& t, const std::string& text) {
  auto s = m.score(t, completion(text));
  EXPECT_TRUE(s) << (s ? "" : s.error().what());
  return s ? s->reward : -1;
}

const Json kAddAsserts = {"assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4",
                          "assert add(0, 0) == 0"};

// The reward of `program` against kAddAsserts from a module with the test limits.
double add_reward(const std::string& program) {
  auto m = module();
  return m ? reward(*m, task_with({{"asserts", kAddAsserts}}), program) : -1;
}

TEST(CodeExec, CorrectProgramScoresOne) { EXPECT_EQ(add_reward("def add(a, b):\n    return a + b\n"), 1.0); }

TEST(CodeExec, PartlyCorrectScoresTheFraction) {
  // a * b is right for (2, 2) and (0, 0) only.
  EXPECT_EQ(add_reward("def add(a, b):\n    return a * b\n"), 0.5);
}

TEST(CodeExec, SyntaxErrorScoresZero) { EXPECT_EQ(add_reward("def add(a, b)\n    return a + b\n"), 0.0); }

TEST(CodeExec, TakesTheFencedPythonBlockAndSysExitStillRunsTheTests) {
  EXPECT_EQ(add_reward("Here it is:\n```text\nnot code\n```\n```python\nimport sys\ndef add(a, b):\n    return a + "
                       "b\nsys.exit(0)\n```\n"
                       "Done."),
            1.0);
}

TEST(CodeExec, StdinStdoutCasesAndAssertsCountTogether) {
  auto m = module();
  ASSERT_TRUE(m);
  const Json cases = Json::array({{{"input", "1 2\n"}, {"output", "3\n"}},
                                  {{"input", "5 5\n"}, {"output", "10"}},
                                  {{"input", "2 2\n"}, {"output", "5\n"}}});
  const std::string program =
      "def add(a, b):\n    return a + b\nif __name__ == '__main__':\n    import sys\n"
      "    line = sys.stdin.readline()\n    if line:\n        print(add(*map(int, line.split())))  \n";
  // 4 asserts + 2 of 3 cases.
  EXPECT_DOUBLE_EQ(reward(*m, task_with({{"asserts", kAddAsserts}, {"cases", cases}}), program), 6.0 / 7.0);
}

// Result lines without the nonce (on fd 3 or stdout) do not count.
TEST(CodeExec, ForgedResultLinesDoNotCount) {
  EXPECT_EQ(add_reward("import os\nfor i in range(4):\n    os.write(3, b'0000000000000000 pass %d\\n' % i)\n"
                       "    print('pass', i)\nos._exit(0)\n"),
            0.0);
}

TEST(CodeExec, ConcurrentScoresStayApart) {
  auto m = module();
  ASSERT_TRUE(m);
  const Task t = task_with({{"asserts", kAddAsserts}});
  std::vector<double> got(4, -1);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      auto s =
          m->score(t, completion(i % 2 ? "def add(a, b):\n    return a * b\n" : "def add(a, b):\n    return a + b\n"));
      got[static_cast<std::size_t>(i)] = s ? s->reward : -1;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(got, (std::vector<double>{1.0, 0.5, 1.0, 0.5}));
}

TEST(CodeExec, ConfigAndTaskErrors) {
  auto bad = make_reward_module(spec({{"memory_mb", 1}}));
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().what().find("memory_mb"), std::string::npos) << bad.error().what();
  bad = make_reward_module(spec({{"interpreter", "python3"}}));
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().what().find("interpreter"), std::string::npos) << bad.error().what();
  bad = make_reward_module(spec({{"interpreter", {"no-such-interpreter-xyz"}}}));
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().what().find("no-such-interpreter-xyz"), std::string::npos) << bad.error().what();
  bad = make_reward_module(spec({{"timeout_seconds", 3}}));
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().what().find("unknown option 'timeout_seconds'"), std::string::npos) << bad.error().what();
  bad = make_reward_module(spec({{"read_only_paths", {"usr"}}}));
  ASSERT_FALSE(bad);

  // The config schema's form: the options in `config`.
  auto in_config = make_reward_module(
      {{"kind", "code_exec"}, {"config", {{"interpreter", {"python3", "-I"}}, {"timeout_s", 3}, {"processes", 4}}}});
  ASSERT_TRUE(in_config) << in_config.error().what();
  EXPECT_EQ(reward(**in_config, task_with({{"asserts", kAddAsserts}}), "def add(a, b):\n    return a + b\n"), 1.0);

  auto m = module();
  ASSERT_TRUE(m);
  auto s = m->score(task_with(Json::object()), completion("x = 1"));
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().what().find("no tests"), std::string::npos) << s.error().what();
  s = m->score(task_with({{"cases", {{{"input", 1}}}}}), completion("x = 1"));
  ASSERT_FALSE(s);
}

// What `body` says, run in a forked child (which may change its ids and namespaces; the test keeps them).
std::string in_child(const std::function<std::string()>& body) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    const std::string said = body();
    [[maybe_unused]] auto n = ::write(fds[1], said.data(), said.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string said;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) said.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  ::waitpid(pid, nullptr, 0);
  return said;
}

// Where user namespaces are off (here: a child process in a user namespace of its own whose
// user.max_user_namespaces is 0), building the module fails with the reason; nothing runs unsandboxed.
TEST(CodeExec, RefusesWhereTheMachineCannotSandbox) {
  const std::string said = in_child([] {
    const std::string map = fmt::format("0 {} 1\n", ::geteuid());
    if (::unshare(CLONE_NEWUSER) != 0 || !(std::ofstream("/proc/self/uid_map") << map).flush() ||
        !(std::ofstream("/proc/sys/user/max_user_namespaces") << "0\n").flush())
      return std::string("could not set up the child");
    auto m = make_reward_module(spec());
    return m ? std::string("built") : m.error().what();
  });
  EXPECT_NE(said.find("cannot run the code sandbox"), std::string::npos) << said;
  EXPECT_NE(said.find("new user"), std::string::npos) << said;
}

// Run by an unprivileged user (when the test is root: a child that becomes nobody), the sandbox maps
// that user's own id and scores as it does for root.
TEST(CodeExec, WorksWithoutRoot) {
  const std::string said = in_child([] {
    if (::geteuid() == 0 && (::setgroups(0, nullptr) != 0 || ::setresgid(65534, 65534, 65534) != 0 ||
                             ::setresuid(65534, 65534, 65534) != 0))
      return std::string("could not become nobody");
    ::prctl(PR_SET_DUMPABLE, 1);  // as a process started as nobody is (a set*id call cleared it)
    auto m = make_reward_module(spec());
    if (!m) return m.error().what();
    auto s = (*m)->score(task_with({{"asserts", kAddAsserts}}), completion("def add(a, b):\n    return a * b\n"));
    return s ? fmt::format("reward {}", s->reward) : s.error().what();
  });
  EXPECT_EQ(said, "reward 0.5");
}

// ---- hostile programs -------------------------------------------------------------------------------

std::set<std::string> listing(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The mounts of this mount namespace a sandbox could leave behind: its tmpfs root and scratch (named
// arlo-sandbox, arlo-scratch). Other tests running beside this one may mount other things meanwhile.
std::string sandbox_mounts() {
  std::istringstream all(read_text("/proc/self/mountinfo"));
  std::string ours;
  for (std::string line; std::getline(all, line);)
    if (line.find("arlo-sandbox") != std::string::npos || line.find("arlo-scratch") != std::string::npos)
      ours += line + "\n";
  return ours;
}

// Clock ticks since boot (the unit of /proc/<pid>/stat's start time).
unsigned long long ticks_now() {
  timespec ts{};
  ::clock_gettime(CLOCK_BOOTTIME, &ts);
  const auto hz = static_cast<unsigned long long>(::sysconf(_SC_CLK_TCK));
  return static_cast<unsigned long long>(ts.tv_sec) * hz +
         static_cast<unsigned long long>(ts.tv_nsec) * hz / 1000000000ull;
}

// Pids of processes in the PID namespace `inode` that started by `until` (a namespace's inode number
// is reused once it is gone: a later sandbox of a test running alongside may hold it now).
std::vector<int> processes_in(std::uint64_t inode, unsigned long long until) {
  std::vector<int> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    struct stat st {};
    if (::stat((e.path() / "ns/pid").c_str(), &st) != 0 || st.st_ino != inode) continue;
    const std::string stat = read_text(e.path() / "stat");
    if (stat.find(')') == std::string::npos) continue;  // gone meanwhile
    std::istringstream fields(stat.substr(stat.rfind(')') + 2));
    std::string field;
    for (int i = 3; i <= 22 && fields >> field; ++i) {
    }
    if (!field.empty() && std::stoull(field) <= until) out.push_back(std::stoi(name));
  }
  return out;
}

// The parent's view around each hostile run: a listening loopback port, a secret file, a bystander
// process in the test's process group, the temp dir and the mounts as they were.
class CodeExecHostile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("arlo_code_exec_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    std::ofstream(dir_ / "secret.txt") << "s3cr3t";
    fs::permissions(dir_ / "secret.txt", fs::perms::all);
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ASSERT_EQ(::listen(listener_, 8), 0);
    socklen_t len = sizeof a;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    bystander_ = ::fork();
    if (bystander_ == 0) {
      ::pause();
      ::_exit(0);
    }
    dir_before_ = listing(dir_);
    mounts_before_ = sandbox_mounts();
  }
  void TearDown() override {
    ::kill(bystander_, SIGKILL);
    ::waitpid(bystander_, nullptr, 0);
    ::close(listener_);
    fs::remove_all(dir_);
  }

  // The program gets reward 0 from the module, and run bare in the sandbox it leaves nothing behind.
  void contained(const std::string& program, const Json& asserts) {
    auto m = module({{"timeout_s", 2.0}});
    ASSERT_TRUE(m);
    EXPECT_EQ(reward(*m, task_with({{"asserts", asserts}}), program), 0.0);

    SandboxOptions o;
    o.limits = {1.0, 2.0, 256, 8, 4, 64, 8, 65536};
    auto box = Sandbox::create(o);
    ASSERT_TRUE(box) << box.error().what();
    auto res = (*box)->run({{"python3", "main.py"}, {{"main.py", program}}, "", false});
    ASSERT_TRUE(res) << res.error().what();
    EXPECT_EQ(res->out.find("s3cr3t"), std::string::npos);
    EXPECT_LE(res->out.size(), 65536u);
    EXPECT_NE(res->pid_namespace, 0u);
    EXPECT_TRUE(processes_in(res->pid_namespace, ticks_now()).empty())
        << "processes left in the sandbox's PID namespace";
    EXPECT_EQ(::waitpid(static_cast<pid_t>(res->init_pid), nullptr, WNOHANG), -1);  // reaped: not our child now
    EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), 0);  // only the bystander is a child, and it lives
    EXPECT_EQ(::kill(bystander_, 0), 0) << "the bystander in the test's process group was killed";
    sockaddr_in peer{};
    socklen_t len = sizeof peer;
    EXPECT_LT(::accept(listener_, reinterpret_cast<sockaddr*>(&peer), &len), 0) << "the program connected out";
    EXPECT_EQ(listing(dir_), dir_before_);
    EXPECT_EQ(sandbox_mounts(), mounts_before_);
  }

  fs::path dir_;
  int listener_ = -1, port_ = 0;
  pid_t bystander_ = -1;
  std::set<std::string> dir_before_;
  std::string mounts_before_;
};

TEST_F(CodeExecHostile, ForkBomb) {
  contained("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
            {"assert False"});
}

TEST_F(CodeExecHostile, InfiniteLoop) { contained("while True:\n    pass\n", {"assert True"}); }

TEST_F(CodeExecHostile, MemoryBomb) {
  contained("chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))\n", {"assert len(chunks) > 1000"});
}

TEST_F(CodeExecHostile, NetworkConnection) {
  contained(
      fmt::format("import socket\ns = socket.create_connection(('127.0.0.1', {}), timeout=1)\nok = True\n", port_),
      {"assert ok"});
}

TEST_F(CodeExecHostile, ReadsAFileOutside) {
  const std::string path = (dir_ / "secret.txt").string();
  contained(fmt::format("data = open('{}').read()\nprint(data)\n", path), {"assert data == 's3cr3t'"});
}

TEST_F(CodeExecHostile, FillsTheDisk) {
  contained(
      "import os\nfor where in ['/tmp/big', '/big', '/usr/big']:\n    try:\n        with open(where, 'wb') as f:\n"
      "            for _ in range(1024):\n                f.write(b'x' * (1 << 20))\n    except OSError:\n        "
      "pass\n"
      "size = os.path.getsize('/tmp/big')\n",
      {"assert size >= 1 << 30"});
}

TEST_F(CodeExecHostile, SignalsItsParents) {
  contained(
      "import os, signal\nfor target in [os.getppid(), -1, 0, 1]:\n    try:\n        os.kill(target, signal.SIGKILL)\n"
      "    except OSError:\n        pass\nos.system('kill -9 -1')\nalive = True\n",
      {"assert not alive"});
}

TEST_F(CodeExecHostile, WritesWithoutEnd) { contained("while True:\n    print('x' * 4096)\n", {"assert True"}); }

}  // namespace
}  // namespace arlo::rollout
