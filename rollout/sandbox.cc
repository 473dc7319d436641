#include "rollout/sandbox.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>
#include <utility>

#include <fmt/format.h>

namespace arlo::rollout {

// One step of building the sandbox's root, prepared by create() so that the child only makes system
// calls (it is a copy of a threaded process: no allocation, no locks, no glibc wrapper that talks to
// other threads).
struct Sandbox::Mount {
  enum class Kind { kDir, kSymlink, kBind, kProc, kScratch };
  Kind kind = Kind::kDir;
  std::string target;   // absolute, under the staging root
  std::string source;   // kBind: the host path; kSymlink: the link's text
  bool file = false;    // kBind: a file (its mount point is an empty file)
  bool device = false;  // kBind: a device node (not nodev)
};

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kStaging = "/tmp";   // where the new root is built, inside the namespace only
constexpr std::uint32_t kInsideId = 1000;  // the program's uid and gid inside
constexpr std::size_t kMaxMounts = 64;
constexpr std::size_t kMaxExecCandidates = 3;

// What the child tells arlo on the status pipe.
struct Report {
  enum Kind : int { kSetupFailed = 1, kReady = 2, kExited = 3 };
  int kind = 0;
  int step = 0;   // kSetupFailed: a Step
  int index = 0;  // kSetupFailed: the Mount or file it was at (-1: none)
  int err = 0;    // kSetupFailed: errno; kExited: the wait status
};

enum Step : int {
  kWait,
  kPrivate,
  kOpenTree,
  kRootMount,
  kMkdir,
  kSymlink,
  kMountPoint,
  kSetattr,
  kMoveMount,
  kProcMount,
  kScratchMount,
  kPivot,
  kDetach,
  kRemountRoot,
  kBounding,
  kGroups,
  kSetgid,
  kSetuid,
  kWriteFile,
  kForkProgram,
  kRlimit,
  kNoNewPrivs,
  kStdio,
  kStepCount
};

constexpr std::array<const char*, kStepCount> kStepNames = {
    "waiting for arlo to map its ids",
    "making / private",
    "cloning a read-only path (open_tree)",
    "mounting the root tmpfs",
    "making a directory",
    "making a symlink",
    "making a mount point",
    "making a mount read-only (mount_setattr)",
    "moving a mount into place (move_mount)",
    "mounting /proc",
    "mounting the scratch tmpfs",
    "pivot_root",
    "detaching the old root",
    "remounting the root read-only",
    "dropping the capability bounding set",
    "dropping supplementary groups",
    "setresgid",
    "setresuid",
    "writing a file into the scratch",
    "forking the program",
    "setting a resource limit",
    "setting no_new_privs",
    "setting up stdin/stdout/stderr",
};

// Everything the child reads, built before the clone.
struct ChildPlan {
  const Sandbox::Mount* mounts = nullptr;
  std::size_t mount_count = 0;
  const char* scratch_options = nullptr;
  const char* root_options = nullptr;
  bool privileged = false;
  bool probe = false;
  std::vector<std::string> file_paths;
  const std::vector<SandboxFile>* files = nullptr;
  std::array<const char*, kMaxExecCandidates> exec_paths{};
  std::vector<char*> argv, envp;
  std::array<rlimit, 6> limits{};
  std::array<__rlimit_resource_t, 6> limit_kinds{};
  int sync_r = -1, status_w = -1, in_r = -1, out_w = -1, err_w = -1, result_w = -1;
};

// ---- the child (the namespace's init and the program): system calls only ---------------------------

void send_report(int fd, Report r) {
  while (::write(fd, &r, sizeof r) < 0 && errno == EINTR) {
  }
}

[[noreturn]] void fail(const ChildPlan& p, Step step, int index = -1) {
  send_report(p.status_w, {Report::kSetupFailed, step, index, errno});
  ::_exit(125);
}

long raw_clone(unsigned long flags) { return ::syscall(SYS_clone, flags | SIGCHLD, nullptr, nullptr, nullptr, 0); }

void write_text(int fd, const char* s) { [[maybe_unused]] const ssize_t n = ::write(fd, s, std::strlen(s)); }

// Clones each bind source (before the staging root hides anything under it).
void open_trees(const ChildPlan& p, int* trees) {
  for (std::size_t i = 0; i < p.mount_count; ++i) {
    trees[i] = -1;
    if (p.mounts[i].kind != Sandbox::Mount::Kind::kBind) continue;
    trees[i] = ::open_tree(AT_FDCWD, p.mounts[i].source.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
    if (trees[i] < 0) fail(p, kOpenTree, static_cast<int>(i));
  }
}

void place_bind(const ChildPlan& p, std::size_t i, int tree) {
  const Sandbox::Mount& m = p.mounts[i];
  const int at = static_cast<int>(i);
  if (m.file) {
    const int fd = ::open(m.target.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0444);
    if (fd < 0) fail(p, kMountPoint, at);
    ::close(fd);
  } else if (::mkdir(m.target.c_str(), 0755) != 0 && errno != EEXIST) {
    fail(p, kMountPoint, at);
  }
  mount_attr attr{};
  attr.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | (m.device ? 0 : MOUNT_ATTR_NODEV);
  if (::mount_setattr(tree, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr) != 0) fail(p, kSetattr, at);
  if (::move_mount(tree, "", AT_FDCWD, m.target.c_str(), MOVE_MOUNT_F_EMPTY_PATH) != 0) fail(p, kMoveMount, at);
  ::close(tree);
}

// Builds the root under kStaging and pivots into it.
void build_root(const ChildPlan& p) {
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) fail(p, kPrivate);
  int trees[kMaxMounts];
  open_trees(p, trees);
  // Files are made as the inside ids (arlo's own, root, is not mapped in the namespace); the
  // capabilities stay until the exec.
  ::syscall(SYS_setfsgid, kInsideId);
  ::syscall(SYS_setfsuid, kInsideId);
  if (::mount("arlo-sandbox", kStaging, "tmpfs", MS_NOSUID | MS_NODEV, p.root_options) != 0) fail(p, kRootMount);
  for (std::size_t i = 0; i < p.mount_count; ++i) {
    const Sandbox::Mount& m = p.mounts[i];
    const int at = static_cast<int>(i);
    switch (m.kind) {
      case Sandbox::Mount::Kind::kDir:
        if (::mkdir(m.target.c_str(), 0755) != 0 && errno != EEXIST) fail(p, kMkdir, at);
        break;
      case Sandbox::Mount::Kind::kSymlink:
        if (::symlink(m.source.c_str(), m.target.c_str()) != 0) fail(p, kSymlink, at);
        break;
      case Sandbox::Mount::Kind::kBind: place_bind(p, i, trees[i]); break;
      case Sandbox::Mount::Kind::kProc:
        if (::mount("proc", m.target.c_str(), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0)
          fail(p, kProcMount, at);
        break;
      case Sandbox::Mount::Kind::kScratch:
        if (::mount("arlo-scratch", m.target.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, p.scratch_options) != 0)
          fail(p, kScratchMount, at);
        break;
    }
  }
  if (::chdir(kStaging) != 0 || ::syscall(SYS_pivot_root, ".", ".") != 0) fail(p, kPivot);
  if (::umount2(".", MNT_DETACH) != 0 || ::chdir("/") != 0) fail(p, kDetach);
  if (::mount(nullptr, "/", nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr) != 0)
    fail(p, kRemountRoot);
}

// Becomes uid/gid kInsideId with no capabilities to regain.
void drop_privileges(const ChildPlan& p) {
  for (int cap = 0; cap < 64; ++cap)
    if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) fail(p, kBounding);
  if (p.privileged && ::syscall(SYS_setgroups, 0, nullptr) != 0) fail(p, kGroups);
  if (::syscall(SYS_setresgid, kInsideId, kInsideId, kInsideId) != 0) fail(p, kSetgid);
  if (::syscall(SYS_setresuid, kInsideId, kInsideId, kInsideId) != 0) fail(p, kSetuid);
}

void write_files(const ChildPlan& p) {
  for (std::size_t i = 0; i < p.files->size(); ++i) {
    const int fd = ::open(p.file_paths[i].c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) fail(p, kWriteFile, static_cast<int>(i));
    const std::string& content = (*p.files)[i].content;
    for (std::size_t done = 0; done < content.size();) {
      const ssize_t w = ::write(fd, content.data() + done, content.size() - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail(p, kWriteFile, static_cast<int>(i));
      done += static_cast<std::size_t>(w);
    }
    ::close(fd);
  }
}

// The program: limits, stdio, then exec. Failures before stdio go to the status pipe.
[[noreturn]] void exec_program(const ChildPlan& p) {
  for (std::size_t i = 0; i < p.limits.size(); ++i)
    if (::setrlimit(p.limit_kinds[i], &p.limits[i]) != 0) fail(p, kRlimit, static_cast<int>(i));
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail(p, kNoNewPrivs);
  const int fds[4] = {p.in_r, p.out_w, p.err_w, p.result_w};
  const int keep = p.result_w >= 0 ? 4 : 3;
  // Move the pipes above the target numbers first so that no dup2 overwrites one still needed.
  int high[4];
  for (int i = 0; i < keep; ++i)
    if ((high[i] = ::fcntl(fds[i], F_DUPFD, 10)) < 0) fail(p, kStdio);
  for (int i = 0; i < keep; ++i)
    if (::dup2(high[i], i) < 0) fail(p, kStdio);
  ::close_range(static_cast<unsigned>(keep), ~0U, 0);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) ::sigaction(sig, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  for (const char* path : p.exec_paths) {
    if (!path) break;
    ::execve(path, p.argv.data(), p.envp.data());
    if (errno != ENOENT) break;
  }
  write_text(2, "arlo sandbox: cannot execute ");
  write_text(2, p.argv[0]);
  write_text(2, "\n");
  ::_exit(127);
}

// Closes every descriptor inherited from arlo but the plan's own (arlo's sockets, other sandboxes'
// pipes: a pipe held here would keep its reader waiting for an end of file).
void close_others(const ChildPlan& p) {
  int keep[6] = {p.sync_r, p.status_w, p.in_r, p.out_w, p.err_w, p.result_w};
  for (int i = 1; i < 6; ++i)
    for (int j = i; j > 0 && keep[j - 1] > keep[j]; --j) std::swap(keep[j - 1], keep[j]);
  unsigned next = 0;
  for (int fd : keep) {
    if (fd < 0) continue;
    if (static_cast<unsigned>(fd) > next) ::close_range(next, static_cast<unsigned>(fd) - 1, 0);
    next = static_cast<unsigned>(fd) + 1;
  }
  ::close_range(next, ~0U, 0);
}

// The namespace's init: builds the sandbox, starts the program, exits with it.
[[noreturn]] void sandbox_init(const ChildPlan& p) {
  close_others(p);
  char go = 0;
  if (::read(p.sync_r, &go, 1) != 1) fail(p, kWait);
  ::prctl(PR_SET_DUMPABLE, 0);  // after arlo wrote the id maps: the program (same uid) cannot ptrace its init
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  ::setsid();
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGCHLD, &dfl, nullptr);
  build_root(p);
  drop_privileges(p);
  if (p.probe) {
    send_report(p.status_w, {Report::kReady, 0, 0, 0});
    ::_exit(0);
  }
  write_files(p);
  if (::chdir("/tmp") != 0) fail(p, kWriteFile);
  const long program = raw_clone(0);
  if (program < 0) fail(p, kForkProgram);
  if (program == 0) exec_program(p);
  for (int fd : {p.in_r, p.out_w, p.err_w, p.result_w})
    if (fd >= 0) ::close(fd);
  // Reap whatever the program left (init inherits orphans) until the program itself ends.
  for (;;) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0 && errno == EINTR) continue;
    if (pid < 0 || pid == program) {
      send_report(p.status_w, {Report::kExited, 0, 0, pid < 0 ? -1 : status});
      ::_exit(0);
    }
  }
}

// ---- the parent ------------------------------------------------------------------------------------

auto errno_error(const std::string& what) {
  return make_error(ErrorCode::kUnavailable, fmt::format("sandbox: {}: {}", what, std::strerror(errno)));
}

struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    reset();
    fd = std::exchange(o.fd, -1);
    return *this;
  }
  ~Fd() { reset(); }
  void reset() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

struct Pipe {
  Fd read, write;
};

Result<Pipe> make_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return errno_error("pipe");
  return Pipe{Fd(fds[0]), Fd(fds[1])};
}

// stdin is a socket so that writing to a program that is gone cannot raise SIGPIPE in arlo.
Result<Pipe> make_input_socket() {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return errno_error("socketpair");
  return Pipe{Fd(fds[0]), Fd(fds[1])};
}

Status write_proc_file(long pid, const char* name, const std::string& text) {
  const std::string path = fmt::format("/proc/{}/{}", pid, name);
  Fd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (fd.fd < 0 || ::write(fd.fd, text.data(), text.size()) != static_cast<ssize_t>(text.size()))
    return errno_error("writing " + path);
  return ok();
}

std::string setup_failure(const Report& r, const std::vector<Sandbox::Mount>& mounts,
                          const std::vector<SandboxFile>& files) {
  std::string what = r.step >= 0 && r.step < kStepCount ? kStepNames[static_cast<std::size_t>(r.step)] : "?";
  if (r.step == kWriteFile && r.index >= 0 && static_cast<std::size_t>(r.index) < files.size())
    what += " (" + files[static_cast<std::size_t>(r.index)].name + ")";
  else if (r.step != kRlimit && r.index >= 0 && static_cast<std::size_t>(r.index) < mounts.size())
    what += " (" + mounts[static_cast<std::size_t>(r.index)].target + ")";
  return fmt::format("sandbox: {}: {}", what, std::strerror(r.err));
}

void fill_limits(ChildPlan& plan, const SandboxLimits& l) {
  const auto cpu = static_cast<rlim_t>(std::ceil(l.cpu_s));
  const auto mb = [](std::int64_t v) { return static_cast<rlim_t>(v) << 20; };
  plan.limit_kinds = {RLIMIT_CPU, RLIMIT_AS, RLIMIT_NPROC, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE};
  plan.limits = {rlimit{cpu, cpu + 1}, rlimit{mb(l.memory_mb), mb(l.memory_mb)},
                 // the init counts as one process of the uid
                 rlimit{static_cast<rlim_t>(l.processes + 1), static_cast<rlim_t>(l.processes + 1)},
                 rlimit{mb(l.file_size_mb), mb(l.file_size_mb)},
                 rlimit{static_cast<rlim_t>(l.open_files), static_cast<rlim_t>(l.open_files)}, rlimit{0, 0}};
}

// Reads what the streams hold now, up to the cap; false once a stream is over it.
struct Streams {
  std::array<int, 3> fds{-1, -1, -1};  // stdout, stderr, result
  std::array<std::string*, 3> into{};
  std::size_t cap = 0;
  bool cut = false;

  bool open() const { return fds[0] >= 0 || fds[1] >= 0 || fds[2] >= 0; }
  void read_ready(const pollfd* ready, std::size_t n) {
    for (std::size_t k = 0; k < n; ++k) {
      if (!(ready[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      for (std::size_t i = 0; i < fds.size(); ++i)
        if (fds[i] == ready[k].fd) read_one(i);
    }
  }
  void read_one(std::size_t i) {
    char buf[65536];
    const ssize_t r = ::read(fds[i], buf, sizeof buf);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (r <= 0) {
      fds[i] = -1;  // the owner closes it
      return;
    }
    const std::size_t room = cap - std::min(cap, into[i]->size());
    into[i]->append(buf, std::min(room, static_cast<std::size_t>(r)));
    if (static_cast<std::size_t>(r) > room) cut = true;
  }
};

}  // namespace

Sandbox::Sandbox(SandboxOptions options) : options_(std::move(options)) {}
Sandbox::~Sandbox() = default;

namespace {

Status check_limits(const SandboxLimits& l) {
  const auto bad = [](const char* key, double v) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("sandbox: {} must be positive (got {})", key, v));
  };
  if (!(l.cpu_s > 0)) return bad("cpu_s", l.cpu_s);
  if (!(l.timeout_s > 0)) return bad("timeout_s", l.timeout_s);
  for (const auto& [key, v] : {std::pair{"memory_mb", l.memory_mb},
                               {"processes", l.processes},
                               {"file_size_mb", l.file_size_mb},
                               {"open_files", l.open_files},
                               {"scratch_mb", l.scratch_mb},
                               {"max_output_bytes", l.max_output_bytes}})
    if (v <= 0) return bad(key, static_cast<double>(v));
  if (l.open_files < 4)
    return make_error(ErrorCode::kInvalidArgument, "sandbox: open_files must be at least 4 (stdio and the result)");
  return ok();
}

// The root's steps: the read-only paths, /dev, /proc and the scratch.
Result<std::vector<Sandbox::Mount>> plan_mounts(const std::vector<std::string>& paths) {
  using Kind = Sandbox::Mount::Kind;
  std::vector<Sandbox::Mount> out;
  const auto under = [](const std::string& p) { return std::string(kStaging) + p; };
  const auto parents = [&](const fs::path& p) {
    fs::path at = "/";
    for (auto it = p.begin(); it != p.end(); ++it) {
      if (std::next(it) == p.end() || *it == "/") continue;
      at /= *it;
      out.push_back({Kind::kDir, under(at.string()), "", false, false});
    }
  };
  for (const auto& raw : paths) {
    const fs::path p = fs::path(raw).lexically_normal();
    if (!p.is_absolute() || p == "/")
      return make_error(ErrorCode::kInvalidArgument, fmt::format("sandbox: read-only path '{}' is not absolute", raw));
    std::error_code ec;
    const auto st = fs::symlink_status(p, ec);
    if (ec || !fs::exists(st)) continue;
    parents(p);
    if (fs::is_symlink(st))
      out.push_back({Kind::kSymlink, under(p.string()), fs::read_symlink(p, ec).string(), false, false});
    else
      out.push_back({Kind::kBind, under(p.string()), p.string(), !fs::is_directory(st), false});
  }
  out.push_back({Kind::kDir, under("/dev"), "", false, false});
  for (const char* dev : {"/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"})
    out.push_back({Kind::kBind, under(dev), dev, true, true});
  out.push_back({Kind::kDir, under("/proc"), "", false, false});
  out.push_back({Kind::kProc, under("/proc"), "", false, false});
  out.push_back({Kind::kDir, under("/tmp"), "", false, false});
  out.push_back({Kind::kScratch, under("/tmp"), "", false, false});
  if (out.size() > kMaxMounts)
    return make_error(ErrorCode::kInvalidArgument, fmt::format("sandbox: too many read-only paths ({})", paths.size()));
  return out;
}

}  // namespace

Result<std::shared_ptr<const Sandbox>> Sandbox::create(SandboxOptions options) {
  ARLO_TRY(check_limits(options.limits));
  if (!fs::is_directory(kStaging))
    return make_error(ErrorCode::kUnavailable, fmt::format("sandbox: needs the directory {} to build on", kStaging));
  auto box = std::make_shared<Sandbox>(std::move(options));
  ARLO_ASSIGN_OR_RETURN(box->mounts_, plan_mounts(box->options_.read_only_paths));
  box->scratch_options_ = fmt::format("size={}m,nr_inodes=4096,mode=0700,uid={},gid={}",
                                      box->options_.limits.scratch_mb, kInsideId, kInsideId);
  box->root_options_ = fmt::format("size=1m,nr_inodes=1024,mode=0755,uid={},gid={}", kInsideId, kInsideId);
  box->privileged_ = ::geteuid() == 0;
  box->outside_uid_ = box->privileged_ ? 65534 : ::geteuid();
  box->outside_gid_ = box->privileged_ ? 65534 : ::getegid();
  auto probe = box->run_checked(SandboxRequest{}, true);
  if (!probe) {
    Error e = probe.error();
    e.with_context(
        fmt::format("this machine cannot run the code sandbox (arlo uid {}); refusing to run programs "
                    "without it",
                    ::geteuid()));
    return std::unexpected(std::move(e));
  }
  return std::shared_ptr<const Sandbox>(std::move(box));
}

Result<SandboxResult> Sandbox::run(const SandboxRequest& request) const {
  if (request.argv.empty()) return make_error(ErrorCode::kInvalidArgument, "sandbox: empty argv");
  for (const auto& f : request.files)
    if (f.name.empty() || f.name.find('/') != std::string::npos || f.name == "." || f.name == "..")
      return make_error(ErrorCode::kInvalidArgument, fmt::format("sandbox: bad file name '{}'", f.name));
  return run_checked(request, false);
}

namespace {

// The plan's strings and arrays (they live in the caller's frame for the clone).
void fill_request(ChildPlan& plan, const SandboxRequest& r, std::vector<std::string>& exec_paths) {
  plan.files = &r.files;
  for (const auto& f : r.files) plan.file_paths.push_back("/tmp/" + f.name);
  if (r.argv.empty()) return;
  if (r.argv[0].find('/') != std::string::npos)
    exec_paths = {r.argv[0]};
  else
    exec_paths = {"/usr/local/bin/" + r.argv[0], "/usr/bin/" + r.argv[0], "/bin/" + r.argv[0]};
  for (std::size_t i = 0; i < exec_paths.size(); ++i) plan.exec_paths[i] = exec_paths[i].c_str();
  for (const auto& a : r.argv) plan.argv.push_back(const_cast<char*>(a.c_str()));
  plan.argv.push_back(nullptr);
  static const char* const kEnv[] = {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "TMPDIR=/tmp", "LANG=C.UTF-8",
                                     "PYTHONDONTWRITEBYTECODE=1"};
  for (const char* e : kEnv) plan.envp.push_back(const_cast<char*>(e));
  plan.envp.push_back(nullptr);
}

// Talks to a running sandbox: stdin, the streams, the deadline; returns once its init is reaped.
void supervise(long pid, int pidfd, Fd& input_w, const std::string& input, Streams& streams, Clock::time_point deadline,
               SandboxResult& out) {
  std::size_t sent = 0;
  if (input.empty()) input_w.reset();
  bool ended = false, killed = false;
  while (!ended || streams.open()) {
    std::vector<pollfd> fds;
    if (!ended) fds.push_back({pidfd, POLLIN, 0});
    for (int fd : streams.fds)
      if (fd >= 0) fds.push_back({fd, POLLIN, 0});
    if (input_w.fd >= 0) fds.push_back({input_w.fd, POLLOUT, 0});
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (!killed && !ended && (left <= 0 || streams.cut)) {
      out.timed_out = !streams.cut;
      ::kill(static_cast<pid_t>(pid), SIGKILL);
      killed = true;
    }
    const int n = ::poll(fds.data(), fds.size(), killed ? 1000 : static_cast<int>(std::max<long long>(left, 1)));
    if (n < 0 && errno != EINTR) break;
    for (const auto& f : fds) {
      if (f.fd == pidfd && (f.revents & POLLIN)) ended = true;
      if (f.fd == input_w.fd && (f.revents & (POLLOUT | POLLERR | POLLHUP))) {
        const ssize_t w = ::send(input_w.fd, input.data() + sent, input.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) sent += static_cast<std::size_t>(w);
        if ((w < 0 && errno != EAGAIN && errno != EINTR) || sent == input.size()) input_w.reset();
      }
    }
    streams.read_ready(fds.data(), fds.size());
    if (ended) input_w.reset();
  }
  out.output_cut = streams.cut;
  int status = 0;
  while (::waitpid(static_cast<pid_t>(pid), &status, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace

Result<SandboxResult> Sandbox::run_checked(const SandboxRequest& request, bool probe) const {
  ARLO_ASSIGN_OR_RETURN(Pipe sync, make_pipe());
  ARLO_ASSIGN_OR_RETURN(Pipe status, make_pipe());
  ARLO_ASSIGN_OR_RETURN(Pipe input, make_input_socket());
  ARLO_ASSIGN_OR_RETURN(Pipe out, make_pipe());
  ARLO_ASSIGN_OR_RETURN(Pipe err, make_pipe());
  Pipe result;
  if (request.result_pipe) {
    ARLO_ASSIGN_OR_RETURN(result, make_pipe());
  }

  ChildPlan plan;
  plan.mounts = mounts_.data();
  plan.mount_count = mounts_.size();
  plan.scratch_options = scratch_options_.c_str();
  plan.root_options = root_options_.c_str();
  plan.privileged = privileged_;
  plan.probe = probe;
  std::vector<std::string> exec_paths;
  fill_request(plan, request, exec_paths);
  fill_limits(plan, options_.limits);
  plan.sync_r = sync.read.fd;
  plan.status_w = status.write.fd;
  plan.in_r = input.read.fd;
  plan.out_w = out.write.fd;
  plan.err_w = err.write.fd;
  plan.result_w = result.write.fd;

  const auto start = Clock::now();
  const long pid = raw_clone(CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS);
  if (pid < 0) return errno_error("clone with new user, PID, network, mount, IPC and UTS namespaces");
  if (pid == 0) sandbox_init(plan);
  for (Fd* mine : {&sync.read, &status.write, &input.read, &out.write, &err.write, &result.write}) mine->reset();

  SandboxResult res;
  res.init_pid = pid;
  Fd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  Status mapped = ok();
  if (pidfd.fd < 0) mapped = errno_error("pidfd_open");
  if (mapped && !privileged_) mapped = write_proc_file(pid, "setgroups", "deny");
  if (mapped) mapped = write_proc_file(pid, "uid_map", fmt::format("{} {} 1\n", kInsideId, outside_uid_));
  if (mapped) mapped = write_proc_file(pid, "gid_map", fmt::format("{} {} 1\n", kInsideId, outside_gid_));
  struct stat ns {};
  if (::stat(fmt::format("/proc/{}/ns/pid", pid).c_str(), &ns) == 0) res.pid_namespace = ns.st_ino;
  if (!mapped) {
    ::kill(static_cast<pid_t>(pid), SIGKILL);
    int st = 0;
    while (::waitpid(static_cast<pid_t>(pid), &st, 0) < 0 && errno == EINTR) {
    }
    return std::unexpected(mapped.error());
  }
  const char go = 1;
  [[maybe_unused]] const ssize_t w = ::write(sync.write.fd, &go, 1);
  sync.write.reset();

  Streams streams;
  streams.fds = {out.read.fd, err.read.fd, result.read.fd};
  streams.into = {&res.out, &res.err, &res.result};
  streams.cap = static_cast<std::size_t>(options_.limits.max_output_bytes);
  const auto deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.limits.timeout_s));
  supervise(pid, pidfd.fd, input.write, request.input, streams, deadline, res);
  res.wall_s = std::chrono::duration<double>(Clock::now() - start).count();

  std::optional<Report> exited;
  for (Report r; ::read(status.read.fd, &r, sizeof r) == static_cast<ssize_t>(sizeof r);) {
    if (r.kind == Report::kSetupFailed)
      return make_error(ErrorCode::kUnavailable, setup_failure(r, mounts_, request.files));
    if (r.kind == Report::kExited || r.kind == Report::kReady) exited = r;
  }
  if (probe && !exited) return make_error(ErrorCode::kUnavailable, "sandbox: the empty sandbox ended without a word");
  if (exited && exited->kind == Report::kExited) {
    const int st = exited->err;
    if (WIFEXITED(st)) res.exit_code = WEXITSTATUS(st);
    if (WIFSIGNALED(st)) res.signal = WTERMSIG(st);
  } else if (!probe) {
    res.signal = SIGKILL;  // its init was killed: by the deadline, the output cap, or from outside
  }
  return res;
}

}  // namespace arlo::rollout
