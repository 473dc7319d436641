// arlo-bench-sandbox: executions per second of one program run in the code_exec sandbox
// (rollout/sandbox.h: namespaces, read-only root, limits, output capture) against the same program
// started with a plain fork/exec (the same environment, output captured through a pipe, nothing
// else), with the same number of threads each starting one program at a time, in alternating
// rounds (so that a change in the machine's load falls on both sides). Two programs: a small Python program (the
// reward's case) and /bin/true (the sandbox's own cost, nothing to hide it). Prints the rates and
// their ratio (the target: at least 0.5x for Python on 2 cores). No thresholds.
//
//   arlo-bench-sandbox [--runs N] [--threads T]     defaults: 200 runs, 2 threads
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "rollout/sandbox.h"

namespace {

namespace fs = std::filesystem;
using arlo::rollout::Sandbox;
using arlo::rollout::SandboxRequest;

constexpr const char* kProgram = "total = sum(i * i for i in range(1000))\nprint(total)\n";

// One plain run: fork, exec with stdout on a pipe, read it to the end, wait. False when it failed.
bool plain_run(const std::vector<std::string>& argv, const std::string& cwd) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return false;
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], 1);
    if (::chdir(cwd.c_str()) != 0) ::_exit(126);
    // The sandbox's environment, so that both interpreters start alike (no user site-packages).
    const std::string home = "HOME=" + cwd, tmp = "TMPDIR=" + cwd;
    char* env[] = {const_cast<char*>("PATH=/usr/local/bin:/usr/bin:/bin"),
                   const_cast<char*>(home.c_str()),
                   const_cast<char*>(tmp.c_str()),
                   const_cast<char*>("LANG=C.UTF-8"),
                   const_cast<char*>("PYTHONDONTWRITEBYTECODE=1"),
                   nullptr};
    ::execve(args[0], args.data(), env);
    ::_exit(127);
  }
  ::close(fds[1]);
  char buf[4096];
  while (::read(fds[0], buf, sizeof buf) > 0) {
  }
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// Runs `one` `runs` times over `threads` threads; returns the seconds taken (negative when one failed).
template <typename Fn>
double timed(int runs, int threads, Fn one) {
  std::atomic<int> next{0};
  std::atomic<bool> failed{false};
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      while (next.fetch_add(1) < runs)
        if (!one()) failed = true;
    });
  for (auto& th : pool) th.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return failed ? -1.0 : s;
}

void compare(const char* name, int runs, int threads, const Sandbox& box, const std::vector<std::string>& argv,
             const std::string& dir, const std::string& file) {
  std::vector<std::string> plain_argv = argv;
  SandboxRequest req{argv, {}, "", false};
  if (!file.empty()) {
    plain_argv.push_back(dir + "/main.py");
    req.argv.push_back("main.py");
    req.files.push_back({"main.py", file});
  }
  const auto plain_one = [&] { return plain_run(plain_argv, dir); };
  const auto boxed_one = [&] {
    auto r = box.run(req);
    return r && r->exited_ok();
  };
  timed(threads * 2, threads, plain_one);  // warm the page cache
  constexpr int kRounds = 5;
  double plain_s = 0, boxed_s = 0;
  for (int round = 0; round < kRounds; ++round) {
    plain_s += timed(runs / kRounds, threads, plain_one);
    boxed_s += timed(runs / kRounds, threads, boxed_one);
  }
  const double plain = plain_s > 0 ? runs / plain_s : 0, boxed = boxed_s > 0 ? runs / boxed_s : 0;
  std::printf("%-12s plain fork/exec %8.1f runs/s   sandboxed %8.1f runs/s   ratio %.2fx\n", name, plain, boxed,
              plain > 0 ? boxed / plain : 0.0);
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 200, threads = 2;
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--runs")
      runs = std::atoi(argv[++i]);
    else if (a == "--threads")
      threads = std::atoi(argv[++i]);
  }
  auto box = Sandbox::create({});
  if (!box) {
    std::fprintf(stderr, "arlo-bench-sandbox: %s\n", box.error().what().c_str());
    return 1;
  }
  const fs::path dir = fs::temp_directory_path() / fmt::format("arlo_bench_sandbox_{}", ::getpid());
  fs::create_directories(dir);
  std::ofstream(dir / "main.py") << kProgram;
  std::printf("%d runs each, %d threads, %u cores\n", runs, threads, std::thread::hardware_concurrency());
  compare("python3", runs, threads, **box, {"/usr/bin/python3"}, dir.string(), kProgram);
  compare("/bin/true", runs, threads, **box, {"/bin/true"}, dir.string(), "");
  fs::remove_all(dir);
  return 0;
}
