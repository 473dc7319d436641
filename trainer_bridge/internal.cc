#include "trainer_bridge/internal.h"

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <charconv>
#include <cstring>
#include <fstream>

namespace arlo::bridge::internal {

Result<std::string> read_small_file(const std::filesystem::path& path, std::size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::kNotFound, fmt::format("cannot open {}", path.string()));
  std::string out;
  char buf[4096];
  while (in) {
    in.read(buf, sizeof buf);
    out.append(buf, static_cast<std::size_t>(in.gcount()));
    if (out.size() > max_bytes) {
      return make_error(ErrorCode::kResourceExhausted,
                        fmt::format("{} is larger than {} bytes", path.string(), max_bytes));
    }
  }
  return out;
}

std::optional<std::int64_t> parse_numbered(std::string_view name, std::string_view prefix, std::string_view suffix) {
  if (name.size() <= prefix.size() + suffix.size() || !name.starts_with(prefix) || !name.ends_with(suffix)) {
    return std::nullopt;
  }
  const std::string_view digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  std::int64_t value = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec != std::errc() || ptr != digits.data() + digits.size() || value < 0) return std::nullopt;
  return value;
}

std::optional<std::pair<std::int64_t, int>> parse_ack_name(std::string_view name) {
  const auto dot = name.find(".rank_");
  if (dot == std::string_view::npos) return std::nullopt;
  const auto step = parse_numbered(name.substr(0, dot), "step_", "");
  if (!step) return std::nullopt;
  const std::string_view tail = name.substr(dot + 6);
  int rank = 0;
  auto [p, ec] = std::from_chars(tail.data(), tail.data() + tail.size(), rank);
  if (tail.empty() || ec != std::errc() || p != tail.data() + tail.size() || rank < 0) return std::nullopt;
  return std::make_pair(*step, rank);
}

std::int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Clock* pick_clock(Clock* given, boost::asio::any_io_executor ex, std::unique_ptr<Clock>& own) {
  if (given) return given;
  own = std::make_unique<RealClock>(std::move(ex));
  return own.get();
}

boost::asio::awaitable<void> Signal::wait() {
  auto executor = co_await boost::asio::this_coro::executor;
  boost::asio::steady_timer timer(executor, boost::asio::steady_timer::time_point::max());
  waiters_.insert(&timer);
  boost::system::error_code ec;
  co_await timer.async_wait(boost::asio::redirect_error(boost::asio::use_awaitable, ec));
  waiters_.erase(&timer);
}

// The wait itself is an asio timer that never expires: notify_all() or the clock's timer at the
// deadline cancels it. A notify that lands in the same turn as the deadline reads as the deadline;
// callers check their condition again either way.
boost::asio::awaitable<bool> Signal::wait(Clock& clock, Clock::time_point deadline) {
  auto executor = co_await boost::asio::this_coro::executor;
  boost::asio::steady_timer timer(executor, boost::asio::steady_timer::time_point::max());
  waiters_.insert(&timer);
  bool due = false;
  auto at_deadline = clock.schedule(deadline, [&] {
    due = true;
    timer.cancel();
  });
  boost::system::error_code ec;
  co_await timer.async_wait(boost::asio::redirect_error(boost::asio::use_awaitable, ec));
  waiters_.erase(&timer);
  co_return !due;
}

void Signal::notify_all() {
  for (auto* timer : waiters_) timer->cancel();
}

}  // namespace arlo::bridge::internal
