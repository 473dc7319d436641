#pragma once
// The serving side of the tcp transport's links (the publisher, or a relay's downstream): it
// listens, gathers the receivers of a version (handshake and token check), offers the manifest,
// streams the buckets on every link and takes back the ones that reconnect to resume. tcp.cc
// describes the protocol.
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "weight_sync/manifest.h"
#include "weight_sync/transport.h"
#include "weight_sync/transports/tcp/conn.h"
#include "weight_sync/transports/tcp/feed.h"

namespace arlo::weight_sync::detail {

// The serving side of links: the publisher, or a relay's downstream. Keeps its listening socket
// across versions; connections that arrive between versions wait (kernel backlog, or `pending_`).
class Server {
 public:
  // Listens on `address`; the endpoint it names is `advertise_host` with the bound port when that is
  // set (a publisher bound to every interface announces where receivers reach it), else the bound
  // address.
  static Result<std::unique_ptr<Server>> listen(const std::string& address, const std::string& advertise_host,
                                                std::chrono::milliseconds reconnect_window,
                                                std::shared_ptr<BucketTap> tap);
  const std::string& endpoint() const { return endpoint_; }

  // How much longer than the others a receiver may take over a handshake or its answer to a
  // manifest before it is cut off (a live one takes milliseconds; a dark link never answers).
  static constexpr std::chrono::milliseconds kStragglerGrace{1000};

  struct Peer {
    std::unique_ptr<Conn> conn;
    Hello hello;
    Answer answer;
    std::string error;  // set when the link failed for good
    std::uint64_t wire_bytes = 0;
    nlohmann::json done;  // DONE body
    // Reconnection hand-over (acceptor thread -> serving thread).
    std::mutex mu;
    std::condition_variable cv;
    std::unique_ptr<Conn> replacement;
    std::size_t replacement_start = 0;
    bool waiting = false;
  };

  // Gathers the peers of one transfer: waits until `deadline` for the first one, then at most
  // `window` for the others (until `expected` came). A receiver that does not come holds nobody: it
  // connects later and is served by a later transfer. A peer that already holds `version` (or a newer
  // one) is not served it; it waits for a later version. Handshakes run side by side (SideBySide), so a
  // receiver that connected and then went dark holds no other's. Returns the number gathered.
  std::size_t gather(std::size_t expected, std::optional<Version> version, Deadline deadline,
                     std::chrono::milliseconds hello_timeout, std::chrono::milliseconds window);

  std::vector<std::unique_ptr<Peer>>& peers() { return peers_; }

  // Sends the manifest to every live peer and reads each answer, all links at once. Once one peer
  // answered, the others get as long again plus kStragglerGrace: one that has not answered by then
  // (a dark link) is cut off, so it holds nobody's buckets; it is served a later version.
  void offer(const Manifest& m, Deadline deadline);

  // Streams buckets to every accepted peer (one thread each) and collects their DONE reports.
  // `regen(i, scratch)` re-creates a bucket that left the feed's window (resume).
  using Regen = std::function<Result<Parts>(std::size_t, std::unique_ptr<std::byte[]>&)>;
  void stream(const Manifest& m, Feed& feed, const Regen& regen, const Options& o, Deadline deadline);

  // Drops every link of the finished version.
  void reset();

 private:
  Server() : acc_(acc_ctx_) {}

  // CHALLENGE, then the receiver's HELLO, checked against the token; a refused receiver is told
  // why (REFUSED) and closed.
  Result<Hello> handshake(Conn& c, Deadline deadline);

  Result<std::unique_ptr<Conn>> accept(Deadline deadline);

  void serve(int k, const Manifest& m, Feed& feed, const Regen& regen, const Options& o, Deadline deadline);

  void accept_resumes(const Manifest& m, const Options& o, std::atomic<bool>& stop);

  // Whether the other end closed `c` (a waiting receiver that gave up); never blocks.
  static bool closed(Conn& c);
  void keep_pending(std::unique_ptr<Peer> p);

  asio::io_context acc_ctx_;
  tcp::acceptor acc_;
  std::string endpoint_;
  std::string token_;  // receivers must prove they hold it (empty: anyone)
  std::chrono::milliseconds reconnect_window_{5000};
  std::shared_ptr<BucketTap> tap_;  // shown each bucket this side serves (transport.h); usually null
  std::vector<std::unique_ptr<Peer>> peers_;
  std::vector<std::unique_ptr<Peer>> pending_;
};

// The reports of a finished version's peers (and, through their DONE, of everything downstream
// of them).
void collect_reports(Server& server, const Manifest& m, std::vector<PeerReport>& out);

}  // namespace arlo::weight_sync::detail
