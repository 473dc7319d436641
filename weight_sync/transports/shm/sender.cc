// The shm transport's publisher: one session per version on its segment (segment.h): it writes
// the manifest, admits the receivers that accept it, streams the buckets on the session's path
// (ring, direct read or slots; see shm.cc) and collects what each receiver applied.
#include <algorithm>
#include <cstring>

#include "common/log.h"
#include "weight_sync/codec.h"
#include "weight_sync/transports/shm/segment.h"
#include "weight_sync/transports/shm/sides.h"
#include "weight_sync/xxh.h"

namespace arlo::weight_sync::shm {
namespace {

class ShmSender final : public SenderTransport {
 public:
  explicit ShmSender(const SenderState& s)
      : channel_(s.params.at("shm_name").get<std::string>().empty() ? "arlo-weights-" + std::to_string(::getpid())
                                                                    : s.params.at("shm_name").get<std::string>()),
        name_(segment_name(channel_)),
        expected_(s.options.expected_receivers),
        direct_read_(s.params.at("direct_read").get<bool>()),
        tap_(s.tap),
        probe_(std::make_unique<std::uint64_t>(kMagic)) {
    if (direct_read_)
      ARLO_INFO("weight_sync shm {}: direct reads by receivers: {}", name_, detail::allow_same_user_readers());
  }
  nlohmann::json endpoint() const override { return {{"shm_name", channel_}}; }

  Result<PublishReport> publish(Version version, const WeightSource& source, SenderState& state,
                                Deadline deadline) override {
    const auto t0 = Clock::now();
    const Options& o = state.options;
    PayloadOptions payload = o.payload;
    bool want_delta = payload.kind == PayloadKind::kDelta && state.base && state.last_version &&
                      state.base->specs() == source.specs();
    if (payload.kind == PayloadKind::kDelta && !want_delta) payload.kind = PayloadKind::kFull;
    for (int attempt = 0;; ++attempt) {
      ARLO_ASSIGN_OR_RETURN(Manifest m, Manifest::plan(source.specs(), o.bucket_bytes, payload));
      m.version = version;
      if (payload.kind == PayloadKind::kDelta) m.base_version = state.last_version;
      bool need_full = false;
      auto r = run_session(m, source, state, deadline, need_full);
      if (!r) return r;
      if (need_full && payload.kind == PayloadKind::kDelta && attempt == 0) {
        payload.kind = PayloadKind::kFull;  // a receiver holds another base: resync everyone in full
        deadline = std::max(deadline, Clock::now() + o.bucket_timeout);  // they are here: let them rejoin
        continue;
      }
      r->seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      return r;
    }
  }

 private:
  // Makes sure the segment has room for a manifest (and table) of `manifest_len` bytes and bucket
  // slots of `slot_cap`; a smaller one is retired and a larger one created (receivers reopen by name).
  Status ensure_segment(std::uint64_t manifest_len, std::uint64_t slot_cap) {
    if (seg_ && seg_->h->manifest_capacity >= manifest_len && seg_->h->slot_capacity >= slot_cap) return ok();
    seg_.reset();  // retire the smaller one (receivers reopen by name)
    ARLO_ASSIGN_OR_RETURN(seg_, Segment::create(name_, std::max<std::uint64_t>(manifest_len * 2, 1 << 20), slot_cap));
    return ok();
  }

  using BucketParts = std::vector<std::vector<std::span<const std::byte>>>;

  // One publish session on the segment: the receivers admitted to it (reader slot indices, while
  // they are in) and the report being built.
  struct Session {
    Header* h = nullptr;
    std::uint64_t id = 0;
    PublishReport report;
    std::vector<int> active;                                                      // admitted, not dropped
    std::vector<std::size_t> peer_of = std::vector<std::size_t>(kMaxReaders, 0);  // slot -> report.peers

    // Drops receiver k from the session; its peer report says why.
    void drop(int k, const std::string& why) {
      report.peers[peer_of[k]].error = why;
      active.erase(std::find(active.begin(), active.end(), k));
    }
    // Drops receivers that died or failed (used inside every wait); one that applied stays, as it
    // may exit right away.
    void prune(std::size_t bucket) {
      for (int k : std::vector<int>(active)) {
        auto& r = h->readers[k];
        const auto state = r.state.load();
        if (state == kApplied) continue;
        if (state == kFailed)
          drop(k, get_text(r.error, sizeof r.error));
        else if (!process_alive(static_cast<pid_t>(r.pid.load())))
          drop(k, "receiver process died during bucket " + std::to_string(bucket));
      }
    }
    // Ends the session (phase kDone): receivers waiting on it move on.
    void end() {
      h->phase.store(kDone);
      futex_bump_and_wake(h->doorbell);
    }
  };

  // One version: offers manifest `m` (a session), admits the receivers that accept it, streams it
  // on the path they allow and waits for each to apply or fail. need_full is set when a receiver
  // holds another base than a delta's; the caller then restarts the version in full.
  Result<PublishReport> run_session(const Manifest& m, const WeightSource& source, SenderState& state,
                                    Deadline deadline, bool& need_full) {
    const Options& o = state.options;
    ARLO_ASSIGN_OR_RETURN(auto enc, BucketEncoder::create(m, source, state.base.get()));
    // Payloads sent as the source's own bytes can go through the ring or be read directly: list
    // where they live (the table also carries the per-bucket checksums).
    BucketParts bucket_parts;
    if (enc.zero_copy()) {
      for (std::size_t i = 0; i < m.buckets.size(); ++i) {
        ARLO_ASSIGN_OR_RETURN(auto b, enc.encode(i, {}, /*with_checksum=*/false));
        bucket_parts.push_back(std::move(b.parts));
      }
    }
    ARLO_ASSIGN_OR_RETURN(const DirectTable table, open_session(m, enc, bucket_parts));
    Session s;
    s.h = seg_->h;
    s.id = s.h->session.load();
    deadline = gather(s, deadline, o);
    admit(s, m, need_full);
    if (need_full && m.payload.kind == PayloadKind::kDelta) {
      s.end();
      return s.report;  // caller restarts in full
    }
    if (s.active.empty()) {
      s.end();
      if (s.report.peers.empty())
        return make_error(ErrorCode::kUnavailable, "shm " + name_ + ": no receiver joined version " +
                                                       std::to_string(m.version) + " before the deadline");
      return s.report;
    }
    const Mode mode = choose_mode(s, m, enc);
    s.h->mode.store(mode);
    for (int k : s.active) s.h->readers[k].admitted.store(s.id);
    s.h->phase.store(kStreaming, std::memory_order_release);
    futex_bump_and_wake(s.h->doorbell);

    if (mode == kModeDirectRead) post_direct_checksums(s, m, bucket_parts, table);
    if (mode == kModeRing) s.report.wire_bytes += stream_ring(s, m, bucket_parts, table, deadline, o);
    if (mode == kModeSlots) ARLO_TRY(stream_slots(s, m, enc, deadline, o));
    await_applied(s, m, deadline, o);
    s.end();
    return s.report;
  }

  // Starts a session: writes the manifest (and, when `bucket_parts` lists the source's bytes, the
  // direct-read table after it) into a segment large enough, reclaims the reader slots of dead
  // receivers, resets the bucket slots, and opens the session (phase kJoining). Returns the table
  // (empty without parts); the session's number is h->session.
  Result<DirectTable> open_session(const Manifest& m, const BucketEncoder& enc, const BucketParts& bucket_parts) {
    const std::string text = m.dump();
    const std::uint64_t slot_cap = std::max<std::uint64_t>({enc.max_capacity(), m.max_bucket_bytes(), 4096});
    const bool offer_direct = enc.zero_copy();
    std::uint64_t nparts = 0;
    for (const auto& parts : bucket_parts) nparts += parts.size();
    const std::uint64_t table_at = align_up(text.size(), 64);
    const std::uint64_t table_len = offer_direct ? DirectTable::bytes(m.buckets.size(), nparts) : 0;
    ARLO_TRY(ensure_segment(table_at + table_len, slot_cap));
    Header* h = seg_->h;

    // Reclaim slots of dead receivers.
    for (auto& r : h->readers) {
      const pid_t pid = static_cast<pid_t>(r.pid.load());
      if (pid != 0 && !process_alive(pid)) r.pid.store(0);
    }
    std::memcpy(seg_->manifest(), text.data(), text.size());
    h->manifest_len.store(text.size());
    h->published.store(0);
    h->mode.store(kModeSlots);
    h->hashed.store(0);
    h->ring_filled.store(0);
    h->ring_room_want.store(0);
    h->ring_bytes = std::min<std::uint64_t>(h->slot_capacity, kRingBytes);
    h->probe_addr = reinterpret_cast<std::uintptr_t>(probe_.get());
    h->table_offset = 0;
    DirectTable table;
    if (offer_direct) {
      h->table_offset = h->manifest_offset + table_at;
      std::byte* t = seg_->at(h->table_offset);
      auto* head = reinterpret_cast<std::uint64_t*>(t);
      head[0] = m.buckets.size();
      head[1] = nparts;
      table = DirectTable::at(t);
      std::uint64_t k = 0;
      for (std::size_t i = 0; i < bucket_parts.size(); ++i) {
        table.first[i] = k;
        for (const auto& part : bucket_parts[i])
          table.parts[k++] = {static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(part.data())), part.size()};
      }
      table.first[bucket_parts.size()] = k;
    }
    h->slots[0].index.store(kNoBucket);
    h->slots[1].index.store(kNoBucket);
    const std::uint64_t session = h->session.load() + 1;
    h->session.store(session, std::memory_order_release);
    h->phase.store(kJoining, std::memory_order_release);
    futex_bump_and_wake(h->doorbell);
    return table;
  }

  // Join: waits until `deadline` for the first answer, then at most the gather window for the other
  // expected receivers. One that does not come holds nobody: it joins a later session. Returns the
  // transfer's deadline: once receivers came, the whole version timeout, however briefly we waited.
  Deadline gather(const Session& s, Deadline deadline, const Options& o) {
    Header* h = s.h;
    auto answered = [&] {
      std::size_t n = 0;
      for (auto& r : h->readers)
        if (r.pid.load() != 0 && r.session.load() == s.id && r.state.load() != kIdle) ++n;
      return n;
    };
    (void)wait_for(
        h, deadline, [&] { return answered() >= 1; }, [] { return ok(); }, "a receiver to join");
    if (answered() >= 1) {
      const auto window = std::min(o.bucket_timeout, o.gather_window);
      (void)wait_for(
          h, Clock::now() + window, [&] { return answered() >= expected_; }, [] { return ok(); }, "receivers to join");
      deadline = std::max(deadline, Clock::now() + o.timeout);
    }
    return deadline;
  }

  // Reads the answers: a receiver that accepted is admitted (s.active), one that refused or needs
  // a full resync (need_full) is reported as not served.
  void admit(Session& s, const Manifest& m, bool& need_full) {
    s.report.version = m.version;
    s.report.payload = m.payload.kind;
    s.report.raw_bytes = m.total_bytes;
    s.report.buckets = m.buckets.size();
    for (int k = 0; k < kMaxReaders; ++k) {
      auto& r = s.h->readers[k];
      if (r.pid.load() == 0 || r.session.load() != s.id) continue;
      const std::string peer = get_text(r.name, sizeof r.name);
      const auto st = r.state.load();
      if (st == kAccepted) {
        s.peer_of[k] = s.report.peers.size();
        s.report.peers.push_back({peer, false, "", 0});
        s.active.push_back(k);
      } else if (st == kNeedFull) {
        need_full = true;
        s.report.peers.push_back({peer, false, "holds another base version; needs a full resync", 0});
      } else if (st == kRefused) {
        s.report.peers.push_back({peer, false, "refused the manifest: " + get_text(r.error, sizeof r.error), 0});
      }
    }
  }

  // Path for this session (the same for every admitted receiver), logged when it changes:
  //   ring: `full` bytes, every receiver applies in place: chunks pass through a small ring that
  //         stays in the shared cache, publisher and receivers copying at the same time;
  //   direct read: as ring, and shm_direct_read asks receivers to pull from this process's memory;
  //   slots: anything else (encoded payloads, staging receivers).
  Mode choose_mode(const Session& s, const Manifest& m, const BucketEncoder& enc) {
    Header* h = s.h;
    std::string why_slots;
    if (!enc.zero_copy())
      why_slots = "payload " + std::string(to_string(m.payload.kind)) + (m.payload.zstd ? "+zstd" : "") + " is encoded";
    bool all_read = direct_read_;
    for (int k : s.active) {
      const auto caps = h->readers[k].caps.load();
      if (why_slots.empty() && !(caps & kCapInPlace))
        why_slots = get_text(h->readers[k].name, sizeof h->readers[k].name) + " applies in staging mode";
      if (!(caps & kCapRead)) all_read = false;
    }
    const Mode mode = !why_slots.empty() ? kModeSlots : all_read ? kModeDirectRead : kModeRing;
    const std::string path = mode == kModeSlots  ? "slots (" + why_slots + ")"
                             : mode == kModeRing ? "ring"
                                                 : "direct read";
    if (path != last_path_) {
      ARLO_INFO("weight_sync shm {}: version {}: {}", name_, m.version,
                mode == kModeDirectRead
                    ? std::string("receivers copy straight from this process's memory (process_vm_readv)")
                : mode == kModeRing ? "buckets stream through a " + std::to_string(h->ring_bytes >> 20) +
                                          " MiB ring (publisher and receivers copy concurrently)"
                                    : "buckets are copied through the shared bucket slots: " + why_slots);
      last_path_ = path;
    }
    return mode;
  }

  // Direct read: receivers pull on their own; the publisher only posts each bucket's checksum,
  // hashing the source once while they copy.
  void post_direct_checksums(Session& s, const Manifest& m, const BucketParts& bucket_parts, const DirectTable& table) {
    for (std::size_t i = 0; i < m.buckets.size() && !s.active.empty(); ++i) {
      if (tap_) tap_->before(m.version, i);
      std::uint64_t checksum = xxh3(bucket_parts[i]);
      if (tap_) tap_->sealed(m.version, i, {}, &checksum);  // receivers read the source itself
      table.checksums[i] = checksum;
      s.h->hashed.store(i + 1, std::memory_order_release);
      futex_bump_and_wake(s.h->doorbell);
      for (const auto& part : bucket_parts[i]) s.report.wire_bytes += part.size();
    }
  }

  // Ring mode: copies every bucket's bytes through the ring in slot 0, hashing each piece while it
  // is hot, posting each bucket's checksum in the table. A receiver that does not make room within
  // a bucket timeout is dropped. Returns the bytes streamed.
  std::uint64_t stream_ring(Session& s, const Manifest& m, const BucketParts& bucket_parts, const DirectTable& table,
                            Deadline deadline, const Options& o) {
    Header* h = s.h;
    std::byte* ring = seg_->slot(0);
    const std::uint64_t ring_size = h->ring_bytes;
    std::uint64_t pos = 0;
    for (std::size_t i = 0; i < m.buckets.size() && !s.active.empty(); ++i) {
      if (tap_) tap_->before(m.version, i);
      const Deadline bd = std::min(deadline, Clock::now() + o.bucket_timeout);
      XXH3_state_t st;
      XXH3_64bits_reset(&st);
      for (const auto& part : bucket_parts[i]) {
        for (std::size_t off = 0; off < part.size() && !s.active.empty();) {
          const std::uint64_t n = std::min<std::uint64_t>({kPiece, part.size() - off, ring_size - pos % ring_size});
          auto room = [&] {
            for (int k : s.active)
              if (h->readers[k].ring_consumed.load() + ring_size < pos + n && h->readers[k].state.load() != kFailed)
                return false;
            return true;
          };
          const std::uint64_t want = std::min(pos, pos + n + kRingBatch - ring_size);
          auto st_room = ring_wait(
              h, bd, room, h->ring_room_want, want,
              [&]() -> Status {
                s.prune(i);
                return ok();
              },
              "ring room");
          if (!st_room)
            for (int k : std::vector<int>(s.active))
              if (h->readers[k].ring_consumed.load() + ring_size < pos + n)
                s.drop(k, "timed out consuming bucket " + std::to_string(i));
          if (s.active.empty()) break;
          std::byte* dst = ring + pos % ring_size;
          XXH3_64bits_update(&st, part.data() + off, n);
          std::memcpy(dst, part.data() + off, n);
          if (tap_) tap_->sealed(m.version, i, {dst, static_cast<std::size_t>(n)}, nullptr);
          pos += n;
          off += n;
          h->ring_filled.store(pos);
          bool wake = false;
          for (int k : s.active) {
            const std::uint64_t w = h->readers[k].ring_data_want.load();
            wake |= w != 0 && pos >= w;
          }
          if (wake) futex_bump_and_wake(h->doorbell);
        }
      }
      table.checksums[i] = XXH3_64bits_digest(&st);
      h->hashed.store(i + 1, std::memory_order_release);
      futex_bump_and_wake(h->doorbell);
    }
    return pos;
  }

  // What a bucket slot holds once filled.
  struct Filled {
    std::uint64_t wire = 0;
    std::uint64_t checksum = 0;
  };

  // Slots: the publisher copies or encodes bucket i into slot i%2 while receivers take bucket i-1
  // out of the other one; slot i%2 is reused once every receiver is done with bucket i-2 (one
  // that is not within a bucket timeout is dropped). An encoding error ends the version.
  Status stream_slots(Session& s, const Manifest& m, BucketEncoder& enc, Deadline deadline, const Options& o) {
    Header* h = s.h;
    for (std::size_t i = 0; i < m.buckets.size() && !s.active.empty(); ++i) {
      const int k = static_cast<int>(i % 2);
      if (i >= 2) {
        wait_slot_free(s, i, std::min(deadline, Clock::now() + o.bucket_timeout));
        if (s.active.empty()) break;
      }
      if (tap_) tap_->before(m.version, i);
      auto& slot = h->slots[k];
      Filled f;
      if (enc.zero_copy()) {
        ARLO_ASSIGN_OR_RETURN(f, fill_slot_streamed(h, k, enc, m.version, i));
      } else {
        ARLO_ASSIGN_OR_RETURN(f, fill_slot_encoded(h, k, enc, m.version, i));
      }
      slot.checksum = f.checksum;
      slot.sealed.store(1, std::memory_order_release);
      h->published.store(i + 1, std::memory_order_release);
      futex_bump_and_wake(h->doorbell);
      s.report.wire_bytes += f.wire;
    }
    return ok();
  }

  // Slots: waits until every admitted receiver is done with bucket i-2 (its slot is reused for
  // bucket i), until `bucket_deadline`; drops the ones that are not by then.
  void wait_slot_free(Session& s, std::size_t i, Deadline bucket_deadline) {
    Header* h = s.h;
    auto st = wait_for(
        h, bucket_deadline,
        [&] {
          for (int k : s.active)
            if (h->readers[k].consumed.load(std::memory_order_acquire) < i - 1 && h->readers[k].state.load() != kFailed)
              return false;
          return true;
        },
        [&] {
          s.prune(i - 2);
          return ok();
        },
        "bucket " + std::to_string(i - 2));
    s.prune(i - 2);
    if (!st)
      for (int k : std::vector<int>(s.active))
        if (h->readers[k].consumed.load() < i - 1) s.drop(k, "timed out consuming bucket " + std::to_string(i - 2));
  }

  // Slots, the source's own bytes: announces bucket i in slot k, then publishes it chunk by chunk
  // (each piece hashed while hot, then copied), so an in-place receiver copies while this side is
  // still writing. A tap is shown each piece in the slot once hashed, before it is announced.
  Result<Filled> fill_slot_streamed(Header* h, int k, BucketEncoder& enc, Version v, std::size_t i) {
    std::byte* dst = seg_->slot(k);
    auto& slot = h->slots[k];
    ARLO_ASSIGN_OR_RETURN(auto b, enc.encode(i, {}, /*with_checksum=*/false));
    const std::uint64_t wire = b.wire_bytes;
    slot.sealed.store(0);
    slot.filled.store(0);
    slot.wire_bytes = wire;
    slot.index.store(i, std::memory_order_release);
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    std::uint64_t off = 0;
    for (const auto& part : b.parts) {
      for (std::size_t p = 0; p < part.size(); p += kStreamChunk) {
        const std::size_t n = std::min<std::size_t>(kStreamChunk, part.size() - p);
        // Hash each piece of the source first (it is then in cache), then copy it: small pieces
        // keep memcpy on regular (cached) stores.
        for (std::size_t q = 0; q < n; q += kPiece) {
          const std::size_t c = std::min<std::size_t>(kPiece, n - q);
          XXH3_64bits_update(&st, part.data() + p + q, c);
          std::memcpy(dst + off + q, part.data() + p + q, c);
        }
        if (tap_) tap_->sealed(v, i, {dst + off, n}, nullptr);
        off += n;
        slot.filled.store(off, std::memory_order_release);
        futex_bump_and_wake(h->doorbell);
      }
    }
    return Filled{wire, XXH3_64bits_digest(&st)};
  }

  // Slots, an encoded payload: encodes bucket i straight into slot k, then announces it whole.
  // A tap is shown the encoded bucket and its checksum before it is announced.
  Result<Filled> fill_slot_encoded(Header* h, int k, BucketEncoder& enc, Version v, std::size_t i) {
    std::byte* dst = seg_->slot(k);
    auto& slot = h->slots[k];
    ARLO_ASSIGN_OR_RETURN(auto b, enc.encode(i, {dst, h->slot_capacity}));
    if (tap_) tap_->sealed(v, i, {dst, static_cast<std::size_t>(b.wire_bytes)}, &b.checksum);
    slot.sealed.store(0);
    slot.wire_bytes = b.wire_bytes;
    slot.filled.store(b.wire_bytes);
    slot.index.store(i, std::memory_order_release);
    return Filled{b.wire_bytes, b.checksum};
  }

  // Waits for every admitted receiver to apply or fail, and reports each; one that makes no
  // progress for a bucket timeout is dropped (direct reads have no slot hand-over to bound them
  // otherwise), and one still at it at `deadline` did not apply in time.
  void await_applied(Session& s, const Manifest& m, Deadline deadline, const Options& o) {
    Header* h = s.h;
    std::vector<std::uint64_t> seen(kMaxReaders, ~0ull);
    Clock::time_point progress_at = Clock::now();
    while (true) {
      const Deadline step = std::min(deadline, progress_at + o.bucket_timeout);
      auto st = wait_for(
          h, step,
          [&] {
            bool moved = false;
            for (int k : s.active) {
              const auto c = h->readers[k].consumed.load();
              if (c != seen[k]) moved = true, seen[k] = c;
            }
            if (moved) progress_at = Clock::now();
            for (int k : s.active)
              if (h->readers[k].state.load() != kApplied && h->readers[k].state.load() != kFailed) return false;
            return true;
          },
          [&] {
            s.prune(m.buckets.size());
            return ok();
          },
          "receivers to apply");
      if (st || Clock::now() >= deadline) break;
      if (Clock::now() >= progress_at + o.bucket_timeout) {
        for (int k : std::vector<int>(s.active)) {
          const auto state = h->readers[k].state.load();
          if (state != kApplied && state != kFailed)
            s.drop(k, "made no progress for " + std::to_string(o.bucket_timeout.count()) + " ms at bucket " +
                          std::to_string(h->readers[k].consumed.load()));
        }
        break;
      }
    }
    for (int k : s.active) {
      auto& r = h->readers[k];
      auto& p = s.report.peers[s.peer_of[k]];
      if (r.state.load() == kApplied) {
        p.ok = true;
        p.wire_bytes = s.report.wire_bytes;
      } else if (r.state.load() == kFailed) {
        p.error = get_text(r.error, sizeof r.error);
      } else {
        p.error = "did not apply before the publish deadline";
      }
    }
  }

  std::string channel_;  // the shm_name receivers give
  std::string name_;
  std::size_t expected_;
  bool direct_read_;
  std::shared_ptr<BucketTap> tap_;  // shown each bucket this side publishes (transport.h); usually null
  std::unique_ptr<Segment> seg_;
  std::unique_ptr<std::uint64_t> probe_;  // kMagic at a stable address: receivers test read permission on it
  std::string last_path_;                 // path of the previous session (logged when it changes)
};

}  // namespace

std::unique_ptr<SenderTransport> make_sender(const SenderState& s) { return std::make_unique<ShmSender>(s); }

}  // namespace arlo::weight_sync::shm
