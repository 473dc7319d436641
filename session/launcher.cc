#include "session/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

extern char** environ;

namespace arlo::session {

namespace {
std::mutex g_stdout_mu;

void default_sink(const std::string& name, const std::string& line) {
  std::lock_guard lock(g_stdout_mu);
  std::fprintf(stdout, "[%s] %s\n", name.c_str(), line.c_str());
  std::fflush(stdout);
}

// Reads `fd` until EOF and hands each complete line to `sink`.
void forward_lines(int fd, std::string name, Launcher::LineSink sink) {
  std::string pending;
  char buf[4096];
  while (true) {
    const auto n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buf, static_cast<std::size_t>(n));
    std::size_t pos;
    while ((pos = pending.find('\n')) != std::string::npos) {
      sink(name, pending.substr(0, pos));
      pending.erase(0, pos + 1);
    }
  }
  if (!pending.empty()) sink(name, pending);
  ::close(fd);
}
}  // namespace

std::string ChildExit::describe() const {
  if (WIFEXITED(status)) return fmt::format("{} (pid {}) exited with code {}", name, pid, WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("{} (pid {}) killed by signal {}", name, pid, WTERMSIG(status));
  return fmt::format("{} (pid {}) ended with status {}", name, pid, status);
}

Launcher::Launcher(LineSink sink) : sink_(sink ? std::move(sink) : LineSink(default_sink)) {}

Launcher::~Launcher() { stop(std::chrono::seconds(2)); }

Result<pid_t> Launcher::spawn(const ChildSpec& spec) {
  if (spec.argv.empty()) return make_error(ErrorCode::kInvalidArgument, fmt::format("{}: empty command", spec.name));
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0)
    return make_error(ErrorCode::kIo, fmt::format("{}: pipe: {}", spec.name, std::strerror(errno)));
  // Everything the child needs is prepared before fork (no allocation after it).
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const auto key = entry.substr(0, entry.find('='));
    if (!spec.env.count(key)) env_strings.push_back(entry);
  }
  for (const auto& [k, v] : spec.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<char*> argv;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // A group whose members all exited cannot be joined: start a new one.
  if (pgid_ != 0 && ::kill(-pgid_, 0) != 0) pgid_ = 0;
  const pid_t parent = ::getpid();
  const pid_t group = pgid_;

  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    return make_error(ErrorCode::kIo, fmt::format("{}: fork: {}", spec.name, std::strerror(errno)));
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls from here.
    ::setpgid(0, group);  // 0: become the leader of a new group (the first child)
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl took effect
    ::dup2(pipefd[1], STDOUT_FILENO);
    ::dup2(pipefd[1], STDERR_FILENO);
    ::execvpe(argv[0], argv.data(), envp.data());
    const char msg[] = "exec failed\n";
    (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
    ::_exit(127);
  }
  // Parent: set the group too (whichever runs first wins; both agree).
  ::setpgid(pid, group == 0 ? pid : group);
  if (pgid_ == 0) pgid_ = pid;
  ::close(pipefd[1]);
  auto child = std::make_unique<Child>();
  child->name = spec.name;
  child->pid = pid;
  child->reader = std::thread(forward_lines, pipefd[0], spec.name, sink_);
  children_.push_back(std::move(child));
  return pid;
}

std::optional<ChildExit> Launcher::exited() {
  for (auto& c : children_) {
    if (c->reaped) continue;
    int status = 0;
    const pid_t r = ::waitpid(c->pid, &status, WNOHANG);
    if (r == c->pid) {
      c->reaped = true;
      return ChildExit{c->name, c->pid, status};
    }
  }
  return std::nullopt;
}

std::vector<pid_t> Launcher::running() const {
  std::vector<pid_t> v;
  for (const auto& c : children_)
    if (!c->reaped) v.push_back(c->pid);
  return v;
}

void Launcher::stop(std::chrono::milliseconds grace) {
  if (pgid_ != 0) {
    ::kill(-pgid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + grace;
    while (std::chrono::steady_clock::now() < deadline) {
      while (exited()) {
      }
      // The group is empty when kill(-pgid, 0) fails: grandchildren count too.
      if (running().empty() && ::kill(-pgid_, 0) != 0) break;
      ::usleep(10000);
    }
    ::kill(-pgid_, SIGKILL);
    pgid_ = 0;  // stopped: a later stop() (the destructor's) has nothing to signal
  }
  for (auto& c : children_) {
    if (!c->reaped) {
      int status = 0;
      ::waitpid(c->pid, &status, 0);
      c->reaped = true;
    }
    if (c->reader.joinable()) c->reader.join();
  }
}

int RestartPolicy::recent(orch::TimePoint now) {
  std::erase_if(restarts_, [&](orch::TimePoint t) { return now - t >= limits_.window; });
  return static_cast<int>(restarts_.size());
}

std::optional<orch::Duration> RestartPolicy::on_exit(orch::TimePoint now) {
  const int n = recent(now);
  if (n >= limits_.max_restarts) return std::nullopt;
  orch::Duration backoff = limits_.initial_backoff;
  for (int i = 0; i < n && backoff < limits_.max_backoff; ++i) backoff *= 2;
  restarts_.push_back(now);
  ++total_;
  return std::min(backoff, limits_.max_backoff);
}

Result<std::uint16_t> free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return make_error(ErrorCode::kIo, fmt::format("socket: {}", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    auto e = make_error(ErrorCode::kIo, fmt::format("binding 127.0.0.1:0: {}", std::strerror(errno)));
    ::close(fd);
    return e;
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace arlo::session
