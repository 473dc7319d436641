// arlo-bench-weight-sync (`arlo bench weight-sync`): moves a synthetic Qwen3-shaped model (bf16 by
// default) from one sender process to N receiver processes through every registered weight_sync
// transport (weight_sync::transports(), or the ones --transport names), and measures, in the same
// run, the baselines the numbers mean something against:
//   memcpy        one thread copying the same bytes between two warm buffers
//   socket blast  the same bytes over one loopback TCP connection, large writes, no protocol
//   fs write+read writing the bytes to a file and reading them back (page cache)
//   gloo          torch.distributed broadcast (gloo backend) to the same number of receivers
// Every side is its own process (fork), weights are warm (touched) before timing, and each
// transport moves version 1 untimed and version 2 timed (for delta: 2 = 1 with --delta-density of
// the elements changed). Time = from the sender starting publish(2) to the last receiver holding it
// (CLOCK_MONOTONIC is shared by the processes). Prints peak RSS per side and the receiver bound,
// the data path the receivers took, and CPU seconds per version on each side (what a path costs,
// whatever else the machine is doing). Star runs for every transport; chain (each receiver serves
// the next) for every transport whose descriptor relays. Receivers learn where to connect the way
// workers do: from the sender's endpoint object (or the upstream relay's), never from a name.
// Then the stall table: a trainer stages --versions versions through a StagingPublisher while the
// receivers pull each announced one; per version, how long stage() held the trainer against the
// staging copy it reports and an independent memcpy, and the time until every receiver held it.
// With --cluster it prints only the shaped-link table instead: the sender in simulated host 0 and
// each receiver in a host of its own (network namespaces, testing/netns.h), every link shaped
// to --link-mbit; star, chain and the gloo peer at 1, 2 and 4 receivers against the link limit.
// The output is described in bench/weight_sync/README.md.
#include <fcntl.h>
#include <errno.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/auth.h"
#include "testing/process.h"
#include "testing/netns.h"
#include "weight_sync/qwen3.h"
#include "weight_sync/staging.h"
#include "weight_sync/transport.h"
#include "weight_sync/weight_sync.h"

namespace ws = arlo::weight_sync;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string model = "qwen3-0.6b";
  double scale = 0.1;  // ~130 MB: the default run takes a few minutes on a loaded 2-core machine
  std::string dtype = "bf16";
  std::string transports;  // empty: every registered transport
  int receivers = 3;
  std::string payload = "full";
  bool zstd = false;
  std::uint64_t bucket_mb = 256;
  double delta_density = 0.01;
  std::string topology = "both";
  std::string mode = "in_place";
  std::string shm_read = "default";  // shm: default | direct (process_vm_readv) | channel (ring or slots)
  bool gloo = true;
  bool baselines = true;
  bool transfer = true;                     // the Publisher table (star, chain)
  bool stall = true;                        // the StagingPublisher table
  bool arlo_run = true;                     // star vs chain in `arlo run` with 3 embedded arlo-workers
  int versions = 5;                         // stall table: versions the trainer stages
  int step_ms = 500;                        // stall table: the trainer's step (one stage() per step)
  int repeat = 3;                           // timed repetitions; the best is reported (the machine is shared)
  bool cluster = false;                     // the shaped-link table between simulated hosts
  double link_mbit = 2000;                  // --cluster: every host's link, each direction
  double link_delay_ms = 0.5;               // --cluster: one way (needs the kernel's sch_netem)
  std::string cluster_receivers = "1,2,4";  // --cluster: receiver counts
};
int g_repeat = 3;

// --cluster: the simulated hosts (host 0 holds the sender, host k + 1 receiver k or gloo rank
// k + 1). Empty otherwise: every process stays on this host's loopback.
struct SimHost {
  std::string netns_path;  // the network namespace, as `ip netns` keeps it
  std::string address;     // the host's address on its shaped link
};
std::vector<SimHost> g_hosts;
volatile std::sig_atomic_t g_interrupted = 0;  // --cluster: SIGINT/SIGTERM, so the hosts are removed

// Moves the calling process (a forked child, one thread) into simulated host `h`'s network
// namespace: sockets it makes from now on live there. "" when done or when there are no simulated
// hosts, else what failed.
std::string enter_host(std::size_t h) {
  if (g_hosts.empty()) return "";
  if (h >= g_hosts.size()) return "no simulated host " + std::to_string(h);
  const std::string& path = g_hosts[h].netns_path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "open " + path + ": " + std::strerror(errno);
  const int rc = ::setns(fd, CLONE_NEWNET);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return "setns " + path + ": " + std::strerror(err);
  return "";
}

// The network interface of this process's host other than loopback ("" when there is none).
std::string link_interface() {
  std::string name;
  if (struct if_nameindex* ifs = ::if_nameindex()) {
    for (const struct if_nameindex* i = ifs; i->if_index != 0; ++i)
      if (std::string_view(i->if_name) != "lo") {
        name = i->if_name;
        break;
      }
    ::if_freenameindex(ifs);
  }
  return name;
}

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

// CPU seconds (user + system) this process used so far: what a run costs, independent of how much
// of the machine other jobs took meanwhile.
double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

std::uint64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

// Fast deterministic fill: splitmix64 words.
void fill_random(std::span<std::byte> b, std::uint64_t seed) {
  std::uint64_t x = seed;
  std::size_t k = 0;
  for (; k + 8 <= b.size(); k += 8) {
    x += 0x9E3779B97F4A7C15ull;
    std::uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(b.data() + k, &z, 8);
  }
  for (; k < b.size(); ++k) b[k] = static_cast<std::byte>(k * 131 + seed);
}

void fill_model(ws::HostWeights& w, std::uint64_t seed) {
  for (std::size_t t = 0; t < w.specs().size(); ++t) fill_random(w.bytes(t), seed + t);
}

// Changes `density` of the elements of every tensor (one byte of each chosen element flipped).
void perturb(ws::HostWeights& w, double density, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (std::size_t t = 0; t < w.specs().size(); ++t) {
    const std::size_t es = arlo::safetensors::dtype_size(w.specs()[t].dtype);
    const std::uint64_t n = w.specs()[t].numel();
    if (n == 0) continue;
    const std::uint64_t changes = static_cast<std::uint64_t>(density * static_cast<double>(n));
    auto b = w.bytes(t);
    for (std::uint64_t c = 0; c < changes; ++c) b[(rng() % n) * es] ^= std::byte{0x01};
  }
}

// Results travel from children to the parent as one JSON line each on a pipe.
int g_result_fd = -1;
void emit(const nlohmann::json& j) {
  const std::string line = j.dump() + "\n";
  if (::write(g_result_fd, line.data(), line.size()) < 0) std::perror("write result");
}

// The result line of a side timed over g_repeat rounds: `times` (one a round) under `times_key`, the
// last round's wire bytes and payload, peak RSS, CPU seconds a round since `cpu0`, and `checksum`.
template <typename Report>
nlohmann::json timed_result(const char* role, const char* times_key, const std::vector<double>& times,
                            const Report& last, double cpu0, std::uint64_t checksum) {
  return {{"role", role},
          {times_key, times},
          {"wire", last.wire_bytes},
          {"rss", peak_rss_bytes()},
          {"cpu", (cpu_seconds() - cpu0) / g_repeat},
          {"payload", std::string(ws::to_string(last.payload))},
          {"checksum", checksum}};
}

// Every result line until all writers closed `fd`. When one reports an error, the `stop` processes
// are killed: the others would wait out their deadlines (minutes) for a peer that is gone.
std::vector<nlohmann::json> collect(int fd, const std::vector<pid_t>& stop = {}) {
  std::vector<nlohmann::json> out;
  std::string buf;
  char tmp[4096];
  ssize_t n;
  bool stopped = false;
  while ((n = ::read(fd, tmp, sizeof tmp)) != 0) {
    if (n < 0) {
      if (errno != EINTR) break;
      if (g_interrupted && !stopped) {  // --cluster interrupted: end the run now
        for (pid_t p : stop) ::kill(p, SIGKILL);
        stopped = true;
      }
      continue;
    }
    buf.append(tmp, static_cast<std::size_t>(n));
    for (std::size_t eol; (eol = buf.find('\n')) != std::string::npos; buf.erase(0, eol + 1)) {
      if (eol == 0) continue;
      out.push_back(nlohmann::json::parse(buf.substr(0, eol), nullptr, false));
      if (!stopped && out.back().is_object() && out.back().contains("error")) {
        for (pid_t p : stop) ::kill(p, SIGKILL);
        stopped = true;
      }
    }
  }
  if (!buf.empty()) out.push_back(nlohmann::json::parse(buf, nullptr, false));
  return out;
}

int free_port() {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(s);
  return ntohs(a.sin_port);
}

template <typename F>
pid_t spawn(F f) {
  std::fflush(stdout);  // or the child's first log line repeats what the parent had buffered
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGINT, SIG_DFL);  // --cluster's parent catches them; its children stop as usual
    ::signal(SIGTERM, SIG_DFL);
    int code = 0;
    try {
      code = f();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench child: %s\n", e.what());
      code = 3;
    }
    ::_exit(code);
  }
  return pid;
}

int wait_all(const std::vector<pid_t>& pids) {
  int worst = 0;
  for (pid_t p : pids) {
    int st = 0;
    while (::waitpid(p, &st, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) worst = 1;
  }
  return worst;
}

// ---- baselines ------------------------------------------------------------------------------

// Runs `body` in one child process and returns the one result it emits ({} if none).
template <typename F>
nlohmann::json in_one_child(F body) {
  int fds[2];
  if (::pipe(fds) != 0) return {};
  g_result_fd = fds[1];
  auto pid = spawn(body);
  ::close(fds[1]);
  auto r = collect(fds[0]);
  ::close(fds[0]);
  wait_all({pid});
  return r.empty() ? nlohmann::json{} : r[0];
}

nlohmann::json baseline_memcpy(std::uint64_t bytes) {
  return in_one_child([&] {
    std::vector<std::byte> a(bytes), b(bytes);  // value-initialised: both touched
    fill_random(a, 1);
    double best = 1e30;
    for (int r = 0; r < g_repeat; ++r) {
      const double t0 = now_s();
      std::memcpy(b.data(), a.data(), bytes);
      best = std::min(best, now_s() - t0);
    }
    emit({{"seconds", best}, {"check", static_cast<int>(b[bytes / 2])}});
    return 0;
  });
}

// Raw blast chunk (--blast-chunk-kb, default 4 MiB: measured the strongest baseline here).
std::uint64_t kBlastChunk = 1u << 20;

nlohmann::json baseline_socket(std::uint64_t bytes) {
  int fds[2];
  if (::pipe(fds) != 0) return {};
  g_result_fd = fds[1];
  const int port = free_port();
  int ready[2];
  if (::pipe(ready) != 0) return {};
  auto receiver = spawn([&] {
    std::vector<std::byte> buf(bytes);
    int ls = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    if (::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(ls, 1) != 0) return 2;
    char c = 1;
    if (::write(ready[1], &c, 1) != 1) return 2;
    int s = ::accept(ls, nullptr, nullptr);  // kernel buffer autotuning, as for weight_sync
    for (int r = 0; r < g_repeat; ++r) {
      std::uint64_t got = 0;
      while (got < bytes) {
        ssize_t n = ::recv(s, buf.data() + got, std::min<std::uint64_t>(bytes - got, kBlastChunk), MSG_WAITALL);
        if (n <= 0) return 2;
        got += static_cast<std::uint64_t>(n);
      }
      if (::send(s, &c, 1, 0) != 1) return 2;
    }
    ::close(s);
    emit({{"role", "receiver"}, {"rss", peak_rss_bytes()}});
    return 0;
  });
  auto sender = spawn([&] {
    std::vector<std::byte> buf(bytes);
    fill_random(buf, 2);
    char c;
    if (::read(ready[0], &c, 1) != 1) return 2;
    int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return 2;
    double best = 1e30;
    for (int r = 0; r < g_repeat; ++r) {
      const double t0 = now_s();
      std::uint64_t sent = 0;
      while (sent < bytes) {
        ssize_t n = ::send(s, buf.data() + sent, std::min<std::uint64_t>(bytes - sent, kBlastChunk), 0);
        if (n <= 0) return 2;
        sent += static_cast<std::uint64_t>(n);
      }
      if (::recv(s, &c, 1, MSG_WAITALL) != 1) return 2;
      best = std::min(best, now_s() - t0);
    }
    ::close(s);
    emit({{"role", "sender"}, {"seconds", best}});
    return 0;
  });
  ::close(fds[1]);
  ::close(ready[0]);
  ::close(ready[1]);
  auto r = collect(fds[0]);
  ::close(fds[0]);
  wait_all({receiver, sender});
  for (auto& j : r)
    if (j.value("role", "") == "sender") return j;
  return {};
}

nlohmann::json baseline_fs(std::uint64_t bytes, const std::filesystem::path& dir) {
  return in_one_child([&] {
    std::vector<std::byte> a(bytes), b(bytes);
    fill_random(a, 3);
    const auto path = dir / "baseline.bin";
    double best = 1e30;
    for (int r = 0; r < g_repeat; ++r) {
      const double t0 = now_s();
      int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      for (std::uint64_t off = 0; off < bytes;) {
        ssize_t n = ::write(fd, a.data() + off, std::min<std::uint64_t>(bytes - off, 64 << 20));
        if (n <= 0) return 2;
        off += static_cast<std::uint64_t>(n);
      }
      ::close(fd);
      fd = ::open(path.c_str(), O_RDONLY);
      for (std::uint64_t off = 0; off < bytes;) {
        ssize_t n = ::read(fd, b.data() + off, std::min<std::uint64_t>(bytes - off, 64 << 20));
        if (n <= 0) return 2;
        off += static_cast<std::uint64_t>(n);
      }
      ::close(fd);
      best = std::min(best, now_s() - t0);
      std::filesystem::remove(path);
    }
    emit({{"seconds", best}});
    return 0;
  });
}

nlohmann::json baseline_gloo(std::uint64_t bytes, int receivers, std::uint64_t bucket) {
  const std::string script = std::string(ARLO_BENCH_PEERS_DIR) + "/gloo_broadcast.py";
  if (!std::filesystem::exists(script) || !std::filesystem::exists("/usr/bin/python3")) return {};
  int fds[2];
  if (::pipe(fds) != 0) return {};
  const int port = free_port();
  std::vector<pid_t> pids;
  for (int rank = 0; rank <= receivers; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::dup2(fds[1], 1);
      ::close(fds[0]);
      // --cluster: rank r in simulated host r, gloo's sockets on that host's link.
      if (const auto why = enter_host(static_cast<std::size_t>(rank)); !why.empty()) {
        std::fprintf(stderr, "gloo rank %d: %s\n", rank, why.c_str());
        ::_exit(126);
      }
      if (!g_hosts.empty()) ::setenv("GLOO_SOCKET_IFNAME", link_interface().c_str(), 1);
      const std::string a_rank = std::to_string(rank), a_world = std::to_string(receivers + 1),
                        a_bytes = std::to_string(bytes), a_bucket = std::to_string(bucket),
                        a_port = std::to_string(port);
      ::setenv("OMP_NUM_THREADS", "1", 1);
      const std::string master = g_hosts.empty() ? "127.0.0.1" : g_hosts[0].address;
      ::execl("/usr/bin/python3", "python3", script.c_str(), "--rank", a_rank.c_str(), "--world", a_world.c_str(),
              "--bytes", a_bytes.c_str(), "--bucket", a_bucket.c_str(), "--port", a_port.c_str(), "--master",
              master.c_str(), "--repeat", std::to_string(g_repeat).c_str(), nullptr);
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  ::close(fds[1]);
  auto r = collect(fds[0], pids);
  ::close(fds[0]);
  std::string statuses;
  for (pid_t p : pids) {
    int st = 0;
    ::waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
      statuses += " rank exit " + std::to_string(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  }
  if (!statuses.empty()) return {{"error", statuses}};
  nlohmann::json out = {{"sender_rss", 0}, {"receiver_rss", 0}};
  for (auto& j : r) {
    if (j.is_discarded()) continue;
    if (j.value("rank", -1) == 0) {
      out["seconds"] = j.value("seconds", 0.0);
      out["sender_rss"] = j.value("rss", std::uint64_t{0});
    } else {
      out["receiver_rss"] = std::max(out["receiver_rss"].get<std::uint64_t>(), j.value("rss", std::uint64_t{0}));
    }
  }
  return out.contains("seconds") ? out : nlohmann::json{};
}

// ---- weight_sync runs -------------------------------------------------------------------------

// One line of JSON on a pipe with a single reader (read byte by byte, so nothing past the line is
// consumed). nullopt at end of file.
void write_line(int fd, const nlohmann::json& j) {
  const std::string line = j.dump() + "\n";
  if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) std::perror("write line");
}
std::optional<nlohmann::json> read_line(int fd) {
  std::string line;
  char c;
  while (true) {
    const ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;
    if (c == '\n') break;
    line.push_back(c);
  }
  auto j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

struct Pipe {
  int r = -1, w = -1;
  bool open() {
    int fds[2];
    if (::pipe(fds) != 0) return false;
    r = fds[0];
    w = fds[1];
    return true;
  }
  void close_both() {
    if (r >= 0) ::close(r);
    if (w >= 0) ::close(w);
    r = w = -1;
  }
};

// The bench's values for option keys a transport's descriptor may have (set only where the
// descriptor has the key; endpoints are not set: senders listen where their defaults say and
// receivers get the sender's endpoint object).
struct BenchParams {
  std::filesystem::path dir;                                  // "dir": a fresh directory per run
  std::string shm_read;                                       // "direct_read": default | direct | channel
  std::vector<std::pair<std::string, nlohmann::json>> extra;  // --param key=value
};
BenchParams g_params;
int g_run = 0;  // numbers the runs, for unique segment and directory names

nlohmann::json bench_params(const ws::TransportDescriptor& d, const std::string& run_tag) {
  nlohmann::json p = nlohmann::json::object();
  if (d.option("dir")) p["dir"] = (g_params.dir / ("ws-" + d.name + "-" + run_tag)).string();
  if (d.option("shm_name")) p["shm_name"] = "bench-" + std::to_string(::getpid()) + "-" + run_tag;
  if (d.option("poll_interval_ms")) p["poll_interval_ms"] = 2;
  // --cluster: the publisher listens on host 0's link (receivers get its endpoint object).
  if (d.option("address") && !g_hosts.empty()) p["address"] = g_hosts[0].address + ":0";
  if (d.option("direct_read") && g_params.shm_read != "default") p["direct_read"] = g_params.shm_read == "direct";
  for (const auto& [k, v] : g_params.extra)
    if (d.option(k)) p[k] = v;
  return p;
}

ws::Options base_options(const ws::TransportDescriptor& d, const Args& args, const std::string& run_tag) {
  ws::Options base;
  base.transport = d.name;
  auto kind = ws::parse_payload(args.payload);
  base.payload.kind = kind ? *kind : ws::PayloadKind::kFull;
  base.payload.zstd = args.zstd;
  base.bucket_bytes = args.bucket_mb << 20;
  base.apply_mode = args.mode == "staging" ? ws::ApplyMode::kStaging : ws::ApplyMode::kInPlace;
  base.bucket_timeout = 120s;
  base.timeout = 600s;
  base.params = bench_params(d, run_tag);
  // --cluster: every expected receiver is coming; one that a loaded machine starts late must still
  // be in the timed version rather than left for the next.
  if (!g_hosts.empty()) base.gather_window = 60s;
  return base;
}

// Receiver-side params: the bench's own, then where to connect (an endpoint object).
nlohmann::json with_endpoint(nlohmann::json params, const nlohmann::json& endpoint) {
  for (const auto& [k, v] : endpoint.items()) params[k] = v;
  return params;
}

nlohmann::json run_transport(const ws::TransportDescriptor& d, bool chain, const Args& args,
                             const std::vector<ws::TensorSpec>& specs) {
  const std::string tag = std::to_string(++g_run);
  ws::Options base = base_options(d, args, tag);
  // The run goes in lock step: a receiver says it is ready for the next version only once it holds
  // the previous one, and the sender publishes only when every receiver said so. So every receiver
  // must be served every version, also one that a loaded machine starts late (it zeroes its sink
  // first) or deschedules between its ready and its HELLO: with the default window (50 ms) a
  // publisher or relay streams without it, it waits for a version the sender never publishes, and
  // the run hangs until the receivers' deadlines (600 s).
  base.gather_window = 60s;
  // Star: the sender tells every receiver its endpoint. Chain: the sender tells receiver 0; each
  // relaying receiver tells the next one its relay endpoint.
  std::vector<Pipe> where(static_cast<std::size_t>(args.receivers));
  int fds[2], ready[2];
  if (::pipe(fds) != 0 || ::pipe(ready) != 0) return {};
  for (auto& p : where)
    if (!p.open()) return {};
  g_result_fd = fds[1];
  std::vector<pid_t> pids;
  for (int k = 0; k < args.receivers; ++k) {
    pids.push_back(spawn([&, k] {
      if (const auto why = enter_host(static_cast<std::size_t>(k) + 1); !why.empty()) {
        emit({{"role", "receiver"}, {"error", why}});
        return 2;
      }
      ws::Options o = base;
      o.peer_name = "receiver-" + std::to_string(k);
      auto endpoint = read_line(where[static_cast<std::size_t>(k)].r);
      if (!endpoint) {
        emit({{"role", "receiver"}, {"error", "no endpoint from upstream"}});
        return 2;
      }
      o.params = with_endpoint(o.params, *endpoint);
      o.relay = chain && k + 1 < args.receivers;
      // --cluster: a relay serves the next host on its own host's link.
      if (o.relay && !g_hosts.empty() && d.relay_at) {
        const auto relay = d.relay_at(g_hosts[static_cast<std::size_t>(k) + 1].address, 0);  // {params, endpoint}
        for (const auto& [key, v] : relay.first.items()) o.params[key] = v;
      }
      auto sub = ws::Subscriber::create(o);
      if (!sub) {
        emit({{"role", "receiver"}, {"error", sub.error().what()}});
        return 2;
      }
      if (o.relay) write_line(where[static_cast<std::size_t>(k) + 1].w, (*sub)->relay_endpoint());
      ws::HostWeights sink(specs);
      for (std::size_t t = 0; t < specs.size(); ++t) std::memset(sink.bytes(t).data(), 0, sink.bytes(t).size());
      auto r1 = (*sub)->receive(sink, Clock::now() + 600s);
      if (!r1) {
        emit({{"role", "receiver"}, {"error", r1.error().what()}});
        return 2;
      }
      std::vector<double> t_end;
      ws::ReceiveReport last;
      const double cpu0 = cpu_seconds();
      for (int rep = 0; rep < g_repeat; ++rep) {
        char c = 1;
        if (::write(ready[1], &c, 1) != 1) return 2;
        auto r2 = (*sub)->receive(sink, Clock::now() + 600s);
        t_end.push_back(now_s());
        if (!r2) {
          emit({{"role", "receiver"}, {"error", r2.error().what()}});
          return 2;
        }
        last = *r2;
      }
      auto line = timed_result("receiver", "t_end", t_end, last, cpu0, *(*sub)->checksum(sink));
      line["path"] = last.path;
      emit(line);
      return 0;
    }));
  }
  pids.push_back(spawn([&] {
    if (const auto why = enter_host(0); !why.empty()) {
      emit({{"role", "sender"}, {"error", why}});
      return 2;
    }
    ws::Options o = base;
    o.expected_receivers = chain ? 1 : static_cast<std::size_t>(args.receivers);
    auto pub = ws::Publisher::create(o);
    if (!pub) {
      emit({{"role", "sender"}, {"error", pub.error().what()}});
      return 2;
    }
    for (int k = 0; k < (chain ? 1 : args.receivers); ++k)
      write_line(where[static_cast<std::size_t>(k)].w, (*pub)->endpoint());
    ws::HostWeights w(specs);
    fill_model(w, 42);
    auto r1 = (*pub)->publish(1, w, Clock::now() + 600s);
    if (!r1 || !r1->all_ok()) {
      emit({{"role", "sender"}, {"error", r1 ? r1->peers.front().error : r1.error().what()}});
      return 2;
    }
    std::vector<double> t0s;
    ws::PublishReport last;
    const double cpu0 = cpu_seconds();
    for (int rep = 0; rep < g_repeat; ++rep) {
      if (base.payload.kind == ws::PayloadKind::kDelta) perturb(w, args.delta_density, 7 + rep);
      for (int k = 0; k < args.receivers; ++k) {
        char c;
        if (::read(ready[0], &c, 1) != 1) return 2;
      }
      t0s.push_back(now_s());
      auto r2 = (*pub)->publish(2 + rep, w, Clock::now() + 600s);
      if (!r2 || !r2->all_ok()) {
        std::string err = r2 ? "" : r2.error().what();
        if (r2)
          for (auto& p : r2->peers) err += p.peer + ": " + p.error + "; ";
        emit({{"role", "sender"}, {"error", err}});
        return 2;
      }
      last = *r2;
    }
    emit(timed_result("sender", "t0", t0s, last, cpu0, *ws::weights_checksum(w)));
    return 0;
  }));
  ::close(fds[1]);
  ::close(ready[0]);
  ::close(ready[1]);
  for (auto& p : where) p.close_both();
  auto results = collect(fds[0], pids);
  ::close(fds[0]);
  wait_all(pids);
  std::error_code ec;
  if (base.params.contains("dir")) std::filesystem::remove_all(base.params["dir"].get<std::string>(), ec);

  nlohmann::json out = {{"transport", d.name}};
  std::vector<double> t0;
  std::vector<double> t_end(static_cast<std::size_t>(g_repeat), 0.0);
  std::uint64_t recv_rss = 0, recv_wire = 0;
  double recv_cpu = 0;
  std::optional<std::uint64_t> sender_sum;
  bool checksums_ok = true;
  std::vector<std::uint64_t> recv_sums;
  for (auto& j : results) {
    if (j.is_discarded()) continue;
    if (j.contains("error")) {
      out["error"] = j.value("role", "?") + ": " + j["error"].get<std::string>();
      continue;
    }
    if (j["role"] == "sender") {
      t0 = j["t0"].get<std::vector<double>>();
      out["sender_rss"] = j["rss"];
      out["sender_cpu"] = j.value("cpu", 0.0);
      out["wire"] = j["wire"];
      out["payload"] = j["payload"];
      sender_sum = j["checksum"].get<std::uint64_t>();
    } else {
      auto te = j["t_end"].get<std::vector<double>>();
      for (std::size_t k = 0; k < te.size() && k < t_end.size(); ++k) t_end[k] = std::max(t_end[k], te[k]);
      recv_rss = std::max(recv_rss, j["rss"].get<std::uint64_t>());
      recv_cpu = std::max(recv_cpu, j.value("cpu", 0.0));
      out["path"] = j.value("path", std::string());
      recv_wire = std::max(recv_wire, j["wire"].get<std::uint64_t>());
      recv_sums.push_back(j["checksum"].get<std::uint64_t>());
    }
  }
  if (out.contains("error")) return out;
  for (auto s : recv_sums) checksums_ok &= sender_sum && s == *sender_sum;
  if (static_cast<int>(recv_sums.size()) != args.receivers)
    return {{"transport", d.name}, {"error", "missing results"}};
  double best = 1e30;
  std::vector<double> each;
  for (std::size_t k = 0; k < t0.size() && k < t_end.size(); ++k) {
    each.push_back(t_end[k] - t0[k]);
    best = std::min(best, each.back());
  }
  out["seconds"] = best;
  out["each"] = each;
  out["receiver_rss"] = recv_rss;
  out["receiver_cpu"] = recv_cpu;
  out["receiver_wire"] = recv_wire;
  out["weights_match"] = base.payload.kind == ws::PayloadKind::kFull || base.payload.kind == ws::PayloadKind::kDelta
                             ? nlohmann::json(checksums_ok)
                             : nlohmann::json("lossy payload");
  return out;
}

// ---- staging stall: StagingPublisher::stage against the staging copy ----------------------------

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double max_of(const std::vector<double>& v) { return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()); }

// The trainer (one process) stages versions 1..K through a StagingPublisher, one every --step-ms
// (its "training step"), and changes the weights in between; N receiver processes learn of each
// version from its announcement (as workers do from the orchestrator), pull it, and stop once they
// hold K. Per version the trainer measures how long stage() held it (the stall), the staging copy
// the publisher reports (StageReport::copy_seconds), and an independent memcpy of the same bytes
// into a warm buffer right after, in the same process.
nlohmann::json run_staging(const ws::TransportDescriptor& d, const Args& args, const std::vector<ws::TensorSpec>& specs,
                           std::uint64_t bytes) {
  const std::string tag = std::to_string(++g_run);
  const ws::Options base = base_options(d, args, tag);
  const int n = args.receivers;
  const int versions = args.versions;
  std::vector<Pipe> ann(static_cast<std::size_t>(n));
  Pipe results, done;
  if (!results.open() || !done.open()) return {{"error", "pipe"}};
  for (auto& p : ann)
    if (!p.open()) return {{"error", "pipe"}};
  g_result_fd = results.w;
  std::vector<pid_t> pids;
  for (int k = 0; k < n; ++k) {
    pids.push_back(spawn([&, k] {
      for (int j = 0; j < n; ++j) {
        ::close(ann[static_cast<std::size_t>(j)].w);
        if (j != k) ::close(ann[static_cast<std::size_t>(j)].r);
      }
      ::close(done.r);
      const int fd = ann[static_cast<std::size_t>(k)].r;
      auto fail = [&](const std::string& why) {
        emit({{"role", "receiver"}, {"error", "receiver-" + std::to_string(k) + ": " + why}});
        return 2;
      };
      auto first = read_line(fd);
      if (!first) return fail("no announcement");
      auto a = ws::parse_announcement(*first);
      if (!a) return fail(a.error().what());
      ws::Options mine = base;
      mine.peer_name = "receiver-" + std::to_string(k);
      // How a worker pulls an announced version: the announcement's transport and endpoint over
      // its own block.
      auto o = ws::options_from_json(ws::receiver_block(*a, ws::to_json(mine)));
      if (!o) return fail(o.error().what());
      auto sub = ws::Subscriber::create(*o);
      if (!sub) return fail(sub.error().what());
      ws::HostWeights sink(specs);
      for (std::size_t t = 0; t < specs.size(); ++t) std::memset(sink.bytes(t).data(), 0, sink.bytes(t).size());
      arlo::Version latest = a->version, held = 0;
      nlohmann::json got = nlohmann::json::array();
      std::string path;
      auto take = [&](const nlohmann::json& line) {
        if (auto b = ws::parse_announcement(line)) latest = std::max(latest, b->version);
      };
      while (held < versions) {
        pollfd pfd{fd, POLLIN, 0};
        while (::poll(&pfd, 1, 0) > 0 && (pfd.revents & POLLIN)) {
          auto line = read_line(fd);
          if (!line) break;
          take(*line);
        }
        if (latest <= held) {
          auto line = read_line(fd);  // blocks until the next announcement
          if (!line) return fail("announcements ended at version " + std::to_string(latest));
          take(*line);
          continue;
        }
        auto r = (*sub)->receive(sink, Clock::now() + 600s);
        if (!r) return fail(r.error().what());
        got.push_back({{"version", r->version}, {"t_end", now_s()}, {"seconds", r->seconds}});
        held = r->version;
        path = r->path;
      }
      char c = 1;
      if (::write(done.w, &c, 1) != 1) return fail("done pipe");
      emit({{"role", "receiver"}, {"got", got}, {"path", path}, {"checksum", *(*sub)->checksum(sink)}});
      return 0;
    }));
  }
  pids.push_back(spawn([&] {
    ::signal(SIGPIPE, SIG_IGN);  // a receiver that already stopped must not take the trainer with it
    for (auto& p : ann) ::close(p.r);
    ::close(done.w);
    ws::Options o = base;
    o.expected_receivers = static_cast<std::size_t>(n);
    std::mutex mu;
    std::map<arlo::Version, double> announced;  // when each announcement went out
    auto pub = ws::StagingPublisher::create(o, [&](const ws::Announcement& a) {
      {
        std::lock_guard lock(mu);
        announced[a.version] = now_s();
      }
      for (auto& p : ann) write_line(p.w, ws::to_json(a));  // what the orchestrator hands every worker
      return arlo::ok();
    });
    if (!pub) {
      emit({{"role", "sender"}, {"error", pub.error().what()}});
      return 2;
    }
    ws::HostWeights w(specs);
    fill_model(w, 42);
    std::vector<std::byte> copy(bytes, std::byte{1});  // touched: the memcpy baseline copies into warm memory
    // Once: the same copy into memory never touched (page faults), what a new staging slot costs.
    double fresh_s = 0;
    {
      ws::HostWeights fresh(specs);
      const double f0 = now_s();
      for (std::size_t t = 0; t < specs.size(); ++t)
        std::memcpy(fresh.bytes(t).data(), w.bytes(t).data(), w.bytes(t).size());
      fresh_s = now_s() - f0;
    }
    nlohmann::json rows = nlohmann::json::array();
    for (int v = 1; v <= versions; ++v) {
      if (v > 1) perturb(w, args.delta_density, 100 + static_cast<std::uint64_t>(v));  // the optimizer step
      const auto step_start = Clock::now();
      const double t0 = now_s();
      auto r = (*pub)->stage(v, w);
      const double stall = now_s() - t0;
      if (!r) {
        emit({{"role", "sender"}, {"error", "stage(" + std::to_string(v) + "): " + r.error().what()}});
        return 2;
      }
      const double m0 = now_s();
      std::uint64_t off = 0;
      for (std::size_t t = 0; t < specs.size(); ++t) {
        const auto b = w.bytes(t);
        std::memcpy(copy.data() + off, b.data(), b.size());
        off += b.size();
      }
      const double memcpy_s = now_s() - m0;
      rows.push_back({{"version", v},
                      {"t0", t0},
                      {"stall", stall},
                      {"copy", r->copy_seconds},
                      {"memcpy", memcpy_s},
                      {"bytes", r->bytes}});
      std::this_thread::sleep_until(step_start + std::chrono::milliseconds(args.step_ms));  // the rest of the step
    }
    auto flushed = (*pub)->flush(Clock::now() + 600s);
    // Keep serving until every receiver holds the last version (each writes one byte; EOF when
    // all of them are gone).
    char c;
    for (int got = 0; got < n && ::read(done.r, &c, 1) == 1;) ++got;
    nlohmann::json out = {
        {"role", "sender"}, {"rows", rows}, {"fresh_memcpy", fresh_s}, {"checksum", *ws::weights_checksum(w)}};
    if (!flushed) out["flush_error"] = flushed.error().what();
    {
      std::lock_guard lock(mu);
      for (auto& row : out["rows"])
        if (auto it = announced.find(row["version"].get<arlo::Version>()); it != announced.end())
          row["announce"] = it->second - row["t0"].get<double>();
    }
    emit(out);
    return 0;
  }));
  ::close(results.w);
  results.w = -1;
  done.close_both();
  for (auto& p : ann) p.close_both();
  auto lines = collect(results.r);
  results.close_both();
  wait_all(pids);
  std::error_code ec;
  if (base.params.contains("dir")) std::filesystem::remove_all(base.params["dir"].get<std::string>(), ec);

  nlohmann::json out = {{"transport", d.name}};
  nlohmann::json sender;
  std::vector<nlohmann::json> receivers;
  for (auto& j : lines) {
    if (j.is_discarded()) continue;
    if (j.contains("error")) {
      out["error"] = j.value("role", "?") + ": " + j["error"].get<std::string>();
      return out;
    }
    if (j["role"] == "sender")
      sender = j;
    else
      receivers.push_back(j);
  }
  if (sender.is_null() || static_cast<int>(receivers.size()) != n) {
    out["error"] = "missing results (sender " + std::string(sender.is_null() ? "none" : "ok") + ", receivers " +
                   std::to_string(receivers.size()) + "/" + std::to_string(n) + ")";
    return out;
  }
  bool match = true;
  for (auto& r : receivers) match &= r["checksum"] == sender["checksum"];
  out["weights_match"] = match;
  out["path"] = receivers.front().value("path", std::string());
  out["fresh_memcpy"] = sender["fresh_memcpy"];
  if (sender.contains("flush_error")) out["flush_error"] = sender["flush_error"];
  // Per version: the end-to-end time from stage() starting to the last receiver holding it, when
  // every receiver held it (a version superseded before a receiver pulled it is skipped by design).
  nlohmann::json rows = nlohmann::json::array();
  for (auto row : sender["rows"]) {
    const auto v = row["version"].get<arlo::Version>();
    int held_by = 0;
    double last = 0;
    for (auto& r : receivers)
      for (auto& g : r["got"])
        if (g["version"].get<arlo::Version>() == v) {
          ++held_by;
          last = std::max(last, g["t_end"].get<double>());
        }
    row["held_by"] = held_by;
    if (held_by == n) row["e2e"] = last - row["t0"].get<double>();
    rows.push_back(row);
  }
  out["rows"] = rows;
  return out;
}

void print_staging(const nlohmann::json& r, int receivers) {
  const std::string name = r["transport"];
  if (r.contains("error")) {
    std::printf("%-12s FAILED: %s\n", name.c_str(), r["error"].get<std::string>().c_str());
    return;
  }
  std::vector<double> stall, copy, mcpy, ratio, vs_memcpy, e2e;
  int complete = 0;
  for (const auto& row : r["rows"]) {
    stall.push_back(row["stall"]);
    copy.push_back(row["copy"]);
    mcpy.push_back(row["memcpy"]);
    const double c = row["copy"];
    ratio.push_back(c > 0 ? row["stall"].get<double>() / c : 1e9);
    const double m = row["memcpy"];
    vs_memcpy.push_back(m > 0 ? row["stall"].get<double>() / m : 1e9);
    if (row.contains("e2e")) {
      e2e.push_back(row["e2e"]);
      ++complete;
    }
  }
  char e2e_s[64] = "-";
  if (!e2e.empty()) std::snprintf(e2e_s, sizeof e2e_s, "%.3f / %.3f", median(e2e), max_of(e2e));
  // The stall against a warm memcpy of the same bytes: the first version (it copies into a new
  // staging slot: first-touch page faults) apart from every version after it (the target).
  const double first = vs_memcpy.empty() ? 0.0 : vs_memcpy.front();
  const std::vector<double> later(vs_memcpy.empty() ? vs_memcpy.end() : vs_memcpy.begin() + 1, vs_memcpy.end());
  std::printf("%-12s %7.4f / %7.4f %8.4f %8.4f %6.2fx / %5.2fx %6.2fx / %6.2fx   %-15s %d/%zu\n", name.c_str(),
              median(stall), max_of(stall), median(copy), median(mcpy), median(ratio), max_of(ratio), median(later),
              max_of(later), e2e_s, complete, stall.size());
  std::printf(
      "%-12s stall / warm memcpy of the same bytes: first version %.2fx; after it median %.2fx, worst %.2fx "
      "(%zu versions); target <= 1.2x on every version after the first: %s (memcpy into untouched memory, once: "
      "%.4f s); stall <= 1.2x copy, every version: %s; %s\n",
      "", first, median(later), max_of(later), later.size(), !later.empty() && max_of(later) <= 1.2 ? "PASS" : "MISS",
      r.value("fresh_memcpy", 0.0), max_of(ratio) <= 1.2 ? "PASS" : "MISS",
      r["weights_match"].get<bool>() ? "weights match" : "WEIGHTS DIFFER");
  std::string detail;
  for (const auto& row : r["rows"]) {
    char s[160];
    std::snprintf(s, sizeof s, "%sv%d %.4f/%.4f/%.4f", detail.empty() ? "" : " | ", row["version"].get<int>(),
                  row["stall"].get<double>(), row["copy"].get<double>(), row["memcpy"].get<double>());
    detail += s;
    if (row.contains("announce")) {
      std::snprintf(s, sizeof s, " ann %.3f", row["announce"].get<double>());
      detail += s;
    }
    if (row.contains("e2e"))
      std::snprintf(s, sizeof s, " e2e %.3f", row["e2e"].get<double>());
    else
      std::snprintf(s, sizeof s, " held by %d/%d", row["held_by"].get<int>(), receivers);
    detail += s;
  }
  std::printf("%-12s per version stall/copy/memcpy, announced, e2e s: %s; path %s\n", "", detail.c_str(),
              r.value("path", std::string("?")).c_str());
  if (r.contains("flush_error")) std::printf("%-12s flush: %s\n", "", r["flush_error"].get<std::string>().c_str());
}

std::string mb(std::uint64_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.0f", static_cast<double>(b) / (1 << 20));
  return s;
}

// The transports --transport names (comma list), or every registered one; nullopt after printing
// what is wrong.
std::optional<std::vector<const ws::TransportDescriptor*>> chosen_transports(const std::string& list) {
  std::vector<const ws::TransportDescriptor*> out;
  if (list.empty()) {
    for (const auto& d : ws::transports()) out.push_back(&d);
    return out;
  }
  std::stringstream ss(list);
  std::string t;
  while (std::getline(ss, t, ',')) {
    if (t.empty()) continue;
    auto d = ws::find_transport(t);
    if (!d) {
      std::fprintf(stderr, "--transport: %s\n", d.error().what().c_str());
      return std::nullopt;
    }
    out.push_back(*d);
  }
  return out;
}

// "1.20 0.85 0.60": the load averages, printed with every figure (the machine may be shared).
std::string loadavg() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

extern "C" void on_interrupt(int) { g_interrupted = 1; }

// --cluster: the shaped-link table. One simulated host per process (host 0 the sender or gloo rank
// 0, host k + 1 receiver k), every host's link shaped to the same rate in each direction, so the
// link and not this machine's loopback is the limit. For each receiver count: the gloo peer, then
// star and chain of every chosen transport whose descriptor relays (the ones that move bytes host to
// host); each time against the link limit (model bytes / link rate) and against gloo; then the
// targets of issue 16 for every such transport.
int run_cluster(Args args, const std::vector<const ws::TransportDescriptor*>& chosen,
                const std::vector<ws::TensorSpec>& specs, std::uint64_t bytes) {
  namespace cl = arlo::cluster;
  std::vector<int> counts;
  {
    std::stringstream ss(args.cluster_receivers);
    for (std::string t; std::getline(ss, t, ',');) {
      int n = 0;
      const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), n);
      if (ec != std::errc() || end != t.data() + t.size() || n < 1 || n > 8) {
        std::fprintf(stderr, "--cluster-receivers %s: '%s' is not a receiver count 1-8 (e.g. 1,2,4)\n",
                     args.cluster_receivers.c_str(), t.c_str());
        return 2;
      }
      counts.push_back(n);
    }
    std::sort(counts.begin(), counts.end());
    counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
    if (counts.empty()) {
      std::fprintf(stderr, "--cluster-receivers: give at least one receiver count (e.g. 1,2,4)\n");
      return 2;
    }
  }
  if (args.link_mbit <= 0) {
    std::fprintf(stderr, "--link-mbit %g: the shaped-link table needs a link rate above 0\n", args.link_mbit);
    return 2;
  }
  if (const auto why = cl::Cluster::unavailable(); !why.empty()) {
    std::fprintf(stderr, "--cluster: %s\n", why.c_str());
    return 2;
  }
  std::vector<const ws::TransportDescriptor*> relaying;
  for (const auto* d : chosen) {
    if (d->capabilities.relays)
      relaying.push_back(d);
    else if (!args.transports.empty())
      std::printf(
          "weight_sync %s: skipped, its descriptor does not relay (the shaped-link table runs the transports "
          "that move bytes host to host)\n",
          d->name.c_str());
  }
  // A publisher listening off loopback wants the run's token; the bench makes one for its
  // processes, as `arlo run` does, unless one is set.
  if (!std::getenv(std::string(arlo::auth::kTokenEnv).c_str()) &&
      !std::getenv(std::string(arlo::auth::kTokenFileEnv).c_str())) {
    auto token = arlo::auth::generate_token();
    if (!token) {
      std::fprintf(stderr, "--cluster: %s\n", token.error().what().c_str());
      return 2;
    }
    ::setenv(std::string(arlo::auth::kTokenEnv).c_str(), token->c_str(), 1);
  }

  const int hosts = counts.back() + 1;
  cl::LinkShape shape{args.link_mbit, args.link_delay_ms, 0};
  std::string latency = args.link_delay_ms > 0 ? "" : "none asked";
  auto cluster = cl::Cluster::create(hosts, shape);
  if (!cluster && shape.delay_ms > 0) {
    // No sch_netem here: the rate alone is simulated, and the table says so.
    std::string why = cluster.error().what();
    if (const auto cut = why.find(" (`"); cut != std::string::npos) why.resize(cut);
    latency = "NOT simulated (" + why + ")";
    shape.delay_ms = 0;
    cluster = cl::Cluster::create(hosts, shape);
  }
  if (!cluster) {
    std::fprintf(stderr, "--cluster: simulated hosts: %s\n", cluster.error().what().c_str());
    return 2;
  }
  if (latency.empty()) latency = std::to_string(args.link_delay_ms) + " ms one way (netem)";
  for (int i = 0; i < hosts; ++i) g_hosts.push_back({"/var/run/netns/" + (*cluster)->netns(i), (*cluster)->address(i)});
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);

  const double link_bytes_per_s = args.link_mbit * 1e6 / 8;
  const double limit = static_cast<double>(bytes) / link_bytes_per_s;
  const std::uint64_t bucket = args.bucket_mb << 20;
  std::printf(
      "weight-sync bench --cluster: %s x%.3g %s, %zu tensors, %.3f GB; payload %s%s; bucket %llu MiB; mode %s; "
      "best of %d\n",
      args.model.c_str(), args.scale, args.dtype.c_str(), specs.size(), bytes / 1e9, args.payload.c_str(),
      args.zstd ? "+zstd" : "", static_cast<unsigned long long>(args.bucket_mb), args.mode.c_str(), args.repeat);
  std::printf("hosts: %d network namespaces on one bridge, every host's link %g Mbit/s each way (tbf); latency: %s\n",
              hosts, args.link_mbit, latency.c_str());
  std::printf("link limit = model bytes / link rate = %.3f s; load average %s\n", limit, loadavg().c_str());
  std::printf("\n%-28s %4s %9s %9s %13s %14s %9s %18s  %s\n", "run", "recv", "seconds", "median s", "link limit s",
              "vs link limit", "vs gloo", "cpu s send / recv", "weights");
  std::fflush(stdout);

  auto fmt_ratio = [](std::optional<double> r) -> std::string {
    if (!r) return "-";
    char b[32];
    std::snprintf(b, sizeof b, "%.2fx", *r);
    return b;
  };
  std::map<std::pair<std::string, int>, double> seconds;  // (run label, receivers) -> best seconds
  std::map<int, double> gloo;
  std::string gloo_error;
  bool all_match = true;
  for (const int n : counts) {
    if (g_interrupted) break;
    Args a = args;
    a.receivers = n;
    if (args.gloo) {
      auto g = baseline_gloo(bytes, n, bucket);
      if (!g.contains("seconds") && !g_interrupted)
        g = baseline_gloo(bytes, n, bucket);  // once more, as the main table does
      if (g.contains("seconds")) {
        gloo[n] = g["seconds"];
        std::printf("%-28s %4d %9.3f %9s %13.3f %14s %9s %18s  %s\n", "peer torch gloo broadcast", n, gloo[n], "-",
                    limit, fmt_ratio(limit / gloo[n]).c_str(), "1.00x", "-", "-");
      } else {
        gloo_error = g.is_object() ? g.value("error", std::string("no result")) : std::string("no result");
        std::printf("%-28s %4d unavailable: %s (needs /usr/bin/python3 with torch)\n", "peer torch gloo broadcast", n,
                    gloo_error.c_str());
      }
      std::fflush(stdout);
    }
    for (const auto* d : relaying) {
      for (const bool chain : {false, true}) {
        if (g_interrupted) break;
        if (args.topology != "both" && chain != (args.topology == "chain")) continue;
        const std::string label = "weight_sync " + d->name + (chain ? " chain" : " star");
        auto r = run_transport(*d, chain, a, specs);
        if (r.contains("error") || !r.contains("seconds")) {
          std::printf("%-28s %4d FAILED: %s\n", label.c_str(), n, r.value("error", std::string("no result")).c_str());
          std::fflush(stdout);
          continue;
        }
        const double s = r["seconds"];
        seconds[{label, n}] = s;
        const bool match = r["weights_match"] == true || r["weights_match"] == "lossy payload";
        all_match &= match;
        char cpu[48];
        std::snprintf(cpu, sizeof cpu, "%.3f / %.3f", r.value("sender_cpu", 0.0), r.value("receiver_cpu", 0.0));
        std::printf("%-28s %4d %9.3f %9.3f %13.3f %14s %9s %18s  %s\n", label.c_str(), n, s,
                    median(r.value("each", std::vector<double>{})), limit, fmt_ratio(limit / s).c_str(),
                    fmt_ratio(gloo.count(n) ? std::optional<double>(gloo[n] / s) : std::nullopt).c_str(), cpu,
                    match ? "match" : "DIFFER");
        std::fflush(stdout);
      }
    }
  }
  if (g_interrupted) {
    std::printf("interrupted; the simulated hosts are removed\n");
    g_hosts.clear();
    return 130;
  }

  // The targets of issue 16, for every relaying transport's chain at the largest and smallest count.
  const int lo = counts.front(), hi = counts.back();
  std::printf("\n");
  for (const auto* d : relaying) {
    const std::string label = "weight_sync " + d->name + " chain";
    const auto at = [&](int n) -> std::optional<double> {
      auto it = seconds.find({label, n});
      return it == seconds.end() ? std::nullopt : std::optional<double>(it->second);
    };
    const auto hi_s = at(hi), lo_s = at(lo);
    if (!hi_s) {
      std::printf("target: %s at %d receivers: no result (not run, or failed above)\n", label.c_str(), hi);
      continue;
    }
    const double vs_limit = limit / *hi_s;
    std::printf("target: %s at %d receivers >= 0.80x the link limit: %.2fx (%.3f s against %.3f s)  %s\n",
                label.c_str(), hi, vs_limit, *hi_s, limit, vs_limit >= 0.8 ? "PASS" : "MISS");
    if (gloo.count(hi)) {
      const double vs_gloo = gloo[hi] / *hi_s;
      std::printf("target: %s at %d receivers >= 3x faster than gloo: %.2fx (gloo %.3f s)  %s\n", label.c_str(), hi,
                  vs_gloo, gloo[hi], vs_gloo >= 3 ? "PASS" : "MISS");
    } else {
      std::printf("target: %s at %d receivers >= 3x faster than gloo: no gloo figure (%s)\n", label.c_str(), hi,
                  args.gloo ? gloo_error.c_str() : "--no-gloo");
    }
    if (lo_s && lo < hi) {
      const double growth = *hi_s / *lo_s - 1;
      std::printf("target: %s time grows <= 10%% from %d to %d receivers: %+.1f%% (%.3f -> %.3f s)  %s\n",
                  label.c_str(), lo, hi, 100 * growth, *lo_s, *hi_s, growth <= 0.10 ? "PASS" : "MISS");
    }
  }
  std::printf("weights: %s; load average after: %s\n",
              all_match ? "every receiver holds the sender's checksum" : "SOME DIFFER", loadavg().c_str());
  g_hosts.clear();
  return all_match ? 0 : 1;
}

}  // namespace

#ifdef ARLO_BINARY
// `arlo run configs/quickstart.yaml` with 3 embedded arlo-workers and `topology`: the weight_sync
// records of its metrics.jsonl (one per version the orchestrator moved).
struct ArloRunSyncs {
  std::string error;
  std::vector<double> seconds;  // per version: the whole update, all workers
  std::vector<double> update;   // per version: the slowest worker's transfer (update_s)
  int workers_ok = 0, workers = 0;
  std::string checksums;  // "all equal" or what differed
};

ArloRunSyncs arlo_run_syncs(const std::string& transport, const std::string& topology, int steps) {
  ArloRunSyncs r;
  const auto dir =
      std::filesystem::temp_directory_path() / ("arlo-bench-ws-run-" + topology + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir.parent_path());
  const auto log = dir.string() + ".log";
  std::vector<std::string> argv = {ARLO_BINARY, "run", std::string(ARLO_SOURCE_DIR) + "/configs/quickstart.yaml"};
  for (const std::string& set : std::vector<std::string>{
           "run.dir=" + dir.string(), "log.progress=false", "status.port=0", "run.max_steps=" + std::to_string(steps),
           "orchestrator.sft_warmup_steps=" + std::to_string(steps - 2), "eval.interval=0", "inference.num_workers=3",
           "weight_sync.transport=" + transport, "weight_sync.topology=" + topology})
    argv.insert(argv.end(), {"--set", set});
  const pid_t pid = arlo::e2e::spawn_logged(argv, log);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    r.error = "arlo run failed; see " + log;
    return r;
  }
  std::stringstream in(arlo::e2e::read_text(dir / "metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const auto rec = nlohmann::json::parse(line, nullptr, false);
    if (!rec.is_object() || rec.value("kind", "") != "weight_sync" || !rec.value("applied", false)) continue;
    r.seconds.push_back(rec.value("weight_sync/seconds", 0.0));
    double slowest = 0;
    for (const auto& w : rec.value("workers", nlohmann::json::array())) {
      slowest = std::max(slowest, w.value("update_s", 0.0));
      ++r.workers;
      r.workers_ok += w.value("ok", false);
    }
    r.update.push_back(slowest);
  }
  const auto summary = nlohmann::json::parse(arlo::e2e::read_text(dir / "summary.json"), nullptr, false);
  std::set<std::string> sums;
  const auto workers =
      summary.is_object() ? summary.value("workers", nlohmann::json::object()) : nlohmann::json::object();
  for (const auto& [name, w] : workers.items())
    sums.insert(w.is_object() ? w.value("checksum", std::string("?")) : std::string("?"));
  const auto trainer_it = summary.is_object() ? summary.find("trainer") : summary.end();
  const std::string trainer =
      trainer_it != summary.end() && trainer_it->is_object() ? trainer_it->value("checksum", std::string()) : "";
  r.checksums = sums.size() == 1 && *sums.begin() == trainer ? "every worker = trainer" : "DIFFER";
  std::filesystem::remove_all(dir);
  std::filesystem::remove(log);
  return r;
}

void print_arlo_run(const std::vector<const ws::TransportDescriptor*>& chosen, int steps) {
  std::printf(
      "\n== arlo run: configs/quickstart.yaml, 3 embedded arlo-workers, %d steps, each version the orchestrator "
      "moves ==\n",
      steps);
  std::printf("%-26s %9s %18s %18s %12s   %s\n", "run", "versions", "update med / max s", "transfer med / max",
              "workers ok", "checksums");
  for (const auto* d : chosen) {
    for (const std::string topology : {"star", "chain"}) {
      if (topology == "chain" && !d->capabilities.relays) continue;
      const std::string label = d->name + " " + topology;
      const auto r = arlo_run_syncs(d->name, topology, steps);
      if (!r.error.empty()) {
        std::printf("%-26s FAILED: %s\n", label.c_str(), r.error.c_str());
        continue;
      }
      std::printf("%-26s %9zu %8.3f / %7.3f %8.3f / %7.3f %5d / %-5d   %s\n", label.c_str(), r.seconds.size(),
                  median(r.seconds), max_of(r.seconds), median(r.update), max_of(r.update), r.workers_ok, r.workers,
                  r.checksums.c_str());
      std::fflush(stdout);
    }
  }
}
#endif

int main(int argc, char** argv) {
  Args args;
  CLI::App app{"arlo weight_sync benchmark (bench/weight_sync/README.md describes the output)"};
  app.add_option("--model", args.model, "qwen3-0.6b | qwen3-1.7b");
  app.add_option("--scale", args.scale,
                 "multiplies layers and vocabulary (model bytes; qwen3-0.6b x0.1 is ~130 MB, x1 1.2 GB)");
  app.add_option("--dtype", args.dtype, "bf16 | f32 | f16");
  app.add_option(
      "--transport", args.transports,
      "comma list of registered transports (default: all, in registration order); the first gives ratio_vs_baseline");
  app.add_option("--receivers", args.receivers, "receiver processes")->check(CLI::Range(1, 8));
  app.add_option("--payload", args.payload, "full | bf16 | fp8 | delta");
  app.add_flag("--zstd", args.zstd, "zstd level 1 on top of the payload");
  app.add_option("--bucket-mb", args.bucket_mb, "bucket size in MiB");
  app.add_option("--delta-density", args.delta_density, "fraction of elements changed between versions (delta)");
  app.add_option("--topology", args.topology, "star | chain | both (chain: only transports whose descriptor relays)")
      ->check(CLI::IsMember({"star", "chain", "both"}));
  app.add_option("--mode", args.mode, "in_place | staging")->check(CLI::IsMember({"in_place", "staging"}));
  app.add_option(
         "--shm-read", args.shm_read,
         "transports with a direct_read option (shm): default | direct (process_vm_readv) | channel (ring/slots)")
      ->check(CLI::IsMember({"default", "direct", "channel"}));
  std::vector<std::string> params;
  app.add_option("--param", params, "KEY=JSON for every transport whose descriptor has KEY (repeatable)");
  app.add_flag("!--no-gloo", args.gloo, "skip the torch.distributed gloo peer");
  app.add_flag("!--no-baselines", args.baselines, "skip memcpy / socket / filesystem baselines");
  app.add_flag("!--no-transfer", args.transfer, "skip the transfer table (Publisher, star and chain)");
  app.add_flag("!--no-stall", args.stall, "skip the staging stall table (StagingPublisher)");
  app.add_flag("!--no-arlo-run", args.arlo_run, "skip star vs chain in `arlo run` with 3 embedded arlo-workers");
  int run_steps = 30;
  app.add_option("--run-steps", run_steps, "arlo run table: steps per run")->check(CLI::Range(4, 100000));
  app.add_option("--versions", args.versions, "stall table: versions the trainer stages")->check(CLI::Range(2, 100));
  app.add_option("--step-ms", args.step_ms, "stall table: the trainer's step, one stage() at the start of each")
      ->check(CLI::Range(0, 600000));
  std::uint64_t blast_kb = 4096;
  app.add_option("--blast-chunk-kb", blast_kb, "raw socket baseline: bytes per send/recv call");
  app.add_option("--repeat", args.repeat, "timed repetitions per measurement; the best is reported")
      ->check(CLI::Range(1, 20));
  app.add_flag("--cluster", args.cluster,
               "only the shaped-link table: sender and receivers in simulated hosts (network namespaces; needs root), "
               "star, chain and gloo at --cluster-receivers against the link limit");
  app.add_option("--link-mbit", args.link_mbit, "--cluster: every host's link rate, Mbit/s each way");
  app.add_option("--link-delay-ms", args.link_delay_ms,
                 "--cluster: one-way latency per link (needs the kernel's sch_netem; without it the rate alone is "
                 "simulated and the header says so)")
      ->check(CLI::Range(0.0, 10000.0));
  app.add_option("--cluster-receivers", args.cluster_receivers, "--cluster: receiver counts, comma list");
  CLI11_PARSE(app, argc, argv);
  g_repeat = args.repeat;
  kBlastChunk = blast_kb << 10;
  for (const auto& p : params) {
    const auto eq = p.find('=');
    if (eq == std::string::npos || eq == 0) {
      std::fprintf(stderr, "--param %s: use KEY=JSON (e.g. reconnect_window_ms=1000)\n", p.c_str());
      return 2;
    }
    auto v = nlohmann::json::parse(p.substr(eq + 1), nullptr, false);
    if (v.is_discarded()) v = p.substr(eq + 1);  // a bare word is a string
    g_params.extra.emplace_back(p.substr(0, eq), v);
  }
  g_params.shm_read = args.shm_read;
  auto chosen = chosen_transports(args.transports);
  if (!chosen) return 2;
  // A collective transport moves a version only inside a group the orchestrator forms
  // (weight_sync/collective.h); this bench has no orchestrator, so its publisher would wait forever.
  std::erase_if(*chosen, [](const ws::TransportDescriptor* d) {
    if (!d->capabilities.collective) return false;
    std::printf(
        "weight_sync %s: skipped, a collective transport (its groups are formed by the orchestrator, which "
        "this bench does not run)\n",
        d->name.c_str());
    return true;
  });
  if (chosen->empty()) {
    std::fprintf(stderr, "no transport left to run\n");
    return 2;
  }

  auto dtype = arlo::safetensors::parse_dtype(args.dtype == "bf16" ? "BF16" : args.dtype == "f16" ? "F16" : "F32");
  auto specs = ws::model_layout(args.model, *dtype, args.scale);
  if (!specs) {
    std::fprintf(stderr, "%s\n", specs.error().what().c_str());
    return 2;
  }
  std::uint64_t bytes = 0;
  for (const auto& s : *specs) bytes += s.nbytes();
  const std::uint64_t bucket = args.bucket_mb << 20;
  const auto dir = std::filesystem::temp_directory_path() / ("arlo-bench-ws-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  g_params.dir = dir;
  std::string names;
  for (const auto* d : *chosen) names += (names.empty() ? "" : ",") + d->name;
  if (args.cluster) {
    const int rc = run_cluster(args, *chosen, *specs, bytes);
    std::error_code cluster_ec;
    std::filesystem::remove_all(dir, cluster_ec);
    return rc;
  }

  std::printf(
      "weight-sync bench: %s x%.3g %s, %zu tensors, %.3f GB; transports %s; receivers %d; payload %s%s; "
      "bucket %llu MiB; topology %s; mode %s; best of %d\n",
      args.model.c_str(), args.scale, args.dtype.c_str(), specs->size(), bytes / 1e9, names.c_str(), args.receivers,
      args.payload.c_str(), args.zstd ? "+zstd" : "", static_cast<unsigned long long>(args.bucket_mb),
      args.topology.c_str(), args.mode.c_str(), args.repeat);
  std::fflush(stdout);

  std::map<std::string, double> base_s;
  if (args.baselines && args.transfer) {
    if (auto j = baseline_memcpy(bytes); j.contains("seconds")) base_s["memcpy"] = j["seconds"];
    if (auto j = baseline_socket(bytes); j.contains("seconds")) base_s["socket"] = j["seconds"];
    if (auto j = baseline_fs(bytes, dir); j.contains("seconds")) base_s["fs"] = j["seconds"];
  }
  auto ratio = [&](const std::string& b, double seconds) -> std::string {
    if (!base_s.count(b) || seconds <= 0) return "  -  ";
    char s[32];
    std::snprintf(s, sizeof s, "%.2fx", base_s[b] / seconds);
    return s;
  };
  std::optional<double> first_ratio;
  const std::uint64_t bound = bytes + 2 * bucket + (64ull << 20);
  bool rss_ok = true;
  if (args.transfer) {
    std::printf(
        "\n== transfer: Publisher::publish, %d receiver(s), sender start to last receiver holding the version ==\n",
        args.receivers);
    std::printf("%-26s %9s %8s %10s %12s %10s   %s\n", "run", "seconds", "GB/s", "send_rss_MB", "recv_rss_MB",
                "wire_MB", "ratio vs memcpy | socket | fs+read");
    for (const auto& [name, label] : std::vector<std::pair<std::string, std::string>>{
             {"memcpy", "baseline memcpy"}, {"socket", "baseline socket blast"}, {"fs", "baseline fs write+read"}})
      if (base_s.count(name))
        std::printf("%-26s %9.3f %8.2f %10s %12s %10s\n", label.c_str(), base_s[name], bytes / 1e9 / base_s[name], "-",
                    "-", mb(bytes).c_str());
    std::map<std::string, double> transport_s;
    for (const auto* d : *chosen) {
      std::vector<bool> topologies;  // false: star, true: chain
      if (args.topology != "chain") topologies.push_back(false);
      if (args.topology != "star") {
        if (d->capabilities.relays)
          topologies.push_back(true);
        else if (args.topology == "chain")
          std::printf("%-26s skipped: its descriptor does not relay\n", ("weight_sync " + d->name + " chain").c_str());
      }
      for (const bool chain : topologies) {
        const std::string label = "weight_sync " + d->name + (chain ? " chain" : args.receivers > 1 ? " star" : "");
        auto r = run_transport(*d, chain, args, *specs);
        if (r.contains("error") || !r.contains("seconds")) {
          std::printf("%-26s FAILED: %s\n", label.c_str(), r.value("error", std::string("no result")).c_str());
          continue;
        }
        const double s = r["seconds"];
        transport_s[label] = s;
        const std::uint64_t rrss = r["receiver_rss"];
        std::printf("%-26s %9.3f %8.2f %10s %12s %10s   %s | %s | %s   payload %s, weights match: %s\n", label.c_str(),
                    s, bytes / 1e9 / s, mb(r["sender_rss"]).c_str(), mb(rrss).c_str(), mb(r["wire"]).c_str(),
                    ratio("memcpy", s).c_str(), ratio("socket", s).c_str(), ratio("fs", s).c_str(),
                    r["payload"].get<std::string>().c_str(), r["weights_match"].dump().c_str());
        std::printf("%-26s path: %s; cpu seconds per version: sender %.3f, busiest receiver %.3f\n", "",
                    r.value("path", std::string("?")).c_str(), r.value("sender_cpu", 0.0),
                    r.value("receiver_cpu", 0.0));
        if (rrss > bound) rss_ok = false;
        if (!first_ratio) {
          // Durable transports against writing and reading a file, streaming ones against the socket blast.
          const std::string b = d->capabilities.durable ? "fs" : "socket";
          if (base_s.count(b)) first_ratio = base_s[b] / s;
        }
        if (args.payload == "delta")
          std::printf("%-26s delta moved %.2f%% of the full bytes (%.1f%% elements changed)\n", "",
                      100.0 * r["wire"].get<double>() / static_cast<double>(bytes), 100 * args.delta_density);
        std::fflush(stdout);
      }
    }
    if (args.gloo) {
      auto g = baseline_gloo(bytes, args.receivers, bucket);
      if (!g.contains("seconds")) {
        std::printf("%-26s attempt failed (%s); retrying once\n", "peer torch gloo broadcast",
                    g.is_object() ? g.value("error", "no result").c_str() : "no result");
        std::fflush(stdout);
        g = baseline_gloo(bytes, args.receivers, bucket);
      }
      if (g.contains("seconds")) {
        const double s = g["seconds"];
        std::printf("%-26s %9.3f %8.2f %10s %12s %10s   %s | %s | %s\n", "peer torch gloo broadcast", s,
                    bytes / 1e9 / s, mb(g["sender_rss"]).c_str(), mb(g["receiver_rss"]).c_str(), mb(bytes).c_str(),
                    ratio("memcpy", s).c_str(), ratio("socket", s).c_str(), ratio("fs", s).c_str());
        for (const auto& [t, ts] : transport_s) std::printf("%-26s %.2fx faster than gloo\n", t.c_str(), s / ts);
      } else {
        std::printf("%-26s unavailable: %s (needs /usr/bin/python3 with torch)\n", "peer torch gloo broadcast",
                    g.is_object() ? g.value("error", "no result").c_str() : "no result");
      }
    }
    std::printf("receiver peak RSS bound (model + 2 buckets + 64 MiB) = %s MB: %s\n", mb(bound).c_str(),
                rss_ok ? "within" : "EXCEEDED");
  }
  if (args.stall) {
    std::printf(
        "\n== stall: StagingPublisher::stage, %d versions, one per %d ms trainer step, %d receiver(s) pulling each "
        "announced version ==\n",
        args.versions, args.step_ms, args.receivers);
    std::printf("%-12s %17s %8s %8s %16s %17s   %-15s %s\n", "transport", "stall med / max", "copy", "memcpy",
                "stall/copy m/max", "stall/mcpy v2+ m/max", "e2e med / max", "all");
    for (const auto* d : *chosen) {
      print_staging(run_staging(*d, args, *specs, bytes), args.receivers);
      std::fflush(stdout);
    }
  }
#ifdef ARLO_BINARY
  if (args.arlo_run) print_arlo_run(*chosen, run_steps);
#else
  (void)run_steps;
#endif
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (args.transfer) {
    if (first_ratio)
      std::printf("ratio_vs_baseline=%.3f\n", *first_ratio);
    else
      std::printf("ratio_vs_baseline=0\n");
  }
  return 0;
}
