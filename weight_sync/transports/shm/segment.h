#pragma once
// The shm transport's shared segment: its layout (control header, reader slots, bucket slots, the
// direct-read table), the mapping of one segment (Segment: create, open, unlink), and the waits
// on its futex doorbell that every step of the protocol uses. shm.cc describes the protocol.
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "common/result.h"
#include "weight_sync/transports/proc_util.h"
#include "weight_sync/types.h"

namespace arlo::weight_sync::shm {

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
  std::atomic<std::uint64_t> session;         // last session this reader answered
  std::atomic<std::uint64_t> admitted;        // session the publisher admitted it to
  std::atomic<std::uint64_t> consumed;        // buckets of `session` it is done with
  std::atomic<std::uint32_t> caps;            // its answer: kCapInPlace | kCapRead
  std::atomic<std::uint64_t> ring_consumed;   // ring mode: stream bytes it has taken out of the ring
  std::atomic<std::uint64_t> ring_data_want;  // ring mode: asleep until ring_filled reaches this (0: awake)
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

constexpr std::uint64_t kStreamChunk = 1u << 20;    // published granularity
constexpr std::uint64_t kPiece = 128u << 10;        // hash-then-copy granularity (stays in L2)
constexpr std::uint64_t kDirectPiece = 256u << 10;  // direct read: one process_vm_readv, then hashed in L2
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
  std::atomic<std::uint32_t> mode;            // Mode of this session
  std::atomic<std::uint64_t> hashed;          // ring / direct: leading buckets whose checksum is in the table
  std::atomic<std::uint64_t> ring_filled;     // ring: stream bytes the publisher has put in the ring
  std::uint64_t ring_bytes;                   // ring: size (in slot 0)
  std::atomic<std::uint64_t> ring_room_want;  // ring: publisher asleep until every receiver consumed this (0: awake)
  std::uint64_t table_offset;                 // direct: segment offset of the session's DirectTable (0: none)
  std::uint64_t probe_addr;                   // publisher address of a word holding kMagic (read-permission probe)
  SlotHeader slots[2];
  ReaderSlot readers[kMaxReaders];
};

inline std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

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

// The POSIX name of a channel's segment: "/arlo-ws-<channel>", characters other than [A-Za-z0-9._-] as '_'.
std::string segment_name(const std::string& channel);
// NUL-terminated text in a fixed field of the segment (cut to cap - 1 bytes), and back.
void set_text(char* dst, std::size_t cap, const std::string& text);
std::string get_text(const char* src, std::size_t cap);

// A mapping of one segment. The creator owns the name: its destructor marks the segment retired,
// wakes every waiter and unlinks the name.
class Segment {
 public:
  // Creates the segment `name` with room for a manifest (and direct-read table) of `manifest_cap`
  // bytes and two bucket slots of `slot_cap`. A leftover of a dead publisher is removed first; one
  // of a live publisher is a configuration error (kUnavailable).
  static Result<std::unique_ptr<Segment>> create(const std::string& name, std::uint64_t manifest_cap,
                                                 std::uint64_t slot_cap);
  // Maps an existing segment: kNotFound when there is none (yet), kUnavailable while it is being created.
  static Result<std::unique_ptr<Segment>> open(const std::string& name);
  ~Segment();

  // Unlinks the name if it still refers to this segment (not a newer one with the same name).
  void unlink_if_same();

  std::byte* manifest() { return base_ + h->manifest_offset; }
  std::byte* at(std::uint64_t offset) { return base_ + offset; }
  std::byte* slot(int k) { return base_ + h->slot_offset[k]; }

  Header* h = nullptr;

 private:
  Segment() = default;
  Status map(std::uint64_t size);
  std::string name_;
  int fd_ = -1;
  std::byte* base_ = nullptr;
  std::uint64_t size_ = 0;
  bool owner_ = false;
};

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
void stream_copy(std::byte* dst, const std::byte* src, std::size_t n);

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
  Status st = wait_for(
      h, deadline, done,
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

}  // namespace arlo::weight_sync::shm
