#pragma once
// A sandbox that runs one untrusted program (the code_exec reward's samples) and returns its output.
//
// Each run() is one child process tree in its own namespaces, built from scratch and gone when run()
// returns:
//   - user namespace: the program runs as uid/gid 1000 inside, which is `nobody` (65534) outside when
//     arlo is root and arlo's own uid otherwise; it has no capabilities (they are dropped at exec, the
//     bounding set is emptied, no_new_privs is set) and no supplementary groups (when arlo is root);
//   - PID namespace: a small init (the first process, also arlo's child) forks the program and exits
//     with it; when the init dies the kernel kills everything left in the namespace, so a deadline or
//     a finished program leaves no process behind. Inside, the program cannot name arlo's processes;
//     it runs in a session and process group of its own;
//   - network namespace: only the loopback interface, down: no connection leaves it;
//   - mount, IPC and UTS namespaces: the root is a fresh read-only tmpfs holding read-only,
//     nosuid, nodev bind mounts of the system directories (`read_only_paths`, recursively), /dev/null,
//     /dev/zero, /dev/random, /dev/urandom, a /proc of its own, and one scratch tmpfs of `scratch_mb`
//     at /tmp (the working directory, HOME and TMPDIR). Nothing is created on arlo's filesystem: the
//     mounts exist only in the namespace and go with it;
//   - resource limits: RLIMIT_CPU, RLIMIT_AS, RLIMIT_NPROC, RLIMIT_FSIZE, RLIMIT_NOFILE, no core files;
//   - file descriptors: stdin, stdout, stderr (pipes to arlo) and, when asked, fd 3 (a result pipe);
//     every other one is closed;
//   - the parent enforces a wall-clock deadline (SIGKILL to the init kills the namespace) and caps
//     each output stream: a program that writes past max_output_bytes is killed, never buffered on.
// Where the machine cannot build this (no user namespaces, no new mount API, ...), create() fails
// with the reason: the sandbox never runs a program with less isolation than it describes.
//
// arlo writes the id maps of its child through /proc: when not root it must be dumpable (as any
// program started normally is; one that dropped root by setuid without an exec is not).
//
// Thread-safety: a Sandbox is immutable after create(); run() may be called from many threads at once
// (each call blocks its thread until its program has ended and its namespace is gone).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"

namespace arlo::rollout {

struct SandboxLimits {
  double cpu_s = 5;                         // RLIMIT_CPU per process (SIGXCPU, then SIGKILL 1 s later)
  double timeout_s = 10;                    // wall clock of the whole run, enforced by arlo
  std::int64_t memory_mb = 512;             // RLIMIT_AS per process
  std::int64_t processes = 16;              // RLIMIT_NPROC: processes of the program's uid in its namespace
  std::int64_t file_size_mb = 16;           // RLIMIT_FSIZE
  std::int64_t open_files = 64;             // RLIMIT_NOFILE
  std::int64_t scratch_mb = 64;             // size of the /tmp tmpfs
  std::int64_t max_output_bytes = 1 << 20;  // per stream (stdout, stderr, result): past it the run is killed
};

struct SandboxOptions {
  SandboxLimits limits;
  // Host directories (or files) seen read-only at the same path inside; symlinks (/bin -> usr/bin) are
  // recreated as symlinks, missing paths are skipped.
  std::vector<std::string> read_only_paths = {"/usr", "/bin", "/lib", "/lib64", "/sbin", "/etc"};
};

struct SandboxFile {
  std::string name;  // a plain file name in the scratch directory (no '/')
  std::string content;
};

struct SandboxRequest {
  // argv[0] is an absolute path, or a name looked up in /usr/local/bin, /usr/bin and /bin inside.
  std::vector<std::string> argv;
  std::vector<SandboxFile> files;  // written into /tmp (the scratch) before the program starts
  std::string input;               // the program's stdin (then end of file)
  bool result_pipe = false;        // fd 3 is a pipe whose bytes come back in SandboxResult::result
};

struct SandboxResult {
  int exit_code = -1;       // the program's exit status; -1 when a signal ended it or it never ended
  int signal = 0;           // the signal that ended it (SIGKILL after a deadline or an output cut)
  bool timed_out = false;   // past timeout_s: killed
  bool output_cut = false;  // a stream passed max_output_bytes: killed
  std::string out, err, result;
  double wall_s = 0;
  std::int64_t init_pid = 0;        // the namespace's init as arlo saw it (reaped when run() returns)
  std::uint64_t pid_namespace = 0;  // inode of its PID namespace (no process is left in it after run())

  bool exited_ok() const { return exit_code == 0 && !timed_out && !output_cut; }
};

class Sandbox {
 public:
  // Checks that this machine can build the sandbox by running an empty one (kUnavailable with the step
  // that failed and why: "unshare ... user namespace: Operation not permitted").
  static Result<std::shared_ptr<const Sandbox>> create(SandboxOptions options);

  // Runs one program to its end, its deadline or its output cap. Errors only for what arlo could not
  // do (a pipe, clone, the namespace setup); a program that fails is a result, not an error.
  Result<SandboxResult> run(const SandboxRequest& request) const;

  const SandboxOptions& options() const { return options_; }

  struct Mount;  // one step of building the root (sandbox.cc)
  ~Sandbox();

  explicit Sandbox(SandboxOptions options);  // use create()

 private:
  Result<SandboxResult> run_checked(const SandboxRequest& request, bool probe) const;

  SandboxOptions options_;
  std::vector<Mount> mounts_;
  std::string scratch_options_, root_options_;  // tmpfs options of /tmp and of the root
  std::uint32_t outside_uid_ = 0, outside_gid_ = 0;
  bool privileged_ = false;  // arlo has CAP_SETUID: maps to nobody and drops supplementary groups
};

}  // namespace arlo::rollout
