// The tcp transport's receiver, and relay (chain): connects upstream, agrees on the manifest
// (offering it downstream first when relaying), receives and verifies every bucket, reconnecting
// to resume from the first unverified one, and serves each verified bucket to the next node.
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "common/auth.h"
#include "common/log.h"
#include "weight_sync/codec.h"
#include "weight_sync/transports/tcp/common.h"
#include "weight_sync/transports/tcp/sides.h"
#include "weight_sync/xxh.h"

namespace arlo::weight_sync::detail {
namespace {

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

class TcpReceiver final : public ReceiverTransport {
 public:
  TcpReceiver(const ReceiverState& s, std::unique_ptr<Server> relay, std::string token)
      : relay_(std::move(relay)),
        name_(s.options.peer_name),
        token_(std::move(token)),
        address_(s.params.at("address").get<std::string>()),
        reconnect_window_(reconnect_window(s.params)),
        tap_(s.tap) {
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
          o, deadline);
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
      if (tap_) tap_->before(m.version, i);
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
  std::shared_ptr<BucketTap> tap_;
  tcp::endpoint upstream_ep_;
};

}  // namespace

std::unique_ptr<ReceiverTransport> make_tcp_receiver(const ReceiverState& s, std::unique_ptr<Server> relay,
                                                     std::string token) {
  return std::make_unique<TcpReceiver>(s, std::move(relay), std::move(token));
}

}  // namespace arlo::weight_sync::detail
