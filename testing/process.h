#pragma once
// For the e2e tests and benchmarks that drive real processes:
// - spawn_logged starts argv[0] (a path) as a child whose stdout and stderr go to `log`, and which
//   dies with the test (PR_SET_PDEATHSIG). Returns its pid (-1 if fork failed); the caller waits for
//   it. Exit status 126: the log could not be opened; 127: the program could not start.
// - wait_for_text polls a log file until it holds a text (or the deadline, or the process exited).
// - child_with_arg finds the child of a process whose command line holds a text.
// - arlo_run_argv is the command line of `arlo run` with --set overrides; run_to_end runs a command
//   line to its end and returns its status and output.
#include <sys/prctl.h>
#include <unistd.h>

#include <sys/wait.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <sys/socket.h>

#include <nlohmann/json.hpp>

namespace arlo::e2e {

inline pid_t spawn_logged(const std::vector<std::string>& args, const std::filesystem::path& log) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  std::FILE* f = std::fopen(log.c_str(), "w");
  if (!f) ::_exit(126);
  ::dup2(::fileno(f), 1);
  ::dup2(::fileno(f), 2);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execv(argv[0], argv.data());
  ::_exit(127);
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// True once `log` contains `text`; false at `timeout` or when `pid` exited (it is not reaped).
inline bool wait_for_text(const std::filesystem::path& log, const std::string& text, pid_t pid,
                          std::chrono::seconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (read_text(log).find(text) != std::string::npos) return true;
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// The child of `parent` whose command line contains `needle` (its arguments joined by spaces);
// -1 when there is none.
inline pid_t child_with_arg(pid_t parent, const std::string& needle) {
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(parent) + "/task", ec)) {
    std::stringstream children(read_text(task.path() / "children"));
    for (pid_t child; children >> child;) {
      std::string cmdline = read_text("/proc/" + std::to_string(child) + "/cmdline");
      for (auto& c : cmdline)
        if (c == '\0') c = ' ';
      if (cmdline.find(needle) != std::string::npos) return child;
    }
  }
  return -1;
}

// The records of a .jsonl file; a line still being written (not whole JSON yet) is skipped.
inline std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& p) {
  std::vector<nlohmann::json> out;
  std::ifstream in(p);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded()) out.push_back(std::move(j));
  }
  return out;
}

// A free loopback TCP port: bound, read back and released (another process could take it in
// between, which on a test machine does not happen in practice).
inline int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

// A fresh, empty directory <temp dir>/<name>_<pid> (what an earlier run of the test left there is
// removed), for one test's files.
inline std::filesystem::path fresh_temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// The command line of `arlo run <config>` for the arlo binary at `arlo` (ARLO_BINARY), each of `sets`
// ("key=value") given as one --set, in order.
inline std::vector<std::string> arlo_run_argv(const std::string& arlo, const std::string& config,
                                              const std::vector<std::string>& sets) {
  std::vector<std::string> argv = {arlo, "run", config};
  for (const auto& s : sets) argv.insert(argv.end(), {"--set", s});
  return argv;
}

// A command run to its end: its wait status and everything it printed.
struct Ended {
  int status = -1;
  std::string output;
  bool exited_with(int code) const { return WIFEXITED(status) && WEXITSTATUS(status) == code; }
};

// Runs `args` (spawn_logged) to its end with its output in `log`, which is removed after it was read;
// the child's pid goes to `child` as soon as it runs.
inline Ended run_to_end(const std::vector<std::string>& args, const std::filesystem::path& log,
                        pid_t* child = nullptr) {
  Ended out;
  const pid_t pid = spawn_logged(args, log);
  if (child) *child = pid;
  ::waitpid(pid, &out.status, 0);
  out.output = read_text(log);
  std::filesystem::remove(log);
  return out;
}

// The end of a log, for a failure message.
inline std::string tail(const std::string& s, std::size_t n = 6000) {
  return s.size() > n ? s.substr(s.size() - n) : s;
}

}  // namespace arlo::e2e
