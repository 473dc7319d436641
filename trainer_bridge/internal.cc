#include "trainer_bridge/internal.h"

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

ServerCore::ServerCore(boost::asio::io_context& io, ServerOptions o, std::string_view name)
    : io(io),
      opt(std::move(o)),
      name(name),
      clock(pick_clock(opt.clock, io.get_executor(), own_clock)),
      changed(io.get_executor()) {}

boost::asio::awaitable<Result<bool>> admit(ServerCore& st, const StepBatch& batch) {
  if (!st.started) co_return make_error(ErrorCode::kInvalidArgument, fmt::format("{}: send() before start()", st.name));
  if (static_cast<int>(batch.ranks.size()) != st.opt.num_ranks) {
    co_return make_error(ErrorCode::kInvalidArgument,
                         fmt::format("{}: step {} has {} rank parts, num_ranks is {}", st.name, batch.step,
                                     batch.ranks.size(), st.opt.num_ranks));
  }
  while (!st.stopped && st.pending.size() >= st.opt.max_pending_batches && batch.step > st.last_acked) {
    co_await st.changed.wait();
  }
  if (st.stopped) co_return make_error(ErrorCode::kCancelled, fmt::format("{}: stopped", st.name));
  co_return batch.step > st.last_acked && !st.pending.contains(batch.step);
}

boost::asio::awaitable<Status> wait_until_all_acked(std::shared_ptr<ServerCore> st, Duration timeout) {
  const auto deadline = st->clock->now() + timeout;
  while (!st->pending.empty() && !st->stopped) {
    if (!co_await st->changed.wait_until(*st->clock, deadline) && !st->pending.empty()) {
      co_return make_error(ErrorCode::kTimeout, fmt::format("{}: {} step(s) still unacknowledged (oldest {})", st->name,
                                                            st->pending.size(), st->pending.begin()->first));
    }
  }
  if (!st->pending.empty()) co_return make_error(ErrorCode::kCancelled, fmt::format("{}: stopped", st->name));
  co_return ok();
}

}  // namespace arlo::bridge::internal
