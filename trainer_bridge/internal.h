#pragma once
// Small pieces the bridge transports share. Internal to trainer_bridge.
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "common/async/clock.h"
#include "common/result.h"

namespace arlo::bridge::internal {

Result<std::string> read_small_file(const std::filesystem::path& path, std::size_t max_bytes = 1 << 20);

// "step_12" -> 12; "v3.json" -> 3 (with prefix "v", suffix ".json"); nullopt when the name does
// not have exactly that form (temporary files included).
std::optional<std::int64_t> parse_numbered(std::string_view name, std::string_view prefix, std::string_view suffix);
// "step_12.rank_3" -> {12, 3}
std::optional<std::pair<std::int64_t, int>> parse_ack_name(std::string_view name);

std::int64_t wall_ms();

// The clock a transport runs on: `given`, or a real one on `ex` created into `own`.
Clock* pick_clock(Clock* given, boost::asio::any_io_executor ex, std::unique_ptr<Clock>& own);

// Wakes every coroutine waiting on it. Single-threaded: use from the owning io_context only.
class Signal {
 public:
  // Completes on notify_all(); waits without a deadline.
  boost::asio::awaitable<void> wait();
  // Completes on notify_all() or at `deadline` on `clock`, whichever comes first; returns false on
  // deadline.
  boost::asio::awaitable<bool> wait(Clock& clock, Clock::time_point deadline);
  void notify_all();

 private:
  std::set<boost::asio::steady_timer*> waiters_;
};

}  // namespace arlo::bridge::internal
