// tcp transport (Boost.Asio). Star: the publisher serves every receiver directly. Chain: each
// relaying receiver (Options::relay, at `relay_listen`) serves the next one, so each link carries the stream once.
//
// Every link opens with sender -> CHALLENGE {nonce}; the receiver's HELLO carries proof =
// auth::proof(token, "arlo-weights/1", nonce) when it has a token (common/auth.h: $ARLO_TOKEN or
// $ARLO_TOKEN_FILE). A serving side with a token answers a missing or wrong proof with REFUSED
// {error} and closes, so weights go only to receivers that hold the run's token; one bound to a
// non-loopback address refuses to listen without a token. Handshake frames are at most 64 KiB.
//
// Per version, on each link: receiver -> HELLO {peer, version, resume, proof?}; sender -> MANIFEST;
// receiver -> ANSWER {accepted | refused | need_full, start}; sender -> BUCKET frames (header, data,
// trailer xxh3) from `start`; receiver -> DONE {peers: reports of itself and everything downstream}.
// Relays check their own sink, then offer the manifest downstream before answering, so a refusal or
// a need for a full resync anywhere is known before data moves.
//
// Who is served: publish(v, deadline) waits until `deadline` for the first receiver, then at most
// min(bucket_timeout, Options::gather_window) for the other expected ones, and streams to those that came; one that
// never comes holds nobody (it is served by a later publish). Once receivers came the transfer runs
// under Options::timeout even if `deadline` is nearer, so a caller may poll for receivers with short
// deadlines (the StagingPublisher does). A receiver that already holds v is not sent v again.
//
// Every operation runs under a deadline (bucket_timeout per bucket, the call deadline overall). A
// receiver that loses its link or sees a checksum mismatch reconnects and resumes from its first
// unverified bucket; the sending side waits reconnect_window for it. Data moves in 4 MiB send and
// receive calls (fewer syscalls; a chunk still sits in the shared cache when it is hashed), a
// cut-through relay's in 1 MiB steps (each hop delays the stream by one step). Each bucket is hashed
// once on the publisher, by the first link that sends it, and reused for every other link; a relay
// forwards the checksum it verified instead of hashing again. Receivers hash what they receive.
// `full` is sent straight from the source tensors and, in place, received straight into the sink's
// buffers.
//
// This file is the protocol: the serving side (Server: handshake, gather, offer, per-link
// streaming and resumption), the publisher (TcpSender), the receiver and relay (TcpReceiver), and
// the registration. Links and frames are in tcp_conn.h; the buffering window between a version's
// producer and its downstream links, with the shared checksum cache, is tcp_feed.h (Feed).
#include <boost/asio/ip/tcp.hpp>

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <list>
#include <optional>
#include <mutex>
#include <thread>

#include "weight_sync/xxh.h"

#include "common/auth.h"
#include "common/log.h"
#include "weight_sync/codec.h"
#include "weight_sync/transport.h"
#include "weight_sync/transports/tcp_conn.h"
#include "weight_sync/transports/tcp_feed.h"

namespace arlo::weight_sync {
namespace {

using detail::Answer;
using detail::Conn;
using detail::Feed;
using detail::Frame;
using detail::FrameHeader;
using detail::Hello;
using detail::Parts;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

constexpr std::size_t kChunk = 4u << 20;      // per send() call
constexpr std::size_t kRecvChunk = 4u << 20;  // per recv() call (hashed from L3 right after);
                                              // 1 MiB and 256 KiB calls cost the receiver more CPU
// A cut-through relay passes bytes on in these steps: every hop of a chain delays the stream by one
// step's time on its link (4 MiB at 2 Gbit/s: 17 ms a hop).
constexpr std::size_t kCutChunk = 1u << 20;

constexpr std::string_view kAuthContext = "arlo-weights/1";

std::string vb(Version v, std::size_t i) { return "version " + std::to_string(v) + ", bucket " + std::to_string(i); }

// Sends bucket i: header, data, trailer checksum. The checksum comes from the feed when known;
// otherwise the first link to send the bucket computes it chunk by chunk while sending (each chunk
// hashed while hot in cache) and posts it for the other links, even when its own link fails
// midway; another link hashes the bucket itself rather than wait long for a stalled first one. `corrupt` flips one
// byte on the wire (fault injection) after the checksum saw the true byte.
Status send_bucket(Conn& c, std::size_t i, const Parts& parts, Deadline deadline, bool corrupt, Feed& feed) {
  FrameHeader h;
  h.type = static_cast<std::uint32_t>(Frame::kBucket);
  h.a = i;
  for (const auto& p : parts) h.b += p.size();
  const std::optional<std::uint64_t> known = feed.sum(i);
  const bool hashing = !known && feed.claim_sum(i);
  const bool cut_through = feed.cut_through();
  std::uint64_t sent = 0;
  const auto started = Clock::now();
  Status s = c.write({asio::buffer(&h, sizeof h)}, deadline);
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  std::vector<std::byte> tmp;
  for (const auto& p : parts) {
    if (!s && !hashing) break;
    const std::size_t chunk = cut_through ? kCutChunk : kChunk;
    for (std::size_t off = 0; off < p.size(); off += chunk) {
      const std::size_t n = std::min(chunk, p.size() - off);
      const std::byte* data = p.data() + off;
      if (hashing) XXH3_64bits_update(&st, data, n);
      if (!s) {
        if (!hashing) break;
        continue;  // finish the checksum for the other links
      }
      if (cut_through) s = feed.wait_avail(i, sent + n, deadline);
      if (!s) break;
      if (corrupt) {
        tmp.assign(data, data + n);
        tmp[n / 2] ^= std::byte{0x5A};
        data = tmp.data();
        corrupt = false;
      }
      s = c.write({asio::buffer(data, n)}, deadline);
      sent += n;
    }
  }
  if (hashing) feed.set_sum(i, XXH3_64bits_digest(&st));
  ARLO_TRY(s);
  std::uint64_t sum = 0;
  if (known) {
    sum = *known;
  } else if (hashing || cut_through) {
    ARLO_ASSIGN_OR_RETURN(sum, feed.wait_sum(i, deadline));  // ours, or the one upstream verified
  } else {
    // The link hashing this bucket is another receiver's, and that one may be stalled (its host
    // unreachable: a write that never completes). Waiting for it would stall this link too, so
    // wait at most as long as this link took to send the bucket, then hash it here.
    const auto grace = std::max<Clock::duration>(Clock::now() - started, std::chrono::milliseconds(20));
    auto theirs = feed.wait_sum(i, std::min(deadline, Clock::now() + grace));
    if (theirs) {
      sum = *theirs;
    } else {
      XXH3_64bits_reset(&st);
      for (const auto& p : parts) XXH3_64bits_update(&st, p.data(), p.size());
      sum = XXH3_64bits_digest(&st);
    }
  }
  return c.write({asio::buffer(&sum, sizeof sum)}, deadline);
}

struct Received {
  std::uint64_t bytes = 0;     // wire size
  std::uint64_t checksum = 0;  // verified xxh3 of those bytes
};

// Receives bucket i into `dst` spans (their total must equal the frame's size, or, when `buffer`
// is given, into it). Returns the wire size and checksum; kMismatch on a checksum mismatch.
// `cut` (relays, cut-through) is told how many bytes of the bucket arrived after every chunk.
Result<Received> recv_bucket(Conn& c, std::size_t i, const std::vector<std::span<std::byte>>& dst,
                             std::span<std::byte> buffer, Deadline deadline, Feed* cut = nullptr) {
  ARLO_ASSIGN_OR_RETURN(auto h, c.recv_frame(nullptr, deadline));
  if (static_cast<Frame>(h.type) != Frame::kBucket || h.a != i)
    return make_error(ErrorCode::kParse, "expected bucket " + std::to_string(i) + ", got frame type " +
                                             std::to_string(h.type) + " index " + std::to_string(h.a));
  std::vector<std::span<std::byte>> targets = dst;
  if (targets.empty()) {
    if (h.b > buffer.size())
      return make_error(ErrorCode::kParse, "bucket " + std::to_string(i) + " larger than the manifest allows");
    targets.push_back(buffer.subspan(0, h.b));
  } else {
    std::uint64_t total = 0;
    for (const auto& t : targets) total += t.size();
    if (total != h.b) return make_error(ErrorCode::kParse, "bucket " + std::to_string(i) + " has the wrong size");
  }
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  std::uint64_t arrived = 0;
  if (cut) cut->set_avail(i, 0);
  const std::size_t chunk = cut ? kCutChunk : kRecvChunk;
  for (const auto& t : targets) {
    for (std::size_t off = 0; off < t.size(); off += chunk) {
      const std::size_t n = std::min(chunk, t.size() - off);
      ARLO_TRY(c.read(asio::buffer(t.data() + off, n), deadline));
      XXH3_64bits_update(&st, t.data() + off, n);
      arrived += n;
      if (cut) cut->set_avail(i, arrived);
    }
  }
  std::uint64_t sum = 0;
  ARLO_TRY(c.read(asio::buffer(&sum, sizeof sum), deadline));
  if (sum != XXH3_64bits_digest(&st))
    return make_error(ErrorCode::kMismatch,
                      "bucket " + std::to_string(i) + ": checksum mismatch (corrupted in transit)");
  return Received{h.b, sum};
}

// Blocking exchanges on several links at once (handshakes, a manifest and its answer), one thread
// each, so a dark link holds no other. A call still running when the caller gives up on it is cut
// off: its socket is shut down, so its blocked read returns, and the call is marked cut.
template <typename T>
class SideBySide {
 public:
  struct Call {
    T value;  // what the exchange returned (after a cut: its failure)
    bool cut = false;
  };
  ~SideBySide() { cut_off(); }
  // Runs `exchange` on a thread of its own; `conn`, the link it talks on, outlives the call.
  void start(Conn& conn, std::move_only_function<T()> exchange) {
    std::lock_guard l(mu_);
    Slot& s = slots_.emplace_back();
    s.conn = &conn;
    threads_.emplace_back([this, &s, exchange = std::move(exchange)]() mutable {
      T value = exchange();
      std::lock_guard l(mu_);
      s.value = std::move(value);
      if (!first_end_) first_end_ = Clock::now();
      ++ended_;
      changed_.notify_all();
    });
  }
  // Waits until a call ends, or `until`.
  void wait(Deadline until) {
    std::unique_lock l(mu_);
    const std::size_t seen = ended_;
    changed_.wait_until(l, until, [&] { return ended_ != seen || !running_locked(); });
  }
  bool running() {
    std::lock_guard l(mu_);
    return running_locked();
  }
  // When the first call ended.
  std::optional<Deadline> first_end() {
    std::lock_guard l(mu_);
    return first_end_;
  }
  // The calls that ended since the last take.
  std::vector<Call> finished() {
    std::lock_guard l(mu_);
    std::vector<Call> out;
    for (auto it = slots_.begin(); it != slots_.end();) {
      if (!it->value) {
        ++it;
        continue;
      }
      out.push_back({std::move(*it->value), it->cut});
      it = slots_.erase(it);
    }
    return out;
  }
  // Cuts off the calls still running, waits for every thread, returns what had not been taken.
  std::vector<Call> cut_off() {
    {
      std::lock_guard l(mu_);
      for (auto& s : slots_)
        if (!s.value) {
          s.cut = true;
          ::shutdown(s.conn->sock.native_handle(), SHUT_RDWR);
        }
    }
    for (auto& t : threads_) t.join();
    threads_.clear();
    return finished();
  }

 private:
  struct Slot {
    Conn* conn = nullptr;
    std::optional<T> value;
    bool cut = false;
  };
  bool running_locked() const {
    return std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return !s.value; });
  }

  std::mutex mu_;
  std::condition_variable changed_;
  std::list<Slot> slots_;  // stable addresses: each thread fills its own
  std::size_t ended_ = 0;
  std::optional<Deadline> first_end_;
  std::vector<std::thread> threads_;
};

// The serving side of links: the publisher, or a relay's downstream. Keeps its listening socket
// across versions; connections that arrive between versions wait (kernel backlog, or `pending_`).
class Server {
 public:
  // Listens on `address`; the endpoint it names is `advertise_host` with the bound port when that is
  // set (a publisher bound to every interface announces where receivers reach it), else the bound
  // address.
  static Result<std::unique_ptr<Server>> listen(const std::string& address, const std::string& advertise_host,
                                                std::chrono::milliseconds reconnect_window, Faults faults) {
    auto s = std::unique_ptr<Server>(new Server());
    s->reconnect_window_ = reconnect_window;
    s->faults_ = faults;
    ARLO_ASSIGN_OR_RETURN(s->token_, auth::process_token());
    ARLO_TRY(auth::require_token_off_loopback("the tcp weight publisher", auth::host_of(address), s->token_));
    ARLO_ASSIGN_OR_RETURN(auto ep, detail::resolve(address));
    boost::system::error_code ec;
    s->acc_.open(ep.protocol(), ec);
    if (!ec) s->acc_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) s->acc_.bind(ep, ec);
    if (!ec) s->acc_.listen(64, ec);
    if (ec) return make_error(ErrorCode::kIo, "listen on " + address + ": " + ec.message());
    const auto local = s->acc_.local_endpoint(ec);
    const std::string host = advertise_host.empty() ? local.address().to_string() : advertise_host;
    s->endpoint_ = (host.find(':') != std::string::npos && !host.starts_with('[') ? "[" + host + "]" : host) + ":" +
                   std::to_string(local.port());
    return s;
  }
  const std::string& endpoint() const { return endpoint_; }
  const Faults& faults() const { return faults_; }

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
                     std::chrono::milliseconds hello_timeout, std::chrono::milliseconds window) {
    auto wants = [&](const Peer& p) { return !version || !p.hello.version || *p.hello.version < *version; };
    std::erase_if(pending_, [](const std::unique_ptr<Peer>& p) { return closed(*p->conn); });  // gave up waiting
    for (auto it = pending_.begin(); it != pending_.end() && peers_.size() < expected;) {
      if (wants(**it)) {
        peers_.push_back(std::move(*it));
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
    Deadline first = peers_.empty() ? Deadline{} : Clock::now();
    using Greeting = std::pair<std::unique_ptr<Conn>, Result<Hello>>;
    auto admit = [&](SideBySide<Greeting>::Call c) {
      auto& [conn, hello] = c.value;
      if (!hello) {
        ARLO_WARN("tcp publisher {}: {}", endpoint_,
                  c.cut ? "dropped a receiver that connected but did not finish its handshake in time (a dark link?)"
                        : "refusing a receiver: " + hello.error().what());
        return;
      }
      auto p = std::make_unique<Peer>();
      p->hello = std::move(*hello);
      conn->peer = p->hello.peer.empty() ? "tcp peer" : p->hello.peer;
      p->conn = std::move(conn);
      if (!wants(*p) || peers_.size() >= expected) return keep_pending(std::move(p));
      if (peers_.empty()) first = Clock::now();
      peers_.push_back(std::move(p));
    };
    SideBySide<Greeting> greetings;
    while (true) {
      // Asked before the ended ones are taken: a handshake that ends in between is taken on the next
      // turn, never left waiting while accept() blocks until `until`.
      const bool handshaking = greetings.running();
      for (auto& c : greetings.finished()) admit(std::move(c));
      if (peers_.size() >= expected) break;
      const auto now = Clock::now();
      const Deadline until = peers_.empty() ? deadline : first + window;
      if (now >= until) break;
      // While handshakes run, look in on them every few milliseconds.
      auto c = accept(handshaking ? std::min(until, now + std::chrono::milliseconds(10)) : until);
      if (!c) continue;
      Conn& link = **c;
      greetings.start(link, [this, conn = std::move(*c), hello_timeout]() mutable {
        auto hello = handshake(*conn, Clock::now() + hello_timeout);
        return Greeting{std::move(conn), std::move(hello)};
      });
    }
    // A handshake under way when the window closed gets a moment more (a live receiver's takes
    // milliseconds, a loaded host's longer); one still waiting then is cut off.
    const Deadline grace = Clock::now() + std::min<std::chrono::milliseconds>(hello_timeout, kStragglerGrace);
    while (greetings.running() && Clock::now() < grace) greetings.wait(grace);
    for (auto& c : greetings.cut_off()) admit(std::move(c));
    return peers_.size();
  }

  std::vector<std::unique_ptr<Peer>>& peers() { return peers_; }

  // Sends the manifest to every live peer and reads each answer, all links at once. Once one peer
  // answered, the others get as long again plus kStragglerGrace: one that has not answered by then
  // (a dark link) is cut off, so it holds nobody's buckets; it is served a later version.
  void offer(const Manifest& m, Deadline deadline) {
    const auto body = m.to_json();
    auto ask = [&](Peer& p) {
      auto s = p.conn->send_json(Frame::kManifest, body, deadline);
      nlohmann::json a;
      Result<FrameHeader> h = s ? p.conn->recv_frame(&a, deadline) : Result<FrameHeader>(std::unexpected(s.error()));
      auto answer = h && static_cast<Frame>(h->type) == Frame::kAnswer
                        ? detail::parse_answer(a, m.buckets.size())
                        : Result<Answer>(make_error(ErrorCode::kParse, "unexpected frame"));
      if (!answer) {
        p.error = "handshake for version " + std::to_string(m.version) +
                  " failed: " + (h ? answer.error().what() : h.error().what());
        return;
      }
      p.answer = std::move(*answer);
    };
    const auto t0 = Clock::now();
    SideBySide<Peer*> asked;
    for (auto& p : peers_)
      if (p->error.empty() && p->answer.state != "refused")
        asked.start(*p->conn, [&ask, p = p.get()] {
          ask(*p);
          return p;
        });
    while (asked.running()) {
      const auto first = asked.first_end();
      const Deadline until = first ? std::min(deadline, *first + (*first - t0) + kStragglerGrace) : deadline;
      if (Clock::now() >= until) break;
      asked.wait(until);
    }
    for (auto& c : asked.cut_off())
      if (c.cut)
        c.value->error = "handshake for version " + std::to_string(m.version) +
                         " failed: no answer to the manifest while the other receivers answered (a dark link?)";
  }

  // Streams buckets to every accepted peer (one thread each) and collects their DONE reports.
  // `regen(i, scratch)` re-creates a bucket that left the feed's window (resume).
  using Regen = std::function<Result<Parts>(std::size_t, std::unique_ptr<std::byte[]>&)>;
  void stream(const Manifest& m, Feed& feed, const Regen& regen, const Options& o, Deadline deadline,
              std::atomic<bool>* fault_pending) {
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    for (std::size_t k = 0; k < peers_.size(); ++k) {
      Peer& p = *peers_[k];
      if (!p.error.empty() || p.answer.state != "accepted") continue;
      feed.add_consumer(static_cast<int>(k), p.answer.start);
      threads.emplace_back([&, k] { serve(static_cast<int>(k), m, feed, regen, o, deadline, fault_pending); });
    }
    std::thread acceptor([&] { accept_resumes(m, o, stop); });
    for (auto& t : threads) t.join();
    stop = true;
    acceptor.join();
  }

  // Drops every link of the finished version.
  void reset() {
    for (auto& p : peers_) p->conn->close();
    peers_.clear();
  }

 private:
  Server() : acc_(acc_ctx_) {}

  // CHALLENGE, then the receiver's HELLO, checked against the token; a refused receiver is told
  // why (REFUSED) and closed.
  Result<Hello> handshake(Conn& c, Deadline deadline) {
    ARLO_ASSIGN_OR_RETURN(auto challenge, auth::nonce());
    ARLO_TRY(c.send_json(Frame::kChallenge, {{"nonce", challenge}, {"token_required", !token_.empty()}}, deadline));
    nlohmann::json body;
    ARLO_ASSIGN_OR_RETURN(auto h, c.recv_frame(&body, deadline, detail::kMaxHandshakeBytes));
    if (static_cast<Frame>(h.type) != Frame::kHello || !body.is_object()) {
      c.close();
      return make_error(ErrorCode::kParse, "tcp " + endpoint_ + ": a connection did not start with HELLO");
    }
    auto parsed = detail::parse_hello(body);
    if (!parsed) {
      c.close();
      return std::unexpected(parsed.error());
    }
    Hello hello = std::move(*parsed);
    if (!token_.empty() && !auth::verify_proof(token_, kAuthContext, challenge, hello.proof)) {
      const std::string why = hello.proof.empty()
                                  ? "authentication failed: this publisher requires the run's token and the receiver "
                                    "sent none (set $ARLO_TOKEN or $ARLO_TOKEN_FILE)"
                                  : "authentication failed: the receiver's token is not this run's";
      ARLO_WARN_EVERY(5.0, "tcp {}: refusing receiver '{}': {}", endpoint_, hello.peer, why);
      (void)c.send_json(Frame::kRefused, {{"error", why}}, deadline);
      c.close();
      return make_error(ErrorCode::kInvalidArgument, why);
    }
    return hello;
  }

  Result<std::unique_ptr<Conn>> accept(Deadline deadline) {
    auto c = std::make_unique<Conn>();
    const auto result = detail::run_with_deadline(
        acc_ctx_, [&](auto handler) { acc_.async_accept(c->sock, std::move(handler)); },
        [&] {
          boost::system::error_code ignored;
          acc_.cancel(ignored);
        },
        deadline);
    if (!result) return make_error(ErrorCode::kTimeout, "no connection");
    if (*result) return make_error(ErrorCode::kIo, "accept: " + result->message());
    c->tune();
    return c;
  }

  void serve(int k, const Manifest& m, Feed& feed, const Regen& regen, const Options& o, Deadline deadline,
             std::atomic<bool>* fault_pending) {
    Peer& p = *peers_[k];
    std::unique_ptr<std::byte[]> scratch;
    std::size_t i = p.answer.start;
    auto fail = [&](const std::string& why) {
      p.error = why;
      feed.remove_consumer(k);
    };
    while (true) {
      Status s = ok();
      if (i < m.buckets.size()) {
        auto parts = feed.get(i, std::min(deadline, Clock::now() + o.bucket_timeout));
        if (!parts && parts.error().code() == ErrorCode::kNotFound) parts = regen(i, scratch);
        if (!parts) return fail(vb(m.version, i) + ": " + parts.error().what());
        if (faults_.stop_before_bucket && *faults_.stop_before_bucket == i) ::raise(SIGSTOP);
        bool corrupt = false;
        if (fault_pending && faults_.corrupt_bucket && *faults_.corrupt_bucket == i)
          corrupt = fault_pending->exchange(false);
        s = send_bucket(*p.conn, i, *parts, std::min(deadline, Clock::now() + o.bucket_timeout), corrupt, feed);
        if (s) {
          for (const auto& part : *parts) p.wire_bytes += part.size();
          feed.advance(k, ++i);
          continue;
        }
      } else {
        nlohmann::json body;
        auto h = p.conn->recv_frame(&body, deadline);
        if (h && static_cast<Frame>(h->type) == Frame::kDone) {
          p.done = std::move(body);
          feed.remove_consumer(k);
          return;
        }
        s = h ? Status(make_error(ErrorCode::kParse, "unexpected frame instead of DONE"))
              : Status(std::unexpected(h.error()));
      }
      // The link failed: the receiver may reconnect and resume.
      const std::string why = s.error().what();
      if (s.error().code() == ErrorCode::kTimeout && i < m.buckets.size())
        return fail(vb(m.version, i) + ", peer " + p.conn->peer + ": " + why + " (deadline " +
                    std::to_string(o.bucket_timeout.count()) + " ms per bucket)");
      p.conn->close();
      std::unique_lock l(p.mu);
      p.waiting = true;
      const bool got = p.cv.wait_until(l, std::min(deadline, Clock::now() + reconnect_window_),
                                       [&] { return p.replacement != nullptr; });
      p.waiting = false;
      if (!got) {
        return fail(vb(m.version, std::min(i, m.buckets.size())) + ", peer " + p.hello.peer + ": " + why +
                    "; it did not reconnect within " + std::to_string(reconnect_window_.count()) + " ms");
      }
      p.conn = std::move(p.replacement);
      i = p.replacement_start;
      feed.advance(k, i);
    }
  }

  void accept_resumes(const Manifest& m, const Options& o, std::atomic<bool>& stop) {
    while (!stop) {
      auto c = accept(Clock::now() + std::chrono::milliseconds(50));
      if (!c) continue;
      auto parsed = handshake(**c, Clock::now() + o.bucket_timeout);
      if (!parsed) continue;
      const Hello hello = std::move(*parsed);
      (*c)->peer = hello.peer;
      Peer* target = nullptr;
      if (hello.resume_version && *hello.resume_version == m.version)
        for (auto& p : peers_)
          if (p->hello.peer == hello.peer && p->answer.state == "accepted") target = p.get();
      if (!target) {
        // Someone for the next version: keep it.
        auto p = std::make_unique<Peer>();
        p->hello = hello;
        p->conn = std::move(*c);
        keep_pending(std::move(p));
        continue;
      }
      const Deadline dl = Clock::now() + o.bucket_timeout;
      nlohmann::json a;
      auto s = (*c)->send_json(Frame::kManifest, m.to_json(), dl);
      auto ah = s ? (*c)->recv_frame(&a, dl) : Result<FrameHeader>(std::unexpected(s.error()));
      auto answer = ah ? detail::parse_answer(a, m.buckets.size()) : Result<Answer>(std::unexpected(ah.error()));
      if (!answer || answer->state != "accepted") continue;
      std::lock_guard l(target->mu);
      target->replacement = std::move(*c);
      target->replacement_start = answer->start;
      target->cv.notify_all();
    }
  }

  // Whether the other end closed `c` (a waiting receiver that gave up); never blocks.
  static bool closed(Conn& c) {
    char b;
    const ssize_t n = ::recv(c.sock.native_handle(), &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }
  void keep_pending(std::unique_ptr<Peer> p) {
    std::erase_if(pending_, [](const std::unique_ptr<Peer>& q) { return closed(*q->conn); });
    pending_.push_back(std::move(p));
  }

  asio::io_context acc_ctx_;
  tcp::acceptor acc_;
  std::string endpoint_;
  std::string token_;  // receivers must prove they hold it (empty: anyone)
  std::chrono::milliseconds reconnect_window_{5000};
  Faults faults_;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::vector<std::unique_ptr<Peer>> pending_;
};

void collect_reports(Server& server, const Manifest& m, std::vector<PeerReport>& out) {
  for (auto& p : server.peers()) {
    const std::string name = p->hello.peer.empty() ? "tcp peer" : p->hello.peer;
    if (p->answer.state == "refused") {
      out.push_back(
          {name, false, "refused the manifest of version " + std::to_string(m.version) + ": " + p->answer.error, 0});
      continue;
    }
    if (!p->error.empty() || p->done.is_null()) {
      out.push_back({name, false, p->error.empty() ? "no acknowledgement" : p->error, p->wire_bytes});
      continue;
    }
    for (const auto& r : p->done.value("peers", nlohmann::json::array()))
      out.push_back(
          {r.value("peer", name), r.value("ok", false), r.value("error", ""), r.value("wire_bytes", std::uint64_t{0})});
  }
}

std::chrono::milliseconds reconnect_window(const nlohmann::json& params) {
  return std::chrono::milliseconds(params.at("reconnect_window_ms").get<std::int64_t>());
}

// How long a transfer waits for the other expected receivers once the first one came.
std::chrono::milliseconds gather_window(const Options& o) { return std::min(o.bucket_timeout, o.gather_window); }

class TcpSender final : public SenderTransport {
 public:
  TcpSender(std::unique_ptr<Server> s, std::size_t expected) : server_(std::move(s)), expected_(expected) {}
  nlohmann::json endpoint() const override { return {{"address", server_->endpoint()}}; }

  Result<PublishReport> publish(Version version, const WeightSource& source, SenderState& state,
                                Deadline deadline) override {
    const auto t0 = Clock::now();
    const Options& o = state.options;
    const std::size_t got = server_->gather(expected_, version, deadline, o.bucket_timeout, gather_window(o));
    if (got == 0)
      return make_error(ErrorCode::kUnavailable, "tcp " + server_->endpoint() + ": no receiver connected for version " +
                                                     std::to_string(version) + " before the deadline");
    // Receivers came: the transfer has the whole version timeout, however briefly we waited for them.
    deadline = std::max(deadline, Clock::now() + o.timeout);
    PayloadOptions payload = o.payload;
    bool delta = payload.kind == PayloadKind::kDelta && state.base && state.last_version &&
                 state.base->specs() == source.specs();
    for (auto& p : server_->peers())
      if (!p->hello.version || *p->hello.version != state.last_version) delta = false;
    if (payload.kind == PayloadKind::kDelta && !delta) payload.kind = PayloadKind::kFull;

    Manifest m;
    for (int attempt = 0;; ++attempt) {
      ARLO_ASSIGN_OR_RETURN(m, Manifest::plan(source.specs(), o.bucket_bytes, payload));
      m.version = version;
      if (payload.kind == PayloadKind::kDelta) m.base_version = state.last_version;
      server_->offer(m, deadline);
      bool need_full = false;
      for (auto& p : server_->peers()) need_full |= p->error.empty() && p->answer.state == "need_full";
      if (!need_full) break;
      if (payload.kind != PayloadKind::kDelta || attempt > 0) {
        for (auto& p : server_->peers())
          if (p->answer.state == "need_full") p->error = "needs a full resync but none was possible";
        break;
      }
      payload.kind = PayloadKind::kFull;
    }
    ARLO_ASSIGN_OR_RETURN(auto enc, BucketEncoder::create(m, source, state.base.get()));
    const std::size_t n = m.buckets.size();
    std::atomic<bool> fault_pending{server_->faults().corrupt_bucket.has_value()};
    PublishReport report;
    report.version = version;
    report.payload = m.payload.kind;
    report.raw_bytes = m.total_bytes;
    report.buckets = n;
    std::atomic<std::uint64_t> wire{0};
    if (enc.zero_copy()) {
      Feed feed(n, n);
      for (std::size_t i = 0; i < n; ++i) {
        ARLO_ASSIGN_OR_RETURN(auto b, enc.encode(i, {}, /*with_checksum=*/false));  // hashed while sent
        wire += b.wire_bytes;
        feed.put(i, std::move(b.parts));
      }
      server_->stream(
          m, feed,
          [](std::size_t i, auto&) -> Result<Parts> {
            return make_error(ErrorCode::kInternal, "bucket " + std::to_string(i) + " missing");
          },
          o, deadline, &fault_pending);
    } else {
      // Double buffering: the encoder thread fills bucket i+1 while links send bucket i.
      const std::uint64_t cap = std::max<std::uint64_t>(enc.max_capacity(), 1);
      std::unique_ptr<std::byte[]> bufs[2] = {std::unique_ptr<std::byte[]>(new std::byte[cap]),
                                              std::unique_ptr<std::byte[]>(new std::byte[cap])};
      Feed feed(n, 2);
      std::thread encoder([&] {
        for (std::size_t i = 0; i < n; ++i) {
          if (auto s = feed.wait_room(i, deadline); !s) return feed.fail(s.error());
          auto b = enc.encode(i, {bufs[i % 2].get(), cap}, /*with_checksum=*/false);
          if (!b) return feed.fail(b.error());
          wire += b->wire_bytes;
          feed.put(i, std::move(b->parts));
        }
      });
      server_->stream(
          m, feed,
          [&](std::size_t i, std::unique_ptr<std::byte[]>& scratch) -> Result<Parts> {
            if (!scratch) scratch.reset(new std::byte[cap]);
            ARLO_ASSIGN_OR_RETURN(auto b, enc.encode(i, {scratch.get(), cap}, /*with_checksum=*/false));
            return b.parts;
          },
          o, deadline, &fault_pending);
      feed.fail(Error(ErrorCode::kCancelled, "links finished"));
      encoder.join();
    }
    report.wire_bytes = wire;
    collect_reports(*server_, m, report.peers);
    server_->reset();
    report.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return report;
  }

 private:
  std::unique_ptr<Server> server_;
  std::size_t expected_;
};

class TcpReceiver final : public ReceiverTransport {
 public:
  TcpReceiver(const ReceiverState& s, std::unique_ptr<Server> relay, std::string token)
      : relay_(std::move(relay)),
        name_(s.options.peer_name),
        token_(std::move(token)),
        address_(s.params.at("address").get<std::string>()),
        reconnect_window_(reconnect_window(s.params)),
        faults_(s.faults) {
    if (name_.empty()) name_ = "receiver-" + std::to_string(::getpid());
  }

  nlohmann::json relay_endpoint() const override {
    return relay_ ? nlohmann::json{{"address", relay_->endpoint()}} : nlohmann::json::object();
  }

  Result<ReceiveReport> receive(WeightSink& sink, ReceiverState& state, Deadline deadline) override {
    const auto t0 = Clock::now();
    const Options& o = state.options;
    ARLO_ASSIGN_OR_RETURN(upstream_ep_, detail::resolve(address_));
    std::unique_ptr<Conn> conn;
    ARLO_TRY(connect(conn, state.version, std::nullopt, 0, deadline));
    Manifest m;
    std::vector<std::span<std::byte>> dest;
    ARLO_TRY(agree(*conn, sink, state, deadline, m, dest));

    Transfer t(m, std::move(dest), o, relay_ != nullptr);
    std::thread relay_thread;
    if (relay_) relay_thread = start_relay(t, o, deadline);
    auto finish_relay = [&] {
      if (relay_thread.joinable()) relay_thread.join();
    };
    Status status = receive_buckets(conn, t, state, deadline);
    // Staging: finish() decodes and frees the kept buckets the relay sends from; let it end first.
    if (status && relay_ && !t.direct && t.staging) finish_relay();
    if (status) status = t.applier.finish();
    if (status) status = sink.commit(m.version);
    if (!status) {
      t.feed.fail(status.error());
      finish_relay();
      if (relay_) relay_->reset();
      if (t.applier.touched()) {
        sink.discard(m.version, status.error());
        state.version.reset();
      }
      conn->close();
      return std::unexpected(status.error());
    }
    state.version = m.version;
    state.specs = m.tensors;
    finish_relay();
    send_done(*conn, t, o, deadline);
    conn->close();
    t.report.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return t.report;
  }

 private:
  // One version being received: what the bucket loop and the relay thread share.
  struct Transfer {
    Transfer(const Manifest& manifest, std::vector<std::span<std::byte>> dest, const Options& o, bool relay)
        : m(manifest),
          applier(manifest, std::move(dest), o.apply_mode),
          direct(applier.direct()),
          staging(o.apply_mode == ApplyMode::kStaging),
          stable_parts(direct || staging),
          cut_through(relay && direct),
          cap(largest_wire_bucket(manifest)),
          feed(manifest.buckets.size(), stable_parts ? std::max<std::size_t>(manifest.buckets.size(), 1) : 2) {
      if (!direct)
        for (auto& b : bufs) b.reset(new std::byte[std::max<std::uint64_t>(cap, 1)]);
      report.version = manifest.version;
      report.payload = manifest.payload.kind;
      report.buckets = manifest.buckets.size();
      report.path = "tcp";
    }
    static std::uint64_t largest_wire_bucket(const Manifest& manifest) {
      std::uint64_t cap = 0;
      for (std::size_t i = 0; i < manifest.buckets.size(); ++i) cap = std::max(cap, wire_capacity(manifest, i));
      return cap;
    }

    const Manifest& m;
    BucketApplier applier;
    const bool direct;                     // buckets are received straight into the sink's spans
    const bool staging;                    // ApplyMode::kStaging: verified buckets are kept until finish()
    const bool stable_parts;               // a verified bucket's bytes stay where they are until the end
    const bool cut_through;                // relaying in place: downstream links send bytes as soon as they arrived
    const std::uint64_t cap;               // largest bucket on the wire
    std::unique_ptr<std::byte[]> bufs[2];  // not direct: bucket i arrives in bufs[i % 2]
    Feed feed;                             // relays: the verified buckets, for the downstream links
    ReceiveReport report;
  };

  // The per-version handshake on a new link: reads the MANIFEST, checks it against the sink (a
  // relay also offers it downstream before answering, so a refusal or a need for a full resync
  // anywhere is known before data moves) and answers; repeated while the answer is need_full (the
  // sender restarts the version in full). Once accepted, `m` and `dest` are the version and its
  // destination spans; a refusal is an error (kMismatch), as is a REFUSED link.
  Status agree(Conn& conn, WeightSink& sink, const ReceiverState& state, Deadline deadline, Manifest& m,
               std::vector<std::span<std::byte>>& dest) {
    const Options& o = state.options;
    while (true) {
      nlohmann::json body;
      ARLO_ASSIGN_OR_RETURN(
          auto h, with_context(conn.recv_frame(&body, deadline), "tcp " + address_ + ": waiting for a manifest"));
      if (static_cast<Frame>(h.type) == Frame::kRefused) return std::unexpected(refused(body));
      if (static_cast<Frame>(h.type) != Frame::kManifest)
        return make_error(ErrorCode::kParse, "tcp: expected a manifest");
      auto parsed = Manifest::from_json(body);
      Answer mine{"accepted", "", 0};
      if (!parsed) {
        mine = {"refused", parsed.error().what(), 0};
      } else {
        m = std::move(*parsed);
        auto bound = bind_sink(m, sink);
        if (!bound)
          mine = {"refused", bound.error().what(), 0};
        else
          dest = std::move(*bound);
        if (bound && m.payload.kind == PayloadKind::kDelta &&
            (!state.version || !m.base_version || *state.version != *m.base_version))
          mine = {"need_full", "", 0};
      }
      if (mine.state == "accepted" && relay_) {
        if (relay_->peers().empty())
          relay_->gather(1, std::nullopt, std::min(deadline, Clock::now() + o.bucket_timeout), o.bucket_timeout, {});
        relay_->offer(m, deadline);
        for (auto& p : relay_->peers())
          if (p->error.empty() && p->answer.state == "need_full") mine = {"need_full", "", 0};
      }
      ARLO_TRY(conn.send_json(Frame::kAnswer, {{"state", mine.state}, {"error", mine.error}, {"start", 0}}, deadline));
      if (mine.state == "refused") {
        if (relay_) relay_->reset();
        return make_error(ErrorCode::kMismatch, "tcp " + address_ + ": manifest refused: " + mine.error);
      }
      if (mine.state == "accepted") return ok();
    }
  }

  // Relays: serves the version downstream from a thread of its own, sending each bucket from
  // t.feed once it is verified here (cut-through: its bytes as soon as they arrived). A bucket
  // that left the feed's window is replayed from the sink (direct) or the kept copy (staging).
  std::thread start_relay(Transfer& t, const Options& o, Deadline deadline) {
    if (t.cut_through)
      t.feed.enable_cut_through([&t](std::size_t b) {
        auto sp = t.applier.direct_spans(b);
        return Parts(sp.begin(), sp.end());
      });
    return std::thread([this, &t, &o, deadline] {
      relay_->stream(
          t.m, t.feed,
          [&t](std::size_t i, auto&) -> Result<Parts> {
            if (t.direct && t.applier.verified(i)) {
              auto s = t.applier.direct_spans(i);
              return Parts(s.begin(), s.end());
            }
            if (t.applier.verified(i) && !t.applier.kept(i).empty()) return Parts{t.applier.kept(i)};
            return make_error(ErrorCode::kUnavailable, "relay cannot replay bucket " + std::to_string(i) +
                                                           " in in_place mode with payload " +
                                                           std::string(to_string(t.m.payload.kind)));
          },
          o, deadline, nullptr);
    });
  }

  // Receives every bucket of t.m from the upstream, in order. A failed link or a corrupted bucket
  // reconnects and resumes from the first unverified bucket: at most 8 times, and never after a
  // malformed frame (kParse). Sets t.report.retried_buckets.
  Status receive_buckets(std::unique_ptr<Conn>& conn, Transfer& t, const ReceiverState& state, Deadline deadline) {
    const Options& o = state.options;
    const Manifest& m = t.m;
    Status status = ok();
    std::size_t retries = 0;
    for (std::size_t i = 0; i < m.buckets.size();) {
      std::span<std::byte> buf;
      if (!t.direct) {
        if (relay_ && !t.stable_parts) {
          if (auto s = t.feed.wait_room(i, deadline); !s) {
            status = s;
            break;
          }
        }
        buf = {t.bufs[i % 2].get(), t.cap};
      }
      if (faults_.stop_before_bucket && *faults_.stop_before_bucket == i) ::raise(SIGSTOP);
      const Status s = take_bucket(*conn, t, i, buf, std::min(deadline, Clock::now() + o.bucket_timeout));
      if (s) {
        ++i;
        continue;
      }
      ++retries;
      ARLO_WARN("weight_sync tcp {}: {} from {}: {}; resuming (retry {})", name_, vb(m.version, i), address_,
                s.error().what(), retries);
      if (retries > 8 || Clock::now() >= deadline || s.error().code() == ErrorCode::kParse) {
        status =
            make_error(s.error().code(), "tcp: " + vb(m.version, i) + ", peer " + address_ + ": " + s.error().what());
        break;
      }
      conn->close();
      auto c = connect(conn, state.version, m.version, i, std::min(deadline, Clock::now() + reconnect_window_));
      if (c) c = resume_handshake(*conn, m, i, deadline);
      if (!c) {
        status = make_error(c.error().code(), "tcp: " + vb(m.version, i) + ", peer " + address_ + ": " +
                                                  s.error().what() + "; reconnect failed: " + c.error().what());
        break;
      }
    }
    t.report.retried_buckets = retries;
    return status;
  }

  // Bucket i from `conn`: into the sink's spans (direct) or `buf`, hashed while it arrives, then
  // applied (or kept, staging); a relay then posts it and the checksum it verified in t.feed, so
  // the next hop needs no second hash. An error leaves bucket i to be received again.
  Status take_bucket(Conn& conn, Transfer& t, std::size_t i, std::span<std::byte> buf, Deadline bucket_deadline) {
    std::vector<std::span<std::byte>> targets;
    if (t.direct) {
      targets = t.applier.direct_spans(i);
      t.applier.mark_touched();
    }
    ARLO_ASSIGN_OR_RETURN(const Received got,
                          recv_bucket(conn, i, targets, buf, bucket_deadline, t.cut_through ? &t.feed : nullptr));
    if (t.direct) {
      t.applier.mark_direct_verified(i);
    } else {
      ARLO_TRY(t.applier.accept_verified(i, buf.subspan(0, got.bytes)));
    }
    t.report.wire_bytes += got.bytes;
    if (!relay_) return ok();
    t.feed.set_sum(i, got.checksum);
    if (t.direct) {
      auto sp = t.applier.direct_spans(i);
      t.feed.put(i, Parts(sp.begin(), sp.end()));
    } else if (t.staging) {
      t.feed.put(i, Parts{t.applier.kept(i)});
    } else {
      t.feed.put(i, Parts{std::span<const std::byte>(buf.subspan(0, got.bytes))});
    }
    return ok();
  }

  // DONE to the upstream: this receiver's report and, relaying, those of everything downstream.
  void send_done(Conn& conn, const Transfer& t, const Options& o, Deadline deadline) {
    nlohmann::json peers = nlohmann::json::array();
    peers.push_back({{"peer", name_}, {"ok", true}, {"error", ""}, {"wire_bytes", t.report.wire_bytes}});
    if (relay_) {
      std::vector<PeerReport> down;
      collect_reports(*relay_, t.m, down);
      for (const auto& d : down)
        peers.push_back({{"peer", d.peer}, {"ok", d.ok}, {"error", d.error}, {"wire_bytes", d.wire_bytes}});
      relay_->reset();
    }
    (void)conn.send_json(Frame::kDone, {{"peers", peers}}, std::min(deadline, Clock::now() + o.bucket_timeout));
  }
  Status connect(std::unique_ptr<Conn>& conn, std::optional<Version> held, std::optional<Version> resume_version,
                 std::size_t resume_bucket, Deadline deadline) {
    Status last = ok();
    while (Clock::now() < deadline) {
      conn = std::make_unique<Conn>();
      conn->peer = "upstream";
      last = conn->connect(upstream_ep_, deadline);
      if (last) {
        conn->tune();
        // The sender speaks first (CHALLENGE); it accepts links only while it serves a version.
        nlohmann::json challenge;
        auto ch = conn->recv_frame(&challenge, deadline, detail::kMaxHandshakeBytes);
        if (ch && (static_cast<Frame>(ch->type) != Frame::kChallenge || !challenge.is_object()))
          return make_error(ErrorCode::kParse, "tcp " + address_ + ": the upstream did not open with a challenge");
        if (!ch) {
          last = std::unexpected(ch.error());
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          continue;
        }
        nlohmann::json hello = {{"peer", name_}, {"version", held ? nlohmann::json(*held) : nlohmann::json(nullptr)}};
        if (!token_.empty() && challenge.contains("nonce") && challenge["nonce"].is_string())
          hello["proof"] = auth::proof(token_, kAuthContext, challenge["nonce"].get<std::string>());
        hello["resume"] = resume_version ? nlohmann::json{{"version", *resume_version}, {"bucket", resume_bucket}}
                                         : nlohmann::json(nullptr);
        last = conn->send_json(Frame::kHello, hello, deadline);
        if (last) return ok();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return make_error(ErrorCode::kUnavailable, "cannot reach upstream before the deadline" +
                                                   (last ? std::string() : ": " + last.error().what()));
  }

  Status resume_handshake(Conn& conn, const Manifest& m, std::size_t start, Deadline deadline) {
    nlohmann::json body;
    ARLO_ASSIGN_OR_RETURN(auto h, conn.recv_frame(&body, deadline));
    if (static_cast<Frame>(h.type) == Frame::kRefused) return std::unexpected(refused(body));
    if (static_cast<Frame>(h.type) != Frame::kManifest) return make_error(ErrorCode::kParse, "expected a manifest");
    ARLO_ASSIGN_OR_RETURN(auto again, Manifest::from_json(body));
    if (again.version != m.version || again.fingerprint() != m.fingerprint())
      return make_error(ErrorCode::kMismatch, "upstream moved to another version or layout");
    return conn.send_json(Frame::kAnswer, {{"state", "accepted"}, {"error", ""}, {"start", start}}, deadline);
  }

  Error refused(const nlohmann::json& body) const {
    return Error(
        ErrorCode::kInvalidArgument,
        "tcp " + address_ + ": the publisher refused this receiver: " +
            (body.is_object() ? body.value("error", std::string("no reason given")) : std::string("no reason given")));
  }

  std::unique_ptr<Server> relay_;
  std::string name_;
  std::string token_;    // proves this receiver to the upstream
  std::string address_;  // upstream host:port
  std::chrono::milliseconds reconnect_window_;
  Faults faults_;
  tcp::endpoint upstream_ep_;
};

}  // namespace

TransportDescriptor tcp_transport() {
  TransportDescriptor d;
  d.name = "tcp";
  d.doc = "streamed over TCP from the trainer (star) or worker to worker (chain), any host";
  d.capabilities.relays = true;
  d.options = {
      string_option("address", "127.0.0.1:0",
                    "publisher: where it listens (port 0: any free port, announced); receiver: the upstream host:port")
          .user_key(),
      string_option("advertise_host", "",
                    "publisher: the host it announces to receivers (empty: the host of address); needed when address "
                    "listens on every interface (0.0.0.0)")
          .user_key(),
      string_option("relay_listen", "127.0.0.1:0",
                    "relaying receiver (chain): where the next node connects (port 0: any free port)"),
      int_option("reconnect_window_ms", 5000, "how long either side waits for a dropped link to come back and resume")
          .range(0, 3600000)
          .user_key(),
  };
  d.sender = [](const SenderState& s) -> Result<std::unique_ptr<SenderTransport>> {
    const auto& address = s.params.at("address").get_ref<const std::string&>();
    const auto& advertise = s.params.at("advertise_host").get_ref<const std::string&>();
    ARLO_ASSIGN_OR_RETURN(auto server, Server::listen(address, advertise, reconnect_window(s.params), s.faults));
    const auto bound = auth::host_of(server->endpoint());
    if (advertise.empty() && (bound == "0.0.0.0" || bound == "::"))
      return make_error(ErrorCode::kInvalidArgument,
                        "tcp: the publisher's address " + address +
                            " listens on every interface, so it cannot announce "
                            "where receivers reach it; set weight_sync.advertise_host to the address the workers reach "
                            "this host on");
    return std::unique_ptr<SenderTransport>(new TcpSender(std::move(server), s.options.expected_receivers));
  };
  d.receiver = [](const ReceiverState& s) -> Result<std::unique_ptr<ReceiverTransport>> {
    std::unique_ptr<Server> relay;
    const auto& relay_listen = s.params.at("relay_listen").get_ref<const std::string&>();
    if (s.options.relay) {
      ARLO_ASSIGN_OR_RETURN(relay, Server::listen(relay_listen, "", reconnect_window(s.params), s.faults));
    }
    ARLO_ASSIGN_OR_RETURN(auto token, auth::process_token());
    return std::unique_ptr<ReceiverTransport>(new TcpReceiver(s, std::move(relay), std::move(token)));
  };
  d.local_only = [](const nlohmann::json& params) -> std::string {
    const std::string address = params.value("address", std::string("127.0.0.1:0"));
    if (!params.value("advertise_host", std::string()).empty() || !auth::is_loopback(auth::host_of(address))) return "";
    return "weight_sync.address " + address +
           " is a loopback address; set it to this host's address, or to "
           "0.0.0.0:<port> with weight_sync.advertise_host naming the address the workers reach this host on";
  };
  d.relay_at = [](const std::string& host, std::uint16_t port) {
    const std::string at = (host.find(':') != std::string::npos && !host.starts_with('[') ? "[" + host + "]" : host) +
                           ":" + std::to_string(port);
    return std::pair{nlohmann::json{{"relay_listen", at}}, nlohmann::json{{"address", at}}};
  };
  return d;
}

}  // namespace arlo::weight_sync
