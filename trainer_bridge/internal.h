#pragma once
// Small pieces the bridge transports share. Internal to trainer_bridge.
#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/async/clock.h"
#include "common/async/coro.h"
#include "common/result.h"
#include "trainer_bridge/bridge.h"

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

// The orchestrator side's state that both transports keep: the steps sent and not yet acked by
// every rank, each rank's acks, the latest version, the callbacks. A transport's state derives from
// it and lives in a shared_ptr that the transport's coroutines hold (a send() outlives stop()).
// Used on the io_context's thread only.
struct ServerCore {
  // `name` starts every message ("bridge dir", "bridge socket"); a string literal.
  ServerCore(boost::asio::io_context& io, ServerOptions o, std::string_view name);

  boost::asio::io_context& io;
  ServerOptions opt;
  const std::string_view name;
  std::unique_ptr<Clock> own_clock;  // the real clock, when opt.clock is null
  Clock* clock;                      // wait_all_acked's timeout (socket: heartbeats too)
  // Steps sent and not acked by every rank -> each rank's encoded batch. The socket transport
  // resends these on a reconnect; the dir transport's batches are files, so it keeps none (empty).
  std::map<std::int64_t, std::vector<std::shared_ptr<const std::string>>> pending;
  std::vector<std::int64_t> rank_acked;  // per rank: highest step acked (cumulative)
  std::int64_t last_acked = 0;
  std::int64_t latest_version = -1;
  bool started = false, stopped = false;
  Signal changed;  // pending, last_acked or stopped changed

  std::function<void(VersionEvent)> version_cb;
  std::function<void(HeartbeatEvent)> heartbeat_cb;
  std::function<void(std::int64_t)> ack_cb;
};

// send()'s first half, the same on both transports: refuses a send before start() and a batch
// without num_ranks rank parts, waits while max_pending_batches steps are unacknowledged
// (kCancelled once stopped), then says whether the transport still has to deliver `batch`: false
// when its step is acked or pending already (a restarted orchestrator re-cuts steps). The caller
// keeps `st` alive.
boost::asio::awaitable<Result<bool>> admit(ServerCore& st, const StepBatch& batch);
// BridgeServer::wait_all_acked on `st`.
boost::asio::awaitable<Status> wait_until_all_acked(std::shared_ptr<ServerCore> st, Duration timeout);

// The BridgeServer of both transports. What differs lives in `State`, which derives from
// ServerCore and has
//   static Status start(const std::shared_ptr<State>& self): start() once (binds or watches, starts
//     the transport's coroutines, which hold `self`);
//   Status deliver(const StepBatch&): send()'s second half, for an admitted batch: writes it (dir)
//     or queues and streams it (socket), and adds its step to `pending`;
//   std::uint16_t port() const;
//   void close_io(): stop() closes the transport's descriptors or sockets.
template <typename State>
class Server final : public BridgeServer {
 public:
  Server(boost::asio::io_context& io, ServerOptions options)
      : state_(std::make_shared<State>(io, std::move(options))) {}
  ~Server() override { stop(); }

  Status start() override {
    if (state_->started) {
      return make_error(ErrorCode::kInvalidArgument, fmt::format("{}: start() called twice", state_->name));
    }
    return State::start(state_);
  }

  boost::asio::awaitable<Status> send(StepBatch batch) override {
    auto st = state_;  // a send() may outlive the server object
    auto admitted = co_await admit(*st, batch);
    if (!admitted) co_return std::unexpected(std::move(admitted.error()));
    if (!*admitted) co_return ok();
    co_return st->deliver(batch);
  }

  void on_version(std::function<void(VersionEvent)> cb) override { state_->version_cb = std::move(cb); }
  void on_heartbeat(std::function<void(HeartbeatEvent)> cb) override { state_->heartbeat_cb = std::move(cb); }
  void on_ack(std::function<void(std::int64_t)> cb) override { state_->ack_cb = std::move(cb); }
  boost::asio::awaitable<Status> wait_all_acked(Duration timeout) override {
    return wait_until_all_acked(state_, timeout);
  }
  std::size_t pending() const override { return state_->pending.size(); }
  std::int64_t last_acked_step() const override { return state_->last_acked; }
  std::int64_t latest_version() const override { return state_->latest_version; }
  std::uint16_t port() const override { return state_->port(); }
  void stop() override {
    if (state_->stopped) return;
    state_->stopped = true;
    state_->close_io();
    state_->changed.notify();
  }

 private:
  // Shared with the transport's coroutines: a send() may outlive the server object.
  std::shared_ptr<State> state_;
};

}  // namespace arlo::bridge::internal
