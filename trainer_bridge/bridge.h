#pragma once
// The channel between the orchestrator and a trainer: batches go to the trainer, acknowledgements,
// "version v published" notices and heartbeats come back. Two transports share one contract.
//
// Usage, trainer side (blocking; arlo-trainer, the C ABI and the Python module sit on this):
//   arlo::bridge::ClientOptions o;  o.transport = "dir";  o.run_dir = run_dir;  o.rank = 0;
//   o.start_after_step = last_step_in_my_checkpoint;      // exactly-once across trainer restarts
//   ARLO_ASSIGN_OR_RETURN(auto client, arlo::bridge::connect(o));
//   client->published(0);                                  // after publishing v0 through weight_sync
//   for (;;) {
//     ARLO_ASSIGN_OR_RETURN(auto batch, client->next_batch(std::chrono::seconds(60)));  // BatchView
//     train(batch); save_checkpoint_if_due();
//     ARLO_TRY(client->ack(batch.step()));
//     publish weights as version batch.step() through weight_sync, then client->published(step);
//   }
//
// Usage, orchestrator side (one Asio event loop; every callback runs on that loop):
//   ARLO_ASSIGN_OR_RETURN(auto server, arlo::bridge::BridgeServer::create(io, server_options));
//   server->on_version([&](arlo::bridge::VersionEvent v) { watcher.notify(v.version); });
//   server->on_heartbeat([&](arlo::bridge::HeartbeatEvent h) { ... });
//   ARLO_TRY(server->start());
//   Status s = co_await server->send(std::move(step_batch));  // waits while max_pending_batches
//                                                             // steps are unacknowledged
//
// Delivery contract (both transports):
// - Steps are delivered to each rank in increasing order; a rank sees each step until it acks it.
// - A batch a trainer received but did not ack (it crashed) is delivered again after it restarts.
//   A trainer that resumes from a checkpoint passes start_after_step so that steps it already
//   applied are acknowledged without being delivered (trained once).
// - The orchestrator never has more than max_pending_batches steps sent and not acknowledged by
//   every rank. A step counts as acknowledged when all num_ranks ranks acked it.
// - Versions are reported to on_version once each, in increasing order (a lower or repeated
//   version is ignored), also after either side restarts (the latest known version is reported
//   again after an orchestrator restart).
//
// `dir` transport layout under <run_dir>/rollouts/ (all files written to a temporary name and
// renamed into place; both sides wait with inotify):
//   step_<s>/rank_<r>.safetensors   the batch (batch.h); the step directory appears whole, by rename
//   acks/step_<s>.rank_<r>          trainer rank r acknowledged step s (then it removes its batch
//                                   file; the orchestrator removes the step directory and the ack
//                                   files once all ranks acked)
//   versions/v<version>.json        trainer published version v: {"version": v, ...info}
//   heartbeats/rank_<r>.json        trainer heartbeat: {"rank", "time_ms", "last_acked_step"}
//
// `socket` transport: the orchestrator listens on TCP; each trainer rank connects, says hello with
// its rank and last acknowledged step, and the orchestrator (re)sends every unacknowledged step
// from there. Frames are [u8 type][u64 little-endian length][payload]; batches carry the encoded
// safetensors image; heartbeats flow both ways and a silent peer is dropped after
// heartbeat_timeout, after which the trainer side reconnects with backoff. The orchestrator opens
// every connection with CHALLENGE {nonce}; the trainer's HELLO carries proof = HMAC-SHA256 of the
// nonce keyed with the token (common/auth.h). With a token set, a missing or wrong proof gets ERROR
// and the connection closes; frames before a valid HELLO are limited to 64 KiB. A server bound to a
// non-loopback address refuses to start without a token.
// Host names: the trainer resolves the orchestrator's host on every connection attempt and tries
// each address it resolves to in turn; a name that does not resolve (yet: cluster DNS entries
// appear late) is retried like a refused connection, and next_batch's timeout names it and where
// it came from (ClientOptions::host_source). The server resolves a bind name once, at start(),
// and listens on its first address; a bind name that does not resolve fails start().
#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "common/result.h"
#include "trainer_bridge/batch.h"

namespace arlo {
class Clock;  // common/async/clock.h
}  // namespace arlo

namespace arlo::bridge {

using Duration = std::chrono::steady_clock::duration;

// Trainer side.
struct ClientOptions {
  std::string transport = "dir";   // dir | socket
  std::filesystem::path run_dir;   // dir: the run directory (rollouts/ lives under it)
  std::string host = "127.0.0.1";  // socket: the orchestrator's IP address or host name
  std::uint16_t port = 0;          // socket
  // socket: where `host` came from, named in errors ("--bridge-host", a config key, ...).
  std::string host_source = "the bridge client's host";
  int rank = 0;
  std::int64_t start_after_step = 0;                      // steps <= this are acked unseen (trainer's checkpoint)
  Duration heartbeat_interval = std::chrono::seconds(1);  // socket: automatic heartbeats
  Duration heartbeat_timeout = std::chrono::seconds(10);  // socket: silent server is dropped
  Duration reconnect_backoff_max = std::chrono::seconds(1);
  std::size_t max_frame_bytes = 1ull << 30;  // socket: larger frames are refused
  std::string token;                         // socket: the run's token (empty: $ARLO_TOKEN / $ARLO_TOKEN_FILE)
  // socket: the time heartbeats, the heartbeat timeout and the reconnect backoff run on
  // (common/async/clock.h). The client calls it from its own connection thread only, and its timer
  // callbacks do nothing but post back to that thread, so they may fire on any thread: a clock a
  // test advances from its own thread must be safe to call from both (a bare FakeClock is not).
  // Not owned; it must outlive the client. Null: the real clock. next_batch's timeout and the
  // bounded flush in close() are waits on the peer's I/O and stay on real time.
  Clock* clock = nullptr;
};

// Blocking client for trainers. Thread-safe: any method may be called from any thread.
class BridgeClient {
 public:
  virtual ~BridgeClient() = default;
  // Waits up to `timeout` for the next unacknowledged step for this rank (kTimeout when none;
  // kCancelled after close()). Returns the same step again until it is acked. A batch that fails
  // validation is reported as kParse/kMismatch and left in place (dir) so an operator can look.
  virtual Result<BatchView> next_batch(Duration timeout) = 0;
  // Acknowledges `step` (and everything before it) for this rank.
  virtual Status ack(std::int64_t step) = 0;
  // Tells the orchestrator that version `version` is published; `info` rides along
  // (e.g. where the weights are). Never blocks on the peer (socket: queued until connected).
  virtual Status published(std::int64_t version, const nlohmann::json& info = nlohmann::json::object()) = 0;
  // Sends a heartbeat now (socket sends them automatically too).
  virtual Status heartbeat() = 0;
  virtual std::int64_t last_acked_step() const = 0;
  // Stops waiting calls (they return kCancelled) and releases the channel. Idempotent.
  virtual void close() = 0;
};

Result<std::unique_ptr<BridgeClient>> connect(const ClientOptions& options);

// Orchestrator side.
struct ServerOptions {
  std::string transport = "dir";   // dir | socket
  std::filesystem::path run_dir;   // dir
  std::string bind = "127.0.0.1";  // socket: an IP address or a host name (resolved at start())
  std::uint16_t port = 0;          // socket; 0 picks a free port (see port())
  int num_ranks = 1;
  std::size_t max_pending_batches = 2;  // steps sent and not yet acked by every rank
  Duration heartbeat_interval = std::chrono::seconds(1);
  Duration heartbeat_timeout = std::chrono::seconds(10);
  std::size_t max_frame_bytes = 64ull << 20;  // socket: frames from trainers are small
  std::string token;                          // socket: trainers must prove they hold it (empty: anyone)
  bool fsync = false;                         // dir: sync batch files (durable against power loss)
  // The time heartbeats, the heartbeat timeout (socket) and wait_all_acked's timeout run on
  // (common/async/clock.h): a FakeClock in tests, used on the server's io_context thread. Not
  // owned; it must outlive the server. Null: the real clock.
  Clock* clock = nullptr;
};

struct VersionEvent {
  std::int64_t version = 0;
  nlohmann::json info;  // what the trainer attached
};

struct HeartbeatEvent {
  int rank = 0;
  std::int64_t last_acked_step = 0;
  std::int64_t time_ms = 0;  // trainer's wall clock (ms since epoch)
};

// Lives on one io_context; create, configure and use it from that context's thread only.
class BridgeServer {
 public:
  static Result<std::unique_ptr<BridgeServer>> create(boost::asio::io_context& io, ServerOptions options);
  virtual ~BridgeServer() = default;

  // Register before start(); a second call replaces the callback.
  virtual void on_version(std::function<void(VersionEvent)> cb) = 0;
  virtual void on_heartbeat(std::function<void(HeartbeatEvent)> cb) = 0;
  virtual void on_ack(std::function<void(std::int64_t step)> cb) = 0;  // all ranks acked `step`

  // dir: creates the layout, picks up state left by a previous run (steps still pending, acks,
  // the latest version) and starts watching. socket: binds and starts accepting.
  virtual Status start() = 0;

  // Hands one step to the trainer. Waits while max_pending_batches steps are unacknowledged, then
  // writes (dir) or queues and streams (socket) it, and completes; it does not wait for the ack.
  // The encoding (and, for dir, the file writes) run on the loop thread: about 10-15 ms for a
  // 64k-token step (arlo-bench-bridge); pack() on a thread pool, send() on the loop.
  // A step at or below one already acknowledged completes at once (orchestrator restarted and
  // re-cut it). The batch must have num_ranks rank parts. kCancelled after stop().
  virtual boost::asio::awaitable<Status> send(StepBatch batch) = 0;

  // Completes when every sent step is acknowledged, or kTimeout after `timeout`.
  virtual boost::asio::awaitable<Status> wait_all_acked(Duration timeout) = 0;

  virtual std::size_t pending() const = 0;  // steps sent and not acked
  virtual std::int64_t last_acked_step() const = 0;
  virtual std::int64_t latest_version() const = 0;  // -1 before the first
  virtual std::uint16_t port() const = 0;           // socket: bound port; dir: 0
  // Stops watching/accepting, cancels waiting sends. Idempotent.
  virtual void stop() = 0;
};

namespace dir_layout {
std::filesystem::path rollouts(const std::filesystem::path& run_dir);
std::filesystem::path step_dir(const std::filesystem::path& run_dir, std::int64_t step);
std::filesystem::path batch_file(const std::filesystem::path& run_dir, std::int64_t step, int rank);
std::filesystem::path ack_file(const std::filesystem::path& run_dir, std::int64_t step, int rank);
std::filesystem::path version_file(const std::filesystem::path& run_dir, std::int64_t version);
std::filesystem::path heartbeat_file(const std::filesystem::path& run_dir, int rank);
}  // namespace dir_layout

}  // namespace arlo::bridge
