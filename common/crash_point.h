#pragma once
// Crash points for the fault tests: with ARLO_CRASH_AT=<point>:<step> in its environment, a process
// that reaches crash_point(<point>, <step>) kills itself with SIGKILL, exactly as `kill -9` at that
// instant would (no handler, no flush, no clean-up), so a test can hit a crash window, e.g. between
// a batch and its checkpoint, every time instead of by luck. Unset (always, outside such tests):
// one getenv at the first call, then nothing. With ARLO_CRASH_ONCE=<file> as well, the point fires
// only while <file> does not exist (it is created first), so a restarted process gets past it.
//
// Points: orchestrator.before_checkpoint / orchestrator.after_checkpoint (the journal and checkpoint
// of a cut, before the batch leaves), trainer.before_checkpoint / trainer.after_checkpoint (the
// trainer's checkpoint of a trained step, before its ack). docs/checkpoints.md has the windows.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace arlo {

inline void crash_point(std::string_view point, std::int64_t step) {
  static const std::string spec = [] {
    const char* e = std::getenv("ARLO_CRASH_AT");
    return e ? std::string(e) : std::string();
  }();
  if (spec.empty()) return;
  const std::string here = std::string(point) + ":" + std::to_string(step);
  if (spec != here) return;
  if (const char* once = std::getenv("ARLO_CRASH_ONCE"); once != nullptr && *once != '\0') {
    const int fd = ::open(once, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) return;  // fired before
    ::close(fd);
  }
  std::fprintf(stderr, "crash point %s: SIGKILL (ARLO_CRASH_AT)\n", here.c_str());
  std::fflush(stderr);
  ::kill(::getpid(), SIGKILL);
}

}  // namespace arlo
