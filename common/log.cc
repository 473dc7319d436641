#include "common/log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <vector>

namespace arlo::log {

Result<spdlog::level::level_enum> parse_level(std::string_view level) {
  static constexpr std::pair<std::string_view, spdlog::level::level_enum> kLevels[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug}, {"info", spdlog::level::info},
      {"warn", spdlog::level::warn},   {"error", spdlog::level::err},   {"off", spdlog::level::off}};
  for (const auto& [name, value] : kLevels) {
    if (name == level) return value;
  }
  return make_error(ErrorCode::kInvalidArgument,
                    "unknown log level '" + std::string(level) + "'; use one of trace, debug, info, warn, error, off");
}

Status init(const Options& options) {
  ARLO_ASSIGN_OR_RETURN(auto level, parse_level(options.level));
  std::vector<spdlog::sink_ptr> sinks;
  sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  if (options.file) {
    try {
      sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(*options.file));
    } catch (const spdlog::spdlog_ex& e) {
      return make_error(ErrorCode::kIo, "cannot open log file '" + *options.file + "': " + e.what());
    }
  }
  auto logger = std::make_shared<spdlog::logger>(options.name, sinks.begin(), sinks.end());
  logger->set_level(level);
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%L%$ [%n] %v");
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
  return ok();
}

bool RateLimiter::allow(long long& suppressed) {
  const long long now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  long long next = next_ns_.load(std::memory_order_relaxed);
  if (now >= next && next_ns_.compare_exchange_strong(next, now + period_ns_)) {
    suppressed = suppressed_.exchange(0);
    return true;
  }
  suppressed_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

}  // namespace arlo::log
