#pragma once
// Project logging over spdlog. Use the macros, never spdlog directly, so the sink setup, the format
// and the rate limiting stay in one place.
//
//   ARLO_INFO("worker {} healthy at version {}", url, v);
//   ARLO_WARN_EVERY(5.0, "circuit open for {}", url);   // at most once per 5 s per call site
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <string>

#include "common/result.h"

namespace arlo::log {

struct Options {
  std::string level = "info";       // trace | debug | info | warn | error | off
  std::optional<std::string> file;  // also append to this file when set
  std::string name = "arlo";        // shown in every line: "[arlo]", "[worker-0]"
};

// Configures the default logger. Safe to call again (replaces sinks). Returns an error for an
// unknown level or a log file that cannot be opened.
Status init(const Options& options);

// Parses "info" etc. into an spdlog level.
Result<spdlog::level::level_enum> parse_level(std::string_view level);

// One per call site: lets a message through at most once per `period_seconds`; counts what it
// suppressed so the next line that passes can say "(N suppressed)".
class RateLimiter {
 public:
  explicit RateLimiter(double period_seconds) : period_ns_(static_cast<long long>(period_seconds * 1e9)) {}
  // Returns true when the caller should log; `suppressed` receives the number skipped since.
  bool allow(long long& suppressed);

 private:
  long long period_ns_;
  std::atomic<long long> next_ns_{0};
  std::atomic<long long> suppressed_{0};
};

}  // namespace arlo::log

#define ARLO_TRACE(...) SPDLOG_TRACE(__VA_ARGS__)
#define ARLO_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define ARLO_INFO(...) ::spdlog::info(__VA_ARGS__)
#define ARLO_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define ARLO_ERROR(...) ::spdlog::error(__VA_ARGS__)

#define ARLO_LOG_EVERY_(lvl, period, ...)                                                             \
  do {                                                                                                \
    static ::arlo::log::RateLimiter arlo_rl_(period);                                                 \
    long long arlo_suppressed_ = 0;                                                                   \
    if (arlo_rl_.allow(arlo_suppressed_)) {                                                           \
      if (arlo_suppressed_ > 0)                                                                       \
        ::spdlog::log(lvl, "{} ({} similar suppressed)", fmt::format(__VA_ARGS__), arlo_suppressed_); \
      else                                                                                            \
        ::spdlog::log(lvl, __VA_ARGS__);                                                              \
    }                                                                                                 \
  } while (0)
#define ARLO_INFO_EVERY(period, ...) ARLO_LOG_EVERY_(::spdlog::level::info, period, __VA_ARGS__)
#define ARLO_WARN_EVERY(period, ...) ARLO_LOG_EVERY_(::spdlog::level::warn, period, __VA_ARGS__)
#define ARLO_ERROR_EVERY(period, ...) ARLO_LOG_EVERY_(::spdlog::level::err, period, __VA_ARGS__)
