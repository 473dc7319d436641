#include "testing/netns.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <regex>
#include <sstream>

#include <fmt/format.h>

namespace arlo::cluster {
namespace {

struct Output {
  int status = -1;
  std::string text;  // stdout and stderr together
};

// Runs argv (a program on PATH) to completion; its output is captured, never shown.
Output run(const std::vector<std::string>& argv) {
  Output out;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return {-1, std::string("pipe: ") + std::strerror(errno)};
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return {-1, std::string("fork: ") + std::strerror(errno)};
  }
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    ::execvp(args[0], args.data());
    const char msg[] = "exec failed: program not found\n";
    [[maybe_unused]] auto n = ::write(2, msg, sizeof msg - 1);
    ::_exit(127);
  }
  ::close(fds[1]);
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.text.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  out.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

std::string joined(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

Status must(const std::vector<std::string>& argv) {
  const auto out = run(argv);
  if (out.status == 0) return {};
  std::string text = out.text;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return make_error(ErrorCode::kIo, fmt::format("`{}` failed (exit {}): {}", joined(argv), out.status, text));
}

bool alive(long pid) { return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM); }

// Namespaces and links named arlo<pid>... whose process is gone: left by a test that was killed
// (a ctest timeout) before its destructor ran.
void remove_leftovers() {
  const std::regex ns_re(R"(^arlo(\d+)h\d+)"), link_re(R"(^\d+: (arlo(\d+)(?:br|v\d+))[@:])");
  std::stringstream ns(run({"ip", "netns", "list"}).text);
  for (std::string line; std::getline(ns, line);) {
    std::smatch m;
    if (std::regex_search(line, m, ns_re) && !alive(std::stol(m[1])))
      run({"ip", "netns", "del", line.substr(0, line.find(' '))});
  }
  std::stringstream links(run({"ip", "-o", "link", "show"}).text);
  for (std::string line; std::getline(links, line);) {
    std::smatch m;
    if (std::regex_search(line, m, link_re) && !alive(std::stol(m[2]))) run({"ip", "link", "del", m[1]});
  }
}

std::string rate(double mbit) { return fmt::format("{}kbit", static_cast<long long>(std::llround(mbit * 1000))); }

// The qdisc of one direction: tbf for bandwidth alone; netem where a delay is asked for. The tbf
// bucket holds 10 ms at the rate (at least 64 KiB, one GSO segment), so timer granularity does not
// cap the rate; its queue holds 100 ms, so TCP sees queueing, not drops.
std::vector<std::string> qdisc(LinkShape s) {
  if (s.delay_ms > 0) {
    std::vector<std::string> q = {"netem", "delay", fmt::format("{}us", std::llround(s.delay_ms * 1000)), "limit",
                                  "100000"};
    if (s.rate_mbit > 0) q.insert(q.end(), {"rate", rate(s.rate_mbit)});
    return q;
  }
  const auto burst = std::max<long long>(64 << 10, std::llround(s.rate_mbit * 1e6 / 8 / 100));
  return {"tbf", "rate", rate(s.rate_mbit), "burst", std::to_string(burst), "latency", "100ms"};
}

}  // namespace

std::string Cluster::unavailable() {
  if (::geteuid() != 0) return "simulated hosts need root (network namespaces, veth, tc)";
  if (run({"ip", "-V"}).status != 0) return "simulated hosts need `ip` from iproute2 (scripts/bootstrap installs it)";
  if (run({"tc", "-V"}).status != 0) return "simulated hosts need `tc` from iproute2 (scripts/bootstrap installs it)";
  const std::string probe = fmt::format("arlo{}probe", ::getpid());
  if (const auto out = run({"ip", "netns", "add", probe}); out.status != 0)
    return "network namespaces cannot be made here: " + out.text;
  run({"ip", "netns", "del", probe});
  return "";
}

Result<std::unique_ptr<Cluster>> Cluster::create(int hosts, LinkShape shape) {
  if (hosts < 1 || hosts > 200)
    return make_error(ErrorCode::kInvalidArgument, fmt::format("hosts must be 1-200, not {}", hosts));
  if (const auto why = unavailable(); !why.empty()) return make_error(ErrorCode::kUnavailable, why);
  remove_leftovers();
  std::unique_ptr<Cluster> c(new Cluster());
  const int pid = ::getpid();
  c->prefix_ = fmt::format("arlo{}", pid);
  c->bridge_ = c->prefix_ + "br";
  c->subnet_ = pid % 250;
  ARLO_TRY(must({"ip", "link", "add", c->bridge_, "type", "bridge"}));
  ARLO_TRY(must({"ip", "link", "set", c->bridge_, "up"}));
  for (int i = 0; i < hosts; ++i) {
    Host h{fmt::format("{}h{}", c->prefix_, i),
           fmt::format("10.{}.{}.{}", 100 + c->subnet_ / 100, c->subnet_ % 100, i + 1),
           fmt::format("{}v{}", c->prefix_, i)};
    c->hosts_.push_back(h);  // before it exists: the destructor removes what was made of it
    ARLO_TRY(must({"ip", "netns", "add", h.name}));
    ARLO_TRY(must({"ip", "link", "add", h.veth, "type", "veth", "peer", "name", "eth0", "netns", h.name}));
    ARLO_TRY(must({"ip", "link", "set", h.veth, "master", c->bridge_, "up"}));
    ARLO_TRY(must({"ip", "-n", h.name, "addr", "add", h.address + "/24", "dev", "eth0"}));
    ARLO_TRY(must({"ip", "-n", h.name, "link", "set", "eth0", "up"}));
    ARLO_TRY(must({"ip", "-n", h.name, "link", "set", "lo", "up"}));
    if (shape.rate_mbit > 0 || shape.delay_ms > 0 || shape.loss_pct > 0) ARLO_TRY(c->shape(i, shape));
  }
  return c;
}

Cluster::~Cluster() {
  for (const auto& h : hosts_) {
    run({"ip", "link", "del", h.veth});  // both ends, even while processes keep the namespace alive
    run({"ip", "netns", "del", h.name});
  }
  if (!bridge_.empty()) run({"ip", "link", "del", bridge_});
}

const std::string& Cluster::address(int host) const { return hosts_.at(static_cast<std::size_t>(host)).address; }
const std::string& Cluster::netns(int host) const { return hosts_.at(static_cast<std::size_t>(host)).name; }

std::vector<std::string> Cluster::exec_prefix(int host) const { return {"ip", "netns", "exec", netns(host)}; }

Result<pid_t> Cluster::spawn(int host, const std::vector<std::string>& argv, const std::string& log,
                             const std::vector<std::pair<std::string, std::string>>& env) const {
  if (argv.empty()) return make_error(ErrorCode::kInvalidArgument, "spawn: empty argv");
  // Everything the child needs is made before fork: after it only async-signal-safe calls run.
  const std::string ns_path = "/var/run/netns/" + netns(host);
  const int ns_fd = ::open(ns_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (ns_fd < 0) return make_error(ErrorCode::kIo, fmt::format("open {}: {}", ns_path, std::strerror(errno)));
  const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    ::close(ns_fd);
    return make_error(ErrorCode::kIo, fmt::format("open {}: {}", log, std::strerror(errno)));
  }
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    const std::string s(*e);
    const auto key = s.substr(0, s.find('='));
    if (std::none_of(env.begin(), env.end(), [&](const auto& kv) { return kv.first == key; })) env_strings.push_back(s);
  }
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  for (const auto& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
  args.push_back(nullptr);
  envp.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a test that dies takes its hosts' processes with it
    if (::setns(ns_fd, CLONE_NEWNET) != 0) ::_exit(126);
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    ::execvpe(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(ns_fd);
  ::close(log_fd);
  if (pid < 0) return make_error(ErrorCode::kIo, fmt::format("fork: {}", std::strerror(fork_errno)));
  return pid;
}

Status Cluster::shape(int host, LinkShape s) {
  const auto& h = hosts_.at(static_cast<std::size_t>(host));
  // Into the host: the bridge side's egress; out of it: the host's own eth0.
  for (auto dev : {std::vector<std::string>{"tc", "qdisc"},
                   std::vector<std::string>{"ip", "netns", "exec", h.name, "tc", "qdisc"}}) {
    const std::string name = dev.size() == 2 ? h.veth : "eth0";
    if (s.rate_mbit <= 0 && s.delay_ms <= 0) {
      auto del = dev;
      del.insert(del.end(), {"del", "dev", name, "root"});
      run(del);  // no qdisc to remove is fine
      continue;
    }
    dev.insert(dev.end(), {"replace", "dev", name, "root"});
    for (auto& a : qdisc(s)) dev.push_back(a);
    if (auto r = must(dev); !r) {
      if (s.delay_ms > 0)
        return make_error(
            ErrorCode::kUnavailable,
            "a link delay needs the kernel's sch_netem, which this kernel lacks (" + r.error().what() + ")");
      return r;
    }
  }
  const std::vector<std::string> ipt = {"ip", "netns", "exec", h.name, "iptables"};
  auto with = [&](std::vector<std::string> tail) {
    auto v = ipt;
    v.insert(v.end(), tail.begin(), tail.end());
    return v;
  };
  if (s.loss_pct > 0 || h.lossy) {
    ARLO_TRY(must(with({"-F", "INPUT"})));
    ARLO_TRY(must(with({"-F", "OUTPUT"})));
  }
  if (s.loss_pct > 0) {
    const auto p = fmt::format("{:.6f}", s.loss_pct / 100.0);
    ARLO_TRY(must(
        with({"-A", "INPUT", "-i", "eth0", "-m", "statistic", "--mode", "random", "--probability", p, "-j", "DROP"})));
    ARLO_TRY(must(
        with({"-A", "OUTPUT", "-o", "eth0", "-m", "statistic", "--mode", "random", "--probability", p, "-j", "DROP"})));
  }
  hosts_.at(static_cast<std::size_t>(host)).lossy = s.loss_pct > 0;
  return {};
}

Status Cluster::link_down(int host) {
  return must({"ip", "link", "set", hosts_.at(static_cast<std::size_t>(host)).veth, "down"});
}
Status Cluster::link_up(int host) {
  return must({"ip", "link", "set", hosts_.at(static_cast<std::size_t>(host)).veth, "up"});
}

}  // namespace arlo::cluster
