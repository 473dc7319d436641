// shm transport: one POSIX shared-memory segment per channel ("/arlo-ws-<shm_name>") holding a
// control header, the manifest, and two bucket slots. The publisher encodes bucket i into slot i%2
// while receivers verify and apply bucket i-1 from the other slot (double buffering).
//
// Synchronisation: atomics in the segment plus a futex "doorbell" every state change bumps; every
// wait is bounded (bucket_timeout, the call deadline) and polls the peer's pid, so a dead peer is
// noticed within milliseconds. Cleanup: the publisher unlinks the name when it is destroyed; if it
// died, the first receiver (or next publisher) that notices its pid is gone unlinks it; dead
// receivers' slots are reclaimed by the publisher.
//
// Session protocol per publish: phase kJoining (manifest written; receivers check it against their
// sink and answer accepted / refused / need_full), the publisher admits the accepted receivers and
// moves to kStreaming, then kDone once every admitted receiver applied or failed. publish(v,
// deadline) waits until `deadline` for the first answer, then at most min(bucket_timeout,
// Options::gather_window) for the other expected receivers; one that does not come holds nobody (it joins a later session).
// Once receivers came the session runs under Options::timeout even if `deadline` is nearer, so a
// caller may poll for receivers with short deadlines. A receiver that holds v already sits out v.
//
// Three data paths, chosen per session (Header::mode) and logged by the publisher when it changes:
//  - ring (default for in_place `full` when every admitted receiver applies in place): the publisher
//    copies 128 KiB pieces of the source into a 16 MiB ring (it stays in the shared L3 cache),
//    hashing each piece first; receivers take pieces out as they arrive, hash them and write them to
//    the sink with non-temporal stores. Both sides copy concurrently; memory traffic is that of one
//    memcpy. The publisher posts each bucket's xxh3 in a table next to the manifest once its last
//    piece is in; receivers check every bucket against it before it counts.
//  - direct read (same, with Options::shm_direct_read and every receiver permitted): the table also
//    lists the publisher's source addresses per bucket; receivers copy straight from the
//    publisher's memory with process_vm_readv, hashing each piece while it is hot, and check it
//    against the checksum the publisher computes once per bucket in parallel. Permission is probed
//    at join time (a word of known value in the publisher); a refusal selects the ring.
//  - slots (encoded payloads, staging receivers): the publisher copies or encodes bucket i into
//    slot i%2 and receivers copy it out, double-buffered.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cerrno>
#include <cstring>
#include <functional>
#include <new>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif
#include <thread>

#include "common/log.h"
#include "weight_sync/codec.h"
#include "weight_sync/transport.h"
#include "weight_sync/transports/proc_util.h"
#include "weight_sync/xxh.h"

namespace arlo::weight_sync {
namespace {

using detail::futex_bump_and_wake;
using detail::futex_wait;
using detail::process_alive;

constexpr std::uint64_t kMagic = 0x324d48534f4c5241ull;  // "ARLOSHM2"
constexpr int kMaxReaders = 16;
constexpr std::uint64_t kNoBucket = ~0ull;
constexpr auto kPoll = std::chrono::milliseconds(10);

enum ReaderState : std::uint32_t { kIdle = 0, kAccepted, kRefused, kNeedFull, kApplied, kFailed };
enum Phase : std::uint32_t { kNone = 0, kJoining, kStreaming, kDone };
// Data path of a session (Header::mode).
enum Mode : std::uint32_t { kModeSlots = 0, kModeRing, kModeDirectRead };
// Receiver capabilities (ReaderSlot::caps): it applies `full` bytes straight into its sink (in
// place), and it may read the publisher's memory (process_vm_readv).
constexpr std::uint32_t kCapInPlace = 1, kCapRead = 2;

struct alignas(64) ReaderSlot {
  std::atomic<std::uint32_t> pid;
  std::atomic<std::uint32_t> state;
  std::atomic<std::uint64_t> session;   // last session this reader answered
  std::atomic<std::uint64_t> admitted;  // session the publisher admitted it to
  std::atomic<std::uint64_t> consumed;  // buckets of `session` it is done with
  std::atomic<std::uint32_t> caps;           // its answer: kCapInPlace | kCapRead
  std::atomic<std::uint64_t> ring_consumed;  // ring mode: stream bytes it has taken out of the ring
  std::atomic<std::uint64_t> ring_data_want; // ring mode: asleep until ring_filled reaches this (0: awake)
  char name[64];
  char error[448];
};

// A slot is filled progressively for plain `full` buckets: `filled` grows chunk by chunk so an
// in-place receiver copies while the publisher is still writing; `sealed` says the checksum is final.
struct alignas(64) SlotHeader {
  std::atomic<std::uint64_t> index;
  std::uint64_t wire_bytes;
  std::uint64_t checksum;
  std::atomic<std::uint64_t> filled;
  std::atomic<std::uint32_t> sealed;
};

constexpr std::uint64_t kStreamChunk = 1u << 20;  // published granularity
constexpr std::uint64_t kPiece = 128u << 10;       // hash-then-copy granularity (stays in L2)
constexpr std::uint64_t kDirectPiece = 256u << 10; // direct read: one process_vm_readv, then hashed in L2
constexpr std::uint64_t kRingBytes = 16u << 20;     // ring mode: stays in the shared L3 cache
constexpr std::uint64_t kRingBatch = 1u << 20;      // ring mode: a sleeping side is woken per this much

struct Header {
  std::uint64_t magic;
  std::uint64_t total_size;
  std::uint64_t manifest_offset;
  std::uint64_t manifest_capacity;
  std::uint64_t slot_offset[2];
  std::uint64_t slot_capacity;
  std::atomic<std::uint32_t> publisher_pid;
  std::atomic<std::uint32_t> retired;
  std::atomic<std::uint32_t> doorbell;
  std::atomic<std::uint32_t> phase;
  std::atomic<std::uint64_t> session;
  std::atomic<std::uint64_t> manifest_len;
  std::atomic<std::uint64_t> published;
  std::atomic<std::uint32_t> mode;    // Mode of this session
  std::atomic<std::uint64_t> hashed;  // ring / direct: leading buckets whose checksum is in the table
  std::atomic<std::uint64_t> ring_filled;  // ring: stream bytes the publisher has put in the ring
  std::uint64_t ring_bytes;                // ring: size (in slot 0)
  std::atomic<std::uint64_t> ring_room_want;  // ring: publisher asleep until every receiver consumed this (0: awake)
  std::uint64_t table_offset;         // direct: segment offset of the session's DirectTable (0: none)
  std::uint64_t probe_addr;           // publisher address of a word holding kMagic (read-permission probe)
  SlotHeader slots[2];
  ReaderSlot readers[kMaxReaders];
};

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

// Direct-read table, placed after the manifest text: where each bucket's bytes live in the
// publisher (source order), and the publisher's checksum per bucket once `Header::hashed` covers it.
//   u64 buckets, u64 parts, u64 first[buckets + 1], RemotePart part[parts], u64 checksum[buckets]
struct RemotePart {
  std::uint64_t addr;
  std::uint64_t len;
};
struct DirectTable {
  std::uint64_t* head = nullptr;
  std::uint64_t* first = nullptr;
  RemotePart* parts = nullptr;
  std::uint64_t* checksums = nullptr;

  static std::uint64_t bytes(std::uint64_t buckets, std::uint64_t parts) {
    return 16 + 8 * (buckets + 1) + 16 * parts + 8 * buckets;
  }
  static DirectTable at(std::byte* p) {
    DirectTable t;
    t.head = reinterpret_cast<std::uint64_t*>(p);
    t.first = t.head + 2;
    t.parts = reinterpret_cast<RemotePart*>(t.first + t.head[0] + 1);
    t.checksums = reinterpret_cast<std::uint64_t*>(t.parts + t.head[1]);
    return t;
  }
};

std::string segment_name(const std::string& channel) {
  std::string out = "/arlo-ws-";
  for (char c : channel) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') ? c : '_';
  return out;
}

void set_text(char* dst, std::size_t cap, const std::string& text) {
  const std::size_t n = std::min(cap - 1, text.size());
  std::memcpy(dst, text.data(), n);
  dst[n] = 0;
}

std::string get_text(const char* src, std::size_t cap) { return std::string(src, strnlen(src, cap)); }

// A mapping of one segment. The creator owns the name and unlinks it on destruction.
class Segment {
 public:
  static Result<std::unique_ptr<Segment>> create(const std::string& name, std::uint64_t manifest_cap,
                                                 std::uint64_t slot_cap) {
    // A leftover from a dead publisher is removed; a live one is a configuration error.
    if (auto old = open(name)) {
      const pid_t owner = static_cast<pid_t>((*old)->h->publisher_pid.load());
      if (owner != ::getpid() && process_alive(owner) && !(*old)->h->retired.load())
        return make_error(ErrorCode::kUnavailable, "shm segment " + name + " is in use by publisher pid " +
                                                       std::to_string(owner) + "; pick another weight_sync.shm_name");
      (*old)->unlink_if_same();
    }
    auto s = std::unique_ptr<Segment>(new Segment());
    s->name_ = name;
    s->owner_ = true;
    const std::uint64_t moff = align_up(sizeof(Header), 4096);
    const std::uint64_t s0 = align_up(moff + manifest_cap, 4096);
    const std::uint64_t s1 = align_up(s0 + slot_cap, 4096);
    const std::uint64_t total = align_up(s1 + slot_cap, 4096);
    s->fd_ = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (s->fd_ < 0) return make_error(ErrorCode::kIo, "shm_open " + name + ": " + std::strerror(errno));
    if (::ftruncate(s->fd_, static_cast<off_t>(total)) != 0) {
      ::shm_unlink(name.c_str());
      return make_error(ErrorCode::kResourceExhausted, "ftruncate " + name + " to " + std::to_string(total) +
                                                           " bytes: " + std::strerror(errno));
    }
    ARLO_TRY(s->map(total));
    Header* h = new (s->base_) Header();
    h->total_size = total;
    h->manifest_offset = moff;
    h->manifest_capacity = manifest_cap;
    h->slot_offset[0] = s0;
    h->slot_offset[1] = s1;
    h->slot_capacity = slot_cap;
    h->publisher_pid = static_cast<std::uint32_t>(::getpid());
    h->slots[0].index = kNoBucket;
    h->slots[1].index = kNoBucket;
    std::atomic_thread_fence(std::memory_order_release);
    reinterpret_cast<std::atomic<std::uint64_t>*>(&h->magic)->store(kMagic, std::memory_order_release);
    s->h = h;
    return s;
  }

  static Result<std::unique_ptr<Segment>> open(const std::string& name) {
    auto s = std::unique_ptr<Segment>(new Segment());
    s->name_ = name;
    s->fd_ = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
    if (s->fd_ < 0) return make_error(ErrorCode::kNotFound, "shm segment " + name + " does not exist (yet)");
    struct stat st{};
    ::fstat(s->fd_, &st);
    if (static_cast<std::uint64_t>(st.st_size) < sizeof(Header))
      return make_error(ErrorCode::kUnavailable, "shm segment " + name + " is being created");
    ARLO_TRY(s->map(static_cast<std::uint64_t>(st.st_size)));
    s->h = reinterpret_cast<Header*>(s->base_);
    if (reinterpret_cast<std::atomic<std::uint64_t>*>(&s->h->magic)->load(std::memory_order_acquire) != kMagic ||
        s->h->total_size != static_cast<std::uint64_t>(st.st_size))
      return make_error(ErrorCode::kUnavailable, "shm segment " + name + " is being created");
    return s;
  }

  ~Segment() {
    if (owner_ && h) {
      h->retired.store(1);
      futex_bump_and_wake(h->doorbell);
      unlink_if_same();
    }
    if (base_) ::munmap(base_, size_);
    if (fd_ >= 0) ::close(fd_);
  }

  // Unlinks the name if it still refers to this segment (not a newer one with the same name).
  void unlink_if_same() {
    int fd = ::shm_open(name_.c_str(), O_RDONLY | O_CLOEXEC, 0600);
    if (fd < 0) return;
    struct stat a{}, b{};
    ::fstat(fd, &a);
    ::fstat(fd_, &b);
    ::close(fd);
    if (a.st_ino == b.st_ino && a.st_dev == b.st_dev) ::shm_unlink(name_.c_str());
  }

  std::byte* manifest() { return base_ + h->manifest_offset; }
  std::byte* at(std::uint64_t offset) { return base_ + offset; }
  std::byte* slot(int k) { return base_ + h->slot_offset[k]; }

  Header* h = nullptr;

 private:
  Segment() = default;
  Status map(std::uint64_t size) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) return make_error(ErrorCode::kIo, "mmap " + name_ + ": " + std::strerror(errno));
    base_ = static_cast<std::byte*>(p);
    size_ = size;
    return ok();
  }
  std::string name_;
  int fd_ = -1;
  std::byte* base_ = nullptr;
  std::uint64_t size_ = 0;
  bool owner_ = false;
};

// Waits on the doorbell until `done()` is true; `check()` returning an error aborts the wait.
template <typename Done, typename Check>
Status wait_for(Header* h, Deadline deadline, Done done, Check check, const std::string& what) {
  while (true) {
    const std::uint32_t seen = h->doorbell.load(std::memory_order_acquire);
    if (done()) return ok();
    if (auto s = check(); !s) return s;
    const auto now = Clock::now();
    if (now >= deadline) return make_error(ErrorCode::kTimeout, "timed out waiting for " + what);
    futex_wait(h->doorbell, seen,
               std::chrono::duration_cast<std::chrono::microseconds>(std::min<Clock::duration>(kPoll, deadline - now)));
  }
}

// Copies n bytes to `dst` with non-temporal stores where the CPU has them: the sink is written once
// and not read again soon, so it need not be fetched into the cache first (saves a third of the
// memory traffic of a copy).
void stream_copy(std::byte* dst, const std::byte* src, std::size_t n) {
#if defined(__x86_64__)
  std::size_t head = (16 - (reinterpret_cast<std::uintptr_t>(dst) & 15)) & 15;
  if (head > n) head = n;
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  std::size_t k = 0;
  for (; k + 64 <= n; k += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + k), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + k + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + k + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + k + 48), d);
  }
  std::memcpy(dst + k, src + k, n - k);
  _mm_sfence();
#else
  std::memcpy(dst, src, n);
#endif
}

// Ring hand-over wait: spins briefly (the peer is usually a few microseconds from making room or
// data), then publishes `want_value` in `want` (the position at which the peer should wake it, so
// the peer rings the doorbell once per batch instead of once per piece) and waits on the doorbell
// like wait_for. `check` runs at most every kPoll. The peer stores its position, then reads `want`
// (both sequentially consistent, as here), so either it sees `want` or this side sees the position.
template <typename Done>
Status ring_wait(Header* h, Deadline deadline, Done done, std::atomic<std::uint64_t>& want, std::uint64_t want_value,
                 const std::function<Status()>& check, const std::string& what) {
  const auto spin_until = Clock::now() + std::chrono::microseconds(30);
  do {
    if (done()) return ok();
#if defined(__x86_64__)
    _mm_pause();
#endif
  } while (Clock::now() < spin_until);
  want.store(want_value);
  auto next_check = Clock::now();
  Status st = wait_for(h, deadline, done,
                       [&]() -> Status {
                         const auto now = Clock::now();
                         if (now < next_check) return ok();
                         next_check = now + kPoll;
                         return check();
                       },
                       what);
  want.store(0);
  return st;
}

class ShmSender final : public SenderTransport {
 public:
  explicit ShmSender(const SenderState& s)
      : channel_(s.params.at("shm_name").get<std::string>().empty() ? "arlo-weights-" + std::to_string(::getpid())
                                                                     : s.params.at("shm_name").get<std::string>()),
        name_(segment_name(channel_)),
        expected_(s.options.expected_receivers),
        direct_read_(s.params.at("direct_read").get<bool>()),
        faults_(s.faults),
        probe_(std::make_unique<std::uint64_t>(kMagic)) {
    if (direct_read_) ARLO_INFO("weight_sync shm {}: direct reads by receivers: {}", name_, detail::allow_same_user_readers());
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
  Status ensure_segment(std::uint64_t manifest_len, std::uint64_t slot_cap) {
    if (seg_ && seg_->h->manifest_capacity >= manifest_len && seg_->h->slot_capacity >= slot_cap) return ok();
    seg_.reset();  // retire the smaller one (receivers reopen by name)
    ARLO_ASSIGN_OR_RETURN(seg_, Segment::create(name_, std::max<std::uint64_t>(manifest_len * 2, 1 << 20), slot_cap));
    return ok();
  }

  Result<PublishReport> run_session(const Manifest& m, const WeightSource& source, SenderState& state,
                                    Deadline deadline, bool& need_full) {
    const Options& o = state.options;
    ARLO_ASSIGN_OR_RETURN(auto enc, BucketEncoder::create(m, source, state.base.get()));
    const std::string text = m.dump();
    const std::uint64_t slot_cap = std::max<std::uint64_t>({enc.max_capacity(), m.max_bucket_bytes(), 4096});
    // Payloads sent as the source's own bytes can go through the ring or be read directly: list
    // where they live (the table also carries the per-bucket checksums).
    const bool offer_direct = enc.zero_copy();
    std::vector<std::vector<std::span<const std::byte>>> bucket_parts;
    std::uint64_t nparts = 0;
    if (offer_direct) {
      for (std::size_t i = 0; i < m.buckets.size(); ++i) {
        ARLO_ASSIGN_OR_RETURN(auto b, enc.encode(i, {}, /*with_checksum=*/false));
        nparts += b.parts.size();
        bucket_parts.push_back(std::move(b.parts));
      }
    }
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

    // Join: wait until `deadline` for the first answer, then at most the gather window for the other
    // expected receivers. One that does not come holds nobody: it joins a later session.
    auto answered = [&] {
      std::size_t n = 0;
      for (auto& r : h->readers)
        if (r.pid.load() != 0 && r.session.load() == session && r.state.load() != kIdle) ++n;
      return n;
    };
    (void)wait_for(h, deadline, [&] { return answered() >= 1; }, [] { return ok(); }, "a receiver to join");
    if (answered() >= 1) {
      const auto window = std::min(o.bucket_timeout, o.gather_window);
      (void)wait_for(h, Clock::now() + window, [&] { return answered() >= expected_; }, [] { return ok(); },
                     "receivers to join");
      // Receivers came: the transfer has the whole version timeout, however briefly we waited for them.
      deadline = std::max(deadline, Clock::now() + o.timeout);
    }

    PublishReport report;
    report.version = m.version;
    report.payload = m.payload.kind;
    report.raw_bytes = m.total_bytes;
    report.buckets = m.buckets.size();
    std::vector<int> active;
    std::vector<std::size_t> peer_of(kMaxReaders, 0);
    for (int k = 0; k < kMaxReaders; ++k) {
      auto& r = h->readers[k];
      if (r.pid.load() == 0 || r.session.load() != session) continue;
      const std::string peer = get_text(r.name, sizeof r.name);
      const auto st = r.state.load();
      if (st == kAccepted) {
        peer_of[k] = report.peers.size();
        report.peers.push_back({peer, false, "", 0});
        active.push_back(k);
      } else if (st == kNeedFull) {
        need_full = true;
        report.peers.push_back({peer, false, "holds another base version; needs a full resync", 0});
      } else if (st == kRefused) {
        report.peers.push_back({peer, false, "refused the manifest: " + get_text(r.error, sizeof r.error), 0});
      }
    }
    if (need_full && m.payload.kind == PayloadKind::kDelta) {
      h->phase.store(kDone);
      futex_bump_and_wake(h->doorbell);
      return report;  // caller restarts in full
    }
    if (active.empty()) {
      h->phase.store(kDone);
      futex_bump_and_wake(h->doorbell);
      if (report.peers.empty())
        return make_error(ErrorCode::kUnavailable, "shm " + name_ + ": no receiver joined version " +
                                                       std::to_string(m.version) + " before the deadline");
      return report;
    }
    // Path for this session (the same for every admitted receiver):
    //   ring: `full` bytes, every receiver applies in place: chunks pass through a small ring that
    //         stays in the shared cache, publisher and receivers copying at the same time;
    //   direct read: as ring, and shm_direct_read asks receivers to pull from this process's memory;
    //   slots: anything else (encoded payloads, staging receivers).
    std::string why_slots;
    if (!enc.zero_copy())
      why_slots = "payload " + std::string(to_string(m.payload.kind)) + (m.payload.zstd ? "+zstd" : "") + " is encoded";
    bool all_read = direct_read_;
    for (int k : active) {
      const auto caps = h->readers[k].caps.load();
      if (why_slots.empty() && !(caps & kCapInPlace))
        why_slots = get_text(h->readers[k].name, sizeof h->readers[k].name) + " applies in staging mode";
      if (!(caps & kCapRead)) all_read = false;
    }
    const Mode mode = !why_slots.empty() ? kModeSlots : all_read ? kModeDirectRead : kModeRing;
    const bool use_direct = mode == kModeDirectRead;
    const std::string path = mode == kModeSlots ? "slots (" + why_slots + ")" : mode == kModeRing ? "ring" : "direct read";
    if (path != last_path_) {
      ARLO_INFO("weight_sync shm {}: version {}: {}", name_, m.version,
                mode == kModeDirectRead ? std::string("receivers copy straight from this process's memory (process_vm_readv)")
                : mode == kModeRing     ? "buckets stream through a " + std::to_string(h->ring_bytes >> 20) +
                                              " MiB ring (publisher and receivers copy concurrently)"
                                        : "buckets are copied through the shared bucket slots: " + why_slots);
      last_path_ = path;
    }
    h->mode.store(mode);
    for (int k : active) h->readers[k].admitted.store(session);
    h->phase.store(kStreaming, std::memory_order_release);
    futex_bump_and_wake(h->doorbell);

    auto drop = [&](int k, const std::string& why) {
      report.peers[peer_of[k]].error = why;
      active.erase(std::find(active.begin(), active.end(), k));
    };
    // Drops receivers that died or failed; used inside every wait.
    auto prune = [&](std::size_t bucket) {
      for (int k : std::vector<int>(active)) {
        auto& r = h->readers[k];
        const auto state = r.state.load();
        if (state == kApplied) continue;  // done; it may exit right away
        if (state == kFailed) drop(k, get_text(r.error, sizeof r.error));
        else if (!process_alive(static_cast<pid_t>(r.pid.load())))
          drop(k, "receiver process died during bucket " + std::to_string(bucket));
      }
    };

    // Direct: receivers pull on their own; the publisher only posts each bucket's checksum, hashing
    // the source once while they copy.
    for (std::size_t i = 0; use_direct && i < m.buckets.size() && !active.empty(); ++i) {
      if (faults_.stop_before_bucket && *faults_.stop_before_bucket == i) ::raise(SIGSTOP);
      std::uint64_t checksum = xxh3(bucket_parts[i]);
      if (faults_.corrupt_bucket && *faults_.corrupt_bucket == i && !fault_done_) {
        // Fault injection: receivers read the true bytes, so announce a checksum that they do not
        // match (the effect of one flipped byte in transit).
        checksum ^= 0x5A;
        fault_done_ = true;
      }
      table.checksums[i] = checksum;
      h->hashed.store(i + 1, std::memory_order_release);
      futex_bump_and_wake(h->doorbell);
      for (const auto& part : bucket_parts[i]) report.wire_bytes += part.size();
    }
    if (mode == kModeRing) report.wire_bytes += stream_ring(m, bucket_parts, table, active, drop, prune, deadline, o);
    for (std::size_t i = 0; mode == kModeSlots && i < m.buckets.size() && !active.empty(); ++i) {
      const int s = static_cast<int>(i % 2);
      if (i >= 2) {
        const Deadline bd = std::min(deadline, Clock::now() + o.bucket_timeout);
        auto st = wait_for(
            h, bd,
            [&] {
              for (int k : active)
                if (h->readers[k].consumed.load(std::memory_order_acquire) < i - 1 &&
                    h->readers[k].state.load() != kFailed)
                  return false;
              return true;
            },
            [&] { prune(i - 2); return ok(); }, "bucket " + std::to_string(i - 2));
        prune(i - 2);
        if (!st)
          for (int k : std::vector<int>(active))
            if (h->readers[k].consumed.load() < i - 1)
              drop(k, "timed out consuming bucket " + std::to_string(i - 2));
        if (active.empty()) break;
      }
      if (faults_.stop_before_bucket && *faults_.stop_before_bucket == i) ::raise(SIGSTOP);
      std::byte* dst = seg_->slot(s);
      std::uint64_t wire = 0, checksum = 0;
      const bool corrupt = faults_.corrupt_bucket && *faults_.corrupt_bucket == i && !fault_done_;
      auto& slot = h->slots[s];
      if (enc.zero_copy()) {
        // Streamed: announce the bucket, then publish it chunk by chunk (copied and hashed while hot).
        ARLO_ASSIGN_OR_RETURN(auto b, enc.encode(i, {}, /*with_checksum=*/false));
        wire = b.wire_bytes;
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
              const std::size_t k = std::min<std::size_t>(kPiece, n - q);
              XXH3_64bits_update(&st, part.data() + p + q, k);
              std::memcpy(dst + off + q, part.data() + p + q, k);
            }
            if (corrupt && wire / 2 >= off && wire / 2 < off + n) {
              dst[wire / 2] ^= std::byte{0x5A};
              fault_done_ = true;
            }
            off += n;
            slot.filled.store(off, std::memory_order_release);
            futex_bump_and_wake(h->doorbell);
          }
        }
        checksum = XXH3_64bits_digest(&st);
      } else {
        ARLO_ASSIGN_OR_RETURN(auto b, enc.encode(i, {dst, h->slot_capacity}));
        checksum = b.checksum;
        wire = b.wire_bytes;
        if (corrupt && wire > 0) {
          dst[wire / 2] ^= std::byte{0x5A};
          fault_done_ = true;
        }
        slot.sealed.store(0);
        slot.wire_bytes = wire;
        slot.filled.store(wire);
        slot.index.store(i, std::memory_order_release);
      }
      slot.checksum = checksum;
      slot.sealed.store(1, std::memory_order_release);
      h->published.store(i + 1, std::memory_order_release);
      futex_bump_and_wake(h->doorbell);
      report.wire_bytes += wire;
    }

    // Wait for every admitted receiver to apply or fail; one that makes no progress for a bucket
    // timeout is dropped (direct reads have no slot hand-over to bound them otherwise).
    std::vector<std::uint64_t> seen(kMaxReaders, ~0ull);
    Clock::time_point progress_at = Clock::now();
    while (true) {
      const Deadline step = std::min(deadline, progress_at + o.bucket_timeout);
      auto st = wait_for(
          h, step,
          [&] {
            bool moved = false;
            for (int k : active) {
              const auto c = h->readers[k].consumed.load();
              if (c != seen[k]) moved = true, seen[k] = c;
            }
            if (moved) progress_at = Clock::now();
            for (int k : active)
              if (h->readers[k].state.load() != kApplied && h->readers[k].state.load() != kFailed) return false;
            return true;
          },
          [&] { prune(m.buckets.size()); return ok(); }, "receivers to apply");
      if (st || Clock::now() >= deadline) break;
      if (Clock::now() >= progress_at + o.bucket_timeout) {
        for (int k : std::vector<int>(active)) {
          const auto state = h->readers[k].state.load();
          if (state != kApplied && state != kFailed)
            drop(k, "made no progress for " + std::to_string(o.bucket_timeout.count()) + " ms at bucket " +
                        std::to_string(h->readers[k].consumed.load()));
        }
        break;
      }
    }
    for (int k : active) {
      auto& r = h->readers[k];
      auto& p = report.peers[peer_of[k]];
      if (r.state.load() == kApplied) {
        p.ok = true;
        p.wire_bytes = report.wire_bytes;
      } else if (r.state.load() == kFailed) {
        p.error = get_text(r.error, sizeof r.error);
      } else {
        p.error = "did not apply before the publish deadline";
      }
    }
    h->phase.store(kDone);
    futex_bump_and_wake(h->doorbell);
    return report;
  }

  // Ring mode: copies every bucket's bytes through the ring in slot 0, hashing each piece while it
  // is hot, posting each bucket's checksum in the table. A receiver that does not make room within
  // a bucket timeout is dropped. Returns the bytes streamed.
  template <typename Drop, typename Prune>
  std::uint64_t stream_ring(const Manifest& m, const std::vector<std::vector<std::span<const std::byte>>>& bucket_parts,
                            const DirectTable& table, std::vector<int>& active, Drop& drop, Prune& prune,
                            Deadline deadline, const Options& o) {
    Header* h = seg_->h;
    std::byte* ring = seg_->slot(0);
    const std::uint64_t ring_size = h->ring_bytes;
    std::uint64_t pos = 0;
    for (std::size_t i = 0; i < m.buckets.size() && !active.empty(); ++i) {
      if (faults_.stop_before_bucket && *faults_.stop_before_bucket == i) ::raise(SIGSTOP);
      const Deadline bd = std::min(deadline, Clock::now() + o.bucket_timeout);
      const bool corrupt = faults_.corrupt_bucket && *faults_.corrupt_bucket == i && !fault_done_;
      XXH3_state_t st;
      XXH3_64bits_reset(&st);
      std::uint64_t bucket_bytes = 0;
      for (const auto& part : bucket_parts[i]) bucket_bytes += part.size();
      const std::uint64_t bucket_start = pos;
      for (const auto& part : bucket_parts[i]) {
        for (std::size_t off = 0; off < part.size() && !active.empty();) {
          const std::uint64_t n = std::min<std::uint64_t>({kPiece, part.size() - off, ring_size - pos % ring_size});
          auto room = [&] {
            for (int k : active)
              if (h->readers[k].ring_consumed.load() + ring_size < pos + n && h->readers[k].state.load() != kFailed)
                return false;
            return true;
          };
          const std::uint64_t want = std::min(pos, pos + n + kRingBatch - ring_size);
          auto st_room = ring_wait(h, bd, room, h->ring_room_want, want, [&]() -> Status { prune(i); return ok(); },
                                   "ring room");
          if (!st_room)
            for (int k : std::vector<int>(active))
              if (h->readers[k].ring_consumed.load() + ring_size < pos + n)
                drop(k, "timed out consuming bucket " + std::to_string(i));
          if (active.empty()) break;
          std::byte* dst = ring + pos % ring_size;
          XXH3_64bits_update(&st, part.data() + off, n);
          std::memcpy(dst, part.data() + off, n);
          if (corrupt && bucket_start + bucket_bytes / 2 >= pos && bucket_start + bucket_bytes / 2 < pos + n) {
            dst[bucket_start + bucket_bytes / 2 - pos] ^= std::byte{0x5A};  // fault injection, after hashing
            fault_done_ = true;
          }
          pos += n;
          off += n;
          h->ring_filled.store(pos);
          bool wake = false;
          for (int k : active) {
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

  std::string channel_;  // the shm_name receivers give
  std::string name_;
  std::size_t expected_;
  bool direct_read_;
  Faults faults_;
  std::unique_ptr<Segment> seg_;
  bool fault_done_ = false;
  std::unique_ptr<std::uint64_t> probe_;  // kMagic at a stable address: receivers test read permission on it
  std::string last_path_;                 // path of the previous session (logged when it changes)
};

class ShmReceiver final : public ReceiverTransport {
 public:
  explicit ShmReceiver(const ReceiverState& s)
      : name_(segment_name(s.params.at("shm_name").get<std::string>())),
        direct_read_(s.params.at("direct_read").get<bool>()),
        faults_(s.faults),
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
        return make_error(ErrorCode::kMismatch, "shm " + name_ + ": version " + std::to_string(m->version) + ": " +
                                                    bound.error().what());
      }
      if (m->payload.kind == PayloadKind::kDelta && (!state.version || !m->base_version || *state.version != *m->base_version)) {
        answer(kNeedFull, "");
        continue;  // the publisher restarts this version in full
      }
      dest = std::move(*bound);
      const bool in_place_full = state.options.apply_mode == ApplyMode::kInPlace &&
                                 m->payload.kind == PayloadKind::kFull && !m->payload.zstd;
      std::uint32_t caps = in_place_full ? kCapInPlace : 0;
      if (in_place_full && direct_read_ && can_read_publisher(h)) caps |= kCapRead;
      me.caps.store(caps);
      me.ring_consumed.store(0);
      me.ring_data_want.store(0);
      answer(kAccepted, "");
      // Admitted, or left out (joined too late): then wait for the next session.
      st = wait_for(
          h, deadline, [&] { return me.admitted.load() == session || h->session.load() != session || h->phase.load() != kJoining; },
          [] { return ok(); }, "admission");
      if (me.admitted.load() != session) continue;
      auto r = stream(*m, session, dest, sink, state, deadline);
      if (r) r->seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      return r;
    }
  }

 private:
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
      ARLO_WARN("weight_sync shm {}: cannot read publisher pid {}'s memory directly ({}); buckets will come through "
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
        ARLO_TRY(ring_wait(h, bd, [&] { return (filled = h->ring_filled.load()) > pos; }, me.ring_data_want,
                           std::min(pos + kRingBatch, bucket_end), alive, "bucket " + std::to_string(i)));
        const std::uint64_t n = std::min<std::uint64_t>({filled - pos, d.size() - off, ring_size - pos % ring_size, kPiece});
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
    ARLO_TRY(wait_for(h, bd, [&] { return h->hashed.load(std::memory_order_acquire) > i; }, alive,
                      "the checksum of bucket " + std::to_string(i)));
    if (XXH3_64bits_digest(&hs) != table.checksums[i])
      return make_error(ErrorCode::kMismatch, "bucket " + std::to_string(i) + ": checksum mismatch (corrupted in transit)");
    applier.mark_direct_verified(i);
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
      return make_error(ErrorCode::kParse, "bucket " + std::to_string(i) + ": direct-read table does not match the manifest");
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
        if (err == ESRCH || !process_alive(publisher)) return make_error(ErrorCode::kUnavailable, "publisher process died");
        return make_error(ErrorCode::kIo, "bucket " + std::to_string(i) + ": reading the publisher's memory: " + std::strerror(err));
      }
      XXH3_64bits_update(&hs, piece.data(), n);
      roff += n;
      loff += n;
      if (h->session.load(std::memory_order_relaxed) != session)
        return make_error(ErrorCode::kCancelled, "publisher abandoned the version");
      if (Clock::now() >= bd) return make_error(ErrorCode::kTimeout, "timed out reading bucket " + std::to_string(i));
    }
    ARLO_TRY(wait_for(h, bd, [&] { return h->hashed.load(std::memory_order_acquire) > i; }, alive,
                      "the checksum of bucket " + std::to_string(i)));
    if (XXH3_64bits_digest(&hs) != table.checksums[i])
      return make_error(ErrorCode::kMismatch, "bucket " + std::to_string(i) + ": checksum mismatch (corrupted in transit)");
    applier.mark_direct_verified(i);
    wire = need;
    return ok();
  }

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
    const bool direct_read = mode == kModeDirectRead;
    report.path = mode == kModeDirectRead ? "shm direct read" : mode == kModeRing ? "shm ring" : "shm slots";
    const DirectTable table = mode != kModeSlots ? DirectTable::at(seg_->at(h->table_offset)) : DirectTable{};
    std::uint64_t ring_pos = 0;
    for (std::size_t i = 0; i < m.buckets.size(); ++i) {
      if (faults_.stop_before_bucket && *faults_.stop_before_bucket == i) ::raise(SIGSTOP);
      const int s = static_cast<int>(i % 2);
      auto& slot = h->slots[s];
      const Deadline bd = std::min(deadline, Clock::now() + o.bucket_timeout);
      Status st;
      if (mode != kModeSlots) {
        std::uint64_t wire = 0;
        st = direct_read ? read_direct(h, table, i, applier, publisher, session, bd, alive, wire)
                         : read_ring(h, table, i, applier, ring_pos, bd, alive, wire);
        if (st) {
          report.wire_bytes += wire;
          me.consumed.store(i + 1, std::memory_order_release);
          futex_bump_and_wake(h->doorbell);
          continue;
        }
        if (st.error().code() == ErrorCode::kMismatch || st.error().code() == ErrorCode::kParse ||
            st.error().code() == ErrorCode::kIo)
          return fail(Error(st.error().code(), "shm " + name_ + ": version " + std::to_string(m.version) +
                                                   ", peer publisher pid " + std::to_string(publisher) + ": " +
                                                   st.error().what()));
      } else if (applier.direct()) {
        // Streamed in place: hash and copy each chunk as soon as the publisher marks it filled.
        st = wait_for(h, bd, [&] { return slot.index.load(std::memory_order_acquire) == i; }, alive,
                      "bucket " + std::to_string(i));
        if (st) {
          auto dst = applier.direct_spans(i);
          applier.mark_touched();
          XXH3_state_t hs;
          XXH3_64bits_reset(&hs);
          std::size_t span = 0, span_off = 0;
          std::uint64_t off = 0;
          const std::uint64_t wire = slot.wire_bytes;
          const std::byte* src = seg_->slot(s);
          while (st && off < wire) {
            std::uint64_t filled = 0;
            st = wait_for(h, bd, [&] { return (filled = slot.filled.load(std::memory_order_acquire)) > off; }, alive,
                          "bucket " + std::to_string(i));
            while (st && off < filled) {
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
          if (st) st = wait_for(h, bd, [&] { return slot.sealed.load(std::memory_order_acquire) == 1; }, alive,
                                "bucket " + std::to_string(i));
          if (st && XXH3_64bits_digest(&hs) != slot.checksum)
            st = make_error(ErrorCode::kMismatch, "bucket " + std::to_string(i) + ": checksum mismatch (corrupted in transit)");
          if (st) {
            applier.mark_direct_verified(i);
            report.wire_bytes += wire;
            me.consumed.store(i + 1, std::memory_order_release);
            futex_bump_and_wake(h->doorbell);
            continue;
          }
          if (st.error().code() == ErrorCode::kMismatch)
            return fail(Error(st.error().code(), "shm " + name_ + ": version " + std::to_string(m.version) +
                                                     ", peer publisher pid " + std::to_string(publisher) + ": " +
                                                     st.error().what()));
        }
      } else {
        st = wait_for(
            h, bd, [&] { return slot.index.load(std::memory_order_acquire) == i && slot.sealed.load() == 1; }, alive,
            "bucket " + std::to_string(i));
      }
      if (!st) {
        if (st.error().code() == ErrorCode::kUnavailable) seg_->unlink_if_same();
        return fail(Error(st.error().code(), "shm " + name_ + ": version " + std::to_string(m.version) + ", bucket " +
                                                 std::to_string(i) + ", peer publisher pid " +
                                                 std::to_string(publisher) + ": " + st.error().message() +
                                                 "; previous version kept"));
      }
      const std::span<const std::byte> wire(seg_->slot(s), h->slots[s].wire_bytes);
      if (auto a = applier.accept(i, wire, h->slots[s].checksum); !a)
        return fail(Error(a.error().code(), "shm " + name_ + ": version " + std::to_string(m.version) + ", peer publisher pid " +
                                                std::to_string(publisher) + ": " + a.error().what()));
      report.wire_bytes += wire.size();
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

 private:
  std::string name_;
  bool direct_read_;
  Faults faults_;
  std::string peer_name_;
  std::unique_ptr<Segment> seg_;
  int slot_ = -1;
  pid_t probed_pid_ = 0;   // publisher whose memory was probed
  bool probe_ok_ = false;  // whether direct reads from it work
};

}  // namespace

TransportDescriptor shm_transport() {
  TransportDescriptor d;
  d.name = "shm";
  d.doc = "a POSIX shared-memory segment on one host (streamed)";
  d.options = {
      string_option("shm_name", "",
                    "segment name (/dev/shm/arlo-ws-<name>); publisher default: arlo-weights-<its pid>, announced"),
      bool_option("direct_read", false,
                  "in-place full payload: receivers copy straight from the publisher's memory (process_vm_readv) "
                  "instead of through the shared ring")
          .user_key(),
  };
  d.sender = [](const SenderState& s) -> Result<std::unique_ptr<SenderTransport>> {
    return std::unique_ptr<SenderTransport>(new ShmSender(s));
  };
  d.receiver = [](const ReceiverState& s) -> Result<std::unique_ptr<ReceiverTransport>> {
    if (s.params.at("shm_name").get<std::string>().empty())
      return make_error(ErrorCode::kInvalidArgument, "weight_sync shm: a receiver needs 'shm_name' (the publisher announces it)");
    return std::unique_ptr<ReceiverTransport>(new ShmReceiver(s));
  };
  return d;
}

}  // namespace arlo::weight_sync
