#pragma once
// Small POSIX helpers shared by the same-host transports.
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>

namespace arlo::weight_sync::detail {

// True while `pid` names a live process (a zombie counts as dead).
bool process_alive(pid_t pid);

// Futex on a 32-bit word in shared memory (not FUTEX_PRIVATE): wait while *word == seen, at most
// `timeout`; wake all waiters after bumping the word.
void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t seen, std::chrono::microseconds timeout);
void futex_bump_and_wake(std::atomic<std::uint32_t>& word);

// Cross-memory attach: copies `local.size()` bytes from address `remote` of process `pid` into
// `local` with process_vm_readv (one kernel copy, no intermediate buffer). Returns 0 on success or
// the errno (EPERM: not permitted by ptrace access rules / Yama; ESRCH: process gone; EFAULT: the
// range is not mapped there). A short read is reported as EFAULT.
int read_remote(pid_t pid, std::span<std::byte> local, std::uint64_t remote);

// Makes this process readable by any same-user process with read_remote() when the Yama LSM
// restricts ptrace to descendants (ptrace_scope = 1), by naming any process as allowed tracer
// (PR_SET_PTRACER_ANY). Returns a line saying what was done (for the log). Idempotent.
std::string allow_same_user_readers();

}  // namespace arlo::weight_sync::detail
