// Simulated hosts for the cluster tests and the shaped-link benchmark: each host is a Linux network
// namespace with one veth link into a bridge in the root namespace, its own IPv4 address, and a link
// shaped by tc on both ends (tbf: bandwidth) or cut (link down).
//
// Needs root (CAP_NET_ADMIN) and iproute2 (`ip`, `tc`); Cluster::unavailable() says why not, and the
// tests skip with that reason. Names carry the creating process's pid ("arlo<pid>h<i>", bridge
// "arlo<pid>br"), so parallel tests never collide; the destructor removes every namespace, veth and
// the bridge it made, also when the test failed, and create() first removes what a killed earlier
// process with the same prefix left behind.
//
// What the kernel here cannot do: this machine's kernel has no sch_netem, so latency is not
// simulated (LinkShape::delay_ms must be 0 where netem is missing: create() says so), and loss is
// made with iptables' statistic match inside the host's namespace (LinkShape::loss_pct).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"

namespace arlo::cluster {

struct LinkShape {
  double rate_mbit = 0;  // per direction; 0 = unshaped
  double delay_ms = 0;   // one way, each direction; needs sch_netem
  double loss_pct = 0;   // packets dropped at random in each direction, 0-100
};

class Cluster {
 public:
  // Empty when hosts can be made here; otherwise the reason (not root, no `ip`, no netns support).
  static std::string unavailable();

  // `hosts` namespaces on 10.<subnet>.0.0/24 (subnet derived from the pid), host i at 10.<s>.0.<i+1>,
  // every link shaped as `shape`.
  static Result<std::unique_ptr<Cluster>> create(int hosts, LinkShape shape = {});
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  int size() const { return static_cast<int>(hosts_.size()); }
  const std::string& address(int host) const;  // "10.s.0.(host+1)"
  const std::string& netns(int host) const;    // the namespace's name
  // argv prefix that runs a program inside the host: {"ip", "netns", "exec", name}.
  std::vector<std::string> exec_prefix(int host) const;
  // `argv` inside the host, stdout and stderr appended to `log`; the child's pid (ip netns exec
  // execs the program, so the pid is the program's). The child gets SIGKILL when the thread that
  // spawned it exits (PR_SET_PDEATHSIG): a test that dies leaves no process behind.
  Result<pid_t> spawn(int host, const std::vector<std::string>& argv, const std::string& log,
                      const std::vector<std::pair<std::string, std::string>>& env = {}) const;

  Status shape(int host, LinkShape shape);  // replaces the host's qdiscs and loss rules
  Status link_down(int host);               // the host's veth down: nothing in or out
  Status link_up(int host);

 private:
  Cluster() = default;
  struct Host {
    std::string name, address, veth;
    bool lossy = false;  // iptables drop rules are in place
  };
  std::string prefix_, bridge_;
  int subnet_ = 0;
  std::vector<Host> hosts_;
};

}  // namespace arlo::cluster
