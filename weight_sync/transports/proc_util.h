#pragma once
// Small POSIX helpers shared by the same-host transports.
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>

namespace arlo::weight_sync::detail {

// True while `pid` names a live process (a zombie counts as dead).
bool process_alive(pid_t pid);

// Futex on a 32-bit word in shared memory (not FUTEX_PRIVATE): wait while *word == seen, at most
// `timeout`; wake all waiters after bumping the word.
void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t seen, std::chrono::microseconds timeout);
void futex_bump_and_wake(std::atomic<std::uint32_t>& word);

}  // namespace arlo::weight_sync::detail
