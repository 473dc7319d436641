// A receiver of the shm transport: attaches to the publisher's segment (segment.h), claims a
// reader slot, answers each session's manifest, and takes the buckets on the session's path (ring,
// direct read or slots; see shm.cc), verifying each before it counts.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "common/log.h"
#include "weight_sync/codec.h"
#include "weight_sync/transports/shm/segment.h"
#include "weight_sync/transports/shm/sides.h"
#include "weight_sync/xxh.h"

namespace arlo::weight_sync::shm {
namespace {

class ShmReceiver final : public ReceiverTransport {
 public:
  explicit ShmReceiver(const ReceiverState& s)
      : name_(segment_name(s.params.at("shm_name").get<std::string>())),
        direct_read_(s.params.at("direct_read").get<bool>()),
        tap_(s.tap),
        peer_name_(s.options.peer_name) {}
  ~ShmReceiver() override {
    if (seg_ && slot_ >= 0 && seg_->h->readers[slot_].pid.load() == static_cast<std::uint32_t>(::getpid())) {
      seg_->h->readers[slot_].pid.store(0);
      futex_bump_and_wake(seg_->h->doorbell);
    }
  }

  Result<ReceiveReport> receive(WeightSink& sink, ReceiverState& state, Deadline deadline) override {
    const auto t0 = Clock::now();
    while (true) {
      if (Clock::now() >= deadline)
        return make_error(ErrorCode::kTimeout, "shm " + name_ + ": no new version before the deadline");
      if (!attach()) {
        std::this_thread::sleep_for(kPoll);
        continue;
      }
      Header* h = seg_->h;
      // Wait for a joining phase of a session we have not answered.
      const std::uint64_t answered = h->readers[slot_].session.load();
      Status st = wait_for(
          h, std::min(deadline, Clock::now() + std::chrono::milliseconds(200)),
          [&] { return h->retired.load() || (h->phase.load() == kJoining && h->session.load() > answered); },
          [&]() -> Status {
            if (!process_alive(static_cast<pid_t>(h->publisher_pid.load())))
              return make_error(ErrorCode::kUnavailable, "publisher died");
            return ok();
          },
          "a new version");
      if (!st || h->retired.load()) {
        if (!st && st.error().code() == ErrorCode::kUnavailable) seg_->unlink_if_same();  // clean up after it
        if (!st && st.error().code() == ErrorCode::kTimeout) continue;
        detach();
        continue;
      }
      const std::uint64_t session = h->session.load(std::memory_order_acquire);
      auto& me = h->readers[slot_];
      const std::string text(reinterpret_cast<const char*>(seg_->manifest()), h->manifest_len.load());
      auto m = Manifest::parse(text);
      std::vector<std::span<std::byte>> dest;
      auto answer = [&](ReaderState s, const std::string& err) {
        set_text(me.error, sizeof me.error, err);
        me.consumed.store(0);
        me.state.store(s);
        me.session.store(session, std::memory_order_release);
        futex_bump_and_wake(h->doorbell);
      };
      if (!m) {
        answer(kRefused, m.error().what());
        return make_error(ErrorCode::kMismatch, "shm " + name_ + ": manifest refused: " + m.error().what());
      }
      if (state.version && m->version <= *state.version) {
        // It holds this version already (a publisher serving late joiners): wait for a newer one.
        me.state.store(kIdle);
        me.session.store(session, std::memory_order_release);
        continue;
      }
      auto bound = bind_sink(*m, sink);
      if (!bound) {
        answer(kRefused, bound.error().what());
        return make_error(ErrorCode::kMismatch,
                          "shm " + name_ + ": version " + std::to_string(m->version) + ": " + bound.error().what());
      }
      if (m->payload.kind == PayloadKind::kDelta &&
          (!state.version || !m->base_version || *state.version != *m->base_version)) {
        answer(kNeedFull, "");
        continue;  // the publisher restarts this version in full
      }
      dest = std::move(*bound);
      const bool in_place_full =
          state.options.apply_mode == ApplyMode::kInPlace && m->payload.kind == PayloadKind::kFull && !m->payload.zstd;
      std::uint32_t caps = in_place_full ? kCapInPlace : 0;
      if (in_place_full && direct_read_ && can_read_publisher(h)) caps |= kCapRead;
      me.caps.store(caps);
      me.ring_consumed.store(0);
      me.ring_data_want.store(0);
      answer(kAccepted, "");
      // Admitted, or left out (joined too late): then wait for the next session.
      st = wait_for(
          h, deadline,
          [&] { return me.admitted.load() == session || h->session.load() != session || h->phase.load() != kJoining; },
          [] { return ok(); }, "admission");
      if (me.admitted.load() != session) continue;
      auto r = stream(*m, session, dest, sink, state, deadline);
      if (r) r->seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      return r;
    }
  }

 private:
  // Maps the publisher's segment (again, after it was retired or replaced) and claims a reader
  // slot in it. False when there is none yet, its publisher is dead (its leftover is unlinked), or
  // every slot is taken; the caller retries.
  bool attach() {
    if (seg_ && !seg_->h->retired.load()) {
      if (seg_->h->readers[slot_].pid.load() == static_cast<std::uint32_t>(::getpid())) return true;
    } else {
      detach();
      auto s = Segment::open(name_);
      if (!s) return false;
      seg_ = std::move(*s);
      if (!process_alive(static_cast<pid_t>(seg_->h->publisher_pid.load()))) {
        seg_->unlink_if_same();  // leftover of a dead publisher
        seg_.reset();
        return false;
      }
    }
    // Claim a reader slot.
    const auto me = static_cast<std::uint32_t>(::getpid());
    for (int k = 0; k < kMaxReaders; ++k) {
      std::uint32_t expected = 0;
      auto& r = seg_->h->readers[k];
      if (r.pid.compare_exchange_strong(expected, me)) {
        r.state.store(kIdle);
        r.consumed.store(0);
        r.admitted.store(0);
        r.session.store(seg_->h->phase.load() == kJoining ? seg_->h->session.load() - 1 : seg_->h->session.load());
        set_text(r.name, sizeof r.name, peer_name_.empty() ? "pid " + std::to_string(me) : peer_name_);
        slot_ = k;
        return true;
      }
    }
    ARLO_WARN_EVERY(5.0, "shm {}: all {} receiver slots are taken", name_, kMaxReaders);
    return false;
  }

  void detach() {
    seg_.reset();
    slot_ = -1;
  }

  // Whether process_vm_readv from the publisher works: reads its probe word (known value). The
  // answer is kept per publisher pid; a refusal is logged once with the reason.
  bool can_read_publisher(Header* h) {
    const pid_t pid = static_cast<pid_t>(h->publisher_pid.load());
    if (pid == probed_pid_) return probe_ok_;
    std::uint64_t word = 0;
    const int err = detail::read_remote(pid, {reinterpret_cast<std::byte*>(&word), sizeof word}, h->probe_addr);
    probed_pid_ = pid;
    probe_ok_ = err == 0 && word == kMagic;
    if (!probe_ok_)
      ARLO_WARN(
          "weight_sync shm {}: cannot read publisher pid {}'s memory directly ({}); buckets will come through "
          "the shared slots (two copies). Same user and Yama ptrace_scope <= 1 allow direct reads.",
          name_, pid, err ? std::strerror(err) : "probe word differs");
    else
      ARLO_INFO("weight_sync shm {}: reading buckets straight from publisher pid {} (process_vm_readv)", name_, pid);
    return probe_ok_;
  }

  // Ring path for bucket i: takes the bucket's bytes out of the ring as the publisher puts them in,
  // hashing each piece, then copying it to the sink (non-temporal), then checks the checksum.
  Status read_ring(Header* h, const DirectTable& table, std::size_t i, BucketApplier& applier, std::uint64_t& pos,
                   Deadline bd, const std::function<Status()>& alive, std::uint64_t& wire) {
    auto& me = h->readers[slot_];
    const std::byte* ring = seg_->slot(0);
    const std::uint64_t ring_size = h->ring_bytes;
    auto dst = applier.direct_spans(i);
    applier.mark_touched();
    XXH3_state_t hs;
    XXH3_64bits_reset(&hs);
    std::uint64_t total = 0;
    std::uint64_t bucket_end = pos;
    for (const auto& d : dst) bucket_end += d.size();
    for (const auto& d : dst) {
      for (std::size_t off = 0; off < d.size();) {
        std::uint64_t filled = 0;
        ARLO_TRY(ring_wait(
            h, bd, [&] { return (filled = h->ring_filled.load()) > pos; }, me.ring_data_want,
            std::min(pos + kRingBatch, bucket_end), alive, "bucket " + std::to_string(i)));
        const std::uint64_t n =
            std::min<std::uint64_t>({filled - pos, d.size() - off, ring_size - pos % ring_size, kPiece});
        const std::byte* src = ring + pos % ring_size;
        XXH3_64bits_update(&hs, src, n);
        stream_copy(d.data() + off, src, n);
        pos += n;
        off += n;
        total += n;
        me.ring_consumed.store(pos);
        if (const std::uint64_t w = h->ring_room_want.load(); w != 0 && pos >= w) futex_bump_and_wake(h->doorbell);
      }
    }
    ARLO_TRY(verify_bucket(h, table, i, hs, applier, bd, alive));
    wire = total;
    return ok();
  }

  // Direct path for bucket i: copies the publisher's bytes into the sink piece by piece, hashing each
  // piece while it is in cache, then checks the publisher's checksum for the bucket.
  Status read_direct(Header* h, const DirectTable& table, std::size_t i, BucketApplier& applier, pid_t publisher,
                     std::uint64_t session, Deadline bd, const std::function<Status()>& alive, std::uint64_t& wire) {
    auto dst = applier.direct_spans(i);
    std::uint64_t need = 0, have = 0;
    for (const auto& d : dst) need += d.size();
    for (std::uint64_t k = table.first[i]; k < table.first[i + 1]; ++k) have += table.parts[k].len;
    if (need != have || table.head[0] <= i)
      return make_error(ErrorCode::kParse,
                        "bucket " + std::to_string(i) + ": direct-read table does not match the manifest");
    applier.mark_touched();
    XXH3_state_t hs;
    XXH3_64bits_reset(&hs);
    std::size_t li = 0;
    std::uint64_t loff = 0, roff = 0;
    for (std::uint64_t k = table.first[i]; k < table.first[i + 1];) {
      const RemotePart part = table.parts[k];
      if (roff == part.len) {
        ++k;
        roff = 0;
        continue;
      }
      while (dst[li].size() == loff) ++li, loff = 0;
      const std::uint64_t n = std::min({part.len - roff, dst[li].size() - loff, kDirectPiece});
      auto piece = dst[li].subspan(loff, n);
      if (const int err = detail::read_remote(publisher, piece, part.addr + roff); err != 0) {
        if (err == ESRCH || !process_alive(publisher))
          return make_error(ErrorCode::kUnavailable, "publisher process died");
        return make_error(ErrorCode::kIo,
                          "bucket " + std::to_string(i) + ": reading the publisher's memory: " + std::strerror(err));
      }
      XXH3_64bits_update(&hs, piece.data(), n);
      roff += n;
      loff += n;
      if (h->session.load(std::memory_order_relaxed) != session)
        return make_error(ErrorCode::kCancelled, "publisher abandoned the version");
      if (Clock::now() >= bd) return make_error(ErrorCode::kTimeout, "timed out reading bucket " + std::to_string(i));
    }
    ARLO_TRY(verify_bucket(h, table, i, hs, applier, bd, alive));
    wire = need;
    return ok();
  }

  // The end of both paths for bucket i: waits until the publisher has hashed the bucket, then
  // compares its checksum with `hs` (what this reader hashed) and marks the bucket verified.
  Status verify_bucket(Header* h, const DirectTable& table, std::size_t i, XXH3_state_t& hs, BucketApplier& applier,
                       Deadline bd, const std::function<Status()>& alive) {
    ARLO_TRY(wait_for(
        h, bd, [&] { return h->hashed.load(std::memory_order_acquire) > i; }, alive,
        "the checksum of bucket " + std::to_string(i)));
    if (XXH3_64bits_digest(&hs) != table.checksums[i])
      return make_error(ErrorCode::kMismatch,
                        "bucket " + std::to_string(i) + ": checksum mismatch (corrupted in transit)");
    applier.mark_direct_verified(i);
    return ok();
  }

  // Receives version `m` (session `session`, admitted): every bucket on the session's path,
  // verified, into `dest` through the applier, then commits it to the sink. A failure is posted in
  // this reader's slot (kFailed with the reason) and discards what was written in place.
  Result<ReceiveReport> stream(const Manifest& m, std::uint64_t session, std::vector<std::span<std::byte>> dest,
                               WeightSink& sink, ReceiverState& state, Deadline deadline) {
    Header* h = seg_->h;
    auto& me = h->readers[slot_];
    const Options& o = state.options;
    BucketApplier applier(m, std::move(dest), o.apply_mode);
    ReceiveReport report;
    report.version = m.version;
    report.payload = m.payload.kind;
    report.buckets = m.buckets.size();
    auto fail = [&](const Error& e) -> Result<ReceiveReport> {
      set_text(me.error, sizeof me.error, e.what());
      me.state.store(kFailed);
      futex_bump_and_wake(h->doorbell);
      if (applier.touched()) {
        sink.discard(m.version, e);
        state.version.reset();
      }
      return std::unexpected(e);
    };
    const pid_t publisher = static_cast<pid_t>(h->publisher_pid.load());
    const std::function<Status()> alive = [&]() -> Status {
      if (h->session.load() != session) return make_error(ErrorCode::kCancelled, "publisher abandoned the version");
      if (!process_alive(publisher)) return make_error(ErrorCode::kUnavailable, "publisher process died");
      return ok();
    };
    const Mode mode = applier.direct() && h->table_offset != 0 ? static_cast<Mode>(h->mode.load()) : kModeSlots;
    report.path = mode == kModeDirectRead ? "shm direct read" : mode == kModeRing ? "shm ring" : "shm slots";
    const DirectTable table = mode != kModeSlots ? DirectTable::at(seg_->at(h->table_offset)) : DirectTable{};
    std::uint64_t ring_pos = 0;
    for (std::size_t i = 0; i < m.buckets.size(); ++i) {
      if (tap_) tap_->before(m.version, i);
      const Deadline bd = std::min(deadline, Clock::now() + o.bucket_timeout);
      std::uint64_t wire = 0;
      Status st;
      if (mode == kModeDirectRead)
        st = read_direct(h, table, i, applier, publisher, session, bd, alive, wire);
      else if (mode == kModeRing)
        st = read_ring(h, table, i, applier, ring_pos, bd, alive, wire);
      else if (applier.direct())
        st = read_slot_in_place(h, i, applier, bd, alive, wire);
      else
        st = read_slot(h, i, applier, bd, alive, wire);
      if (!st) return fail(bucket_error(m, i, publisher, st.error()));
      report.wire_bytes += wire;
      me.consumed.store(i + 1, std::memory_order_release);
      futex_bump_and_wake(h->doorbell);
    }
    if (auto f = applier.finish(); !f) return fail(f.error());
    if (auto c = sink.commit(m.version); !c) return fail(c.error());
    state.version = m.version;
    state.specs = m.tensors;
    me.state.store(kApplied);
    futex_bump_and_wake(h->doorbell);
    return report;
  }

  // Slots path, in place (`full`): copies bucket i out of slot i%2 chunk by chunk as soon as the
  // publisher marks it filled, hashing each piece, then checks the checksum once it is sealed.
  Status read_slot_in_place(Header* h, std::size_t i, BucketApplier& applier, Deadline bd,
                            const std::function<Status()>& alive, std::uint64_t& wire) {
    const int k = static_cast<int>(i % 2);
    auto& slot = h->slots[k];
    const std::string what = "bucket " + std::to_string(i);
    ARLO_TRY(wait_for(
        h, bd, [&] { return slot.index.load(std::memory_order_acquire) == i; }, alive, what));
    auto dst = applier.direct_spans(i);
    applier.mark_touched();
    XXH3_state_t hs;
    XXH3_64bits_reset(&hs);
    std::size_t span = 0, span_off = 0;
    std::uint64_t off = 0;
    const std::uint64_t total = slot.wire_bytes;
    const std::byte* src = seg_->slot(k);
    while (off < total) {
      std::uint64_t filled = 0;
      ARLO_TRY(wait_for(
          h, bd, [&] { return (filled = slot.filled.load(std::memory_order_acquire)) > off; }, alive, what));
      while (off < filled) {
        const std::size_t n = std::min<std::uint64_t>({filled - off, dst[span].size() - span_off, kPiece});
        XXH3_64bits_update(&hs, src + off, n);
        std::memcpy(dst[span].data() + span_off, src + off, n);
        off += n;
        span_off += n;
        if (span_off == dst[span].size()) {
          ++span;
          span_off = 0;
        }
      }
    }
    ARLO_TRY(wait_for(
        h, bd, [&] { return slot.sealed.load(std::memory_order_acquire) == 1; }, alive, what));
    if (XXH3_64bits_digest(&hs) != slot.checksum)
      return make_error(ErrorCode::kMismatch,
                        "bucket " + std::to_string(i) + ": checksum mismatch (corrupted in transit)");
    applier.mark_direct_verified(i);
    wire = total;
    return ok();
  }

  // Slots path, anything else (encoded payloads, staging): waits until bucket i is sealed in slot
  // i%2, then hands its bytes to the applier (which verifies them).
  Status read_slot(Header* h, std::size_t i, BucketApplier& applier, Deadline bd, const std::function<Status()>& alive,
                   std::uint64_t& wire) {
    const int k = static_cast<int>(i % 2);
    auto& slot = h->slots[k];
    ARLO_TRY(wait_for(
        h, bd, [&] { return slot.index.load(std::memory_order_acquire) == i && slot.sealed.load() == 1; }, alive,
        "bucket " + std::to_string(i)));
    const std::span<const std::byte> bytes(seg_->slot(k), slot.wire_bytes);
    ARLO_TRY(applier.accept(i, bytes, slot.checksum));
    wire = bytes.size();
    return ok();
  }

  // How a bucket that could not be taken is reported. A wait that ended (timeout; the publisher
  // moved on or died, whose segment is then unlinked) names the bucket and says the previous
  // version is kept; bytes, a table or a payload that do not verify name the version.
  Error bucket_error(const Manifest& m, std::size_t i, pid_t publisher, const Error& e) {
    const ErrorCode code = e.code();
    if (code == ErrorCode::kTimeout || code == ErrorCode::kCancelled || code == ErrorCode::kUnavailable) {
      if (code == ErrorCode::kUnavailable) seg_->unlink_if_same();
      return Error(code, "shm " + name_ + ": version " + std::to_string(m.version) + ", bucket " + std::to_string(i) +
                             ", peer publisher pid " + std::to_string(publisher) + ": " + e.message() +
                             "; previous version kept");
    }
    return Error(code, "shm " + name_ + ": version " + std::to_string(m.version) + ", peer publisher pid " +
                           std::to_string(publisher) + ": " + e.what());
  }

  std::string name_;
  bool direct_read_;
  std::shared_ptr<BucketTap> tap_;
  std::string peer_name_;
  std::unique_ptr<Segment> seg_;
  int slot_ = -1;
  pid_t probed_pid_ = 0;   // publisher whose memory was probed
  bool probe_ok_ = false;  // whether direct reads from it work
};

}  // namespace

std::unique_ptr<ReceiverTransport> make_receiver(const ReceiverState& s) { return std::make_unique<ShmReceiver>(s); }

}  // namespace arlo::weight_sync::shm
