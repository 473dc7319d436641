#include "weight_sync/transports/proc_util.h"

#include <linux/futex.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>

namespace arlo::weight_sync::detail {

bool process_alive(pid_t pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno != EPERM) return false;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (!f) return false;
  char buf[512];
  std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* close_paren = std::strrchr(buf, ')');
  if (!close_paren || close_paren[1] == 0) return true;
  const char state = close_paren[2];
  return state != 'Z' && state != 'X';
}

void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t seen, std::chrono::microseconds timeout) {
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000);
  ts.tv_nsec = static_cast<long>((timeout.count() % 1000000) * 1000);
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void futex_bump_and_wake(std::atomic<std::uint32_t>& word) {
  word.fetch_add(1, std::memory_order_acq_rel);
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

int read_remote(pid_t pid, std::span<std::byte> local, std::uint64_t remote) {
  while (true) {
    iovec l{local.data(), local.size()};
    iovec r{reinterpret_cast<void*>(static_cast<std::uintptr_t>(remote)), local.size()};
    const ssize_t n = ::process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    return static_cast<std::size_t>(n) == local.size() ? 0 : EFAULT;
  }
}

std::string allow_same_user_readers() {
  std::ifstream in("/proc/sys/kernel/yama/ptrace_scope");
  int scope = -1;
  if (!(in >> scope)) return "no Yama ptrace restriction";
  if (scope == 0) return "Yama ptrace_scope 0 (same-user readers allowed)";
  if (scope >= 2) return "Yama ptrace_scope " + std::to_string(scope) + " (cross-process reads need CAP_SYS_PTRACE)";
  if (::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) != 0)
    return std::string("Yama ptrace_scope 1 and PR_SET_PTRACER failed: ") + std::strerror(errno);
  return "Yama ptrace_scope 1: allowed same-user readers (PR_SET_PTRACER_ANY)";
}

}  // namespace arlo::weight_sync::detail
