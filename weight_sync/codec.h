#pragma once
// Payload codecs and the two halves every streaming transport shares:
//   BucketEncoder (sender): turns bucket i of a source into wire bytes + xxh3 checksum.
//   BucketApplier (receiver): verifies wire bytes, then writes them into the sink (in_place) or keeps
//   them aside until every bucket verified (staging).
//
// Wire format of one bucket, before optional zstd (one zstd frame over the whole bucket):
//   items in manifest order; per item, by payload:
//     full:  the item's bytes as in the source
//     bf16:  floating items (F32/F16/F64) as bf16 (RNE); others as-is
//     fp8:   floating items (F64/F32/F16/BF16): ceil(n/128) fp32 scales, then n e4m3 bytes; others as-is
//     delta: u8 mode, 7 zero bytes, u64 count; mode 0 = dense (n elements follow), mode 1 = sparse
//            (count pairs of u32 element index + element bytes). Overwrite encoding: applying twice is
//            harmless. Sparse is chosen when count <= threshold * n and it is smaller than dense.
// Thread-safety: an encoder/applier is used by one thread at a time, except where noted.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/result.h"
#include "weight_sync/manifest.h"
#include "weight_sync/types.h"

namespace arlo::weight_sync {

std::uint64_t xxh3(std::span<const std::byte> bytes);
std::uint64_t xxh3(const std::vector<std::span<const std::byte>>& parts);

// Scalar conversions (exposed for tests and docs).
std::uint16_t f32_to_bf16(float value);  // round to nearest even; NaN stays NaN
float bf16_to_f32(std::uint16_t value);
std::uint8_t f32_to_e4m3(float value);  // round to nearest even, saturating to +-448; NaN -> 0x7F
float e4m3_to_f32(std::uint8_t value);
bool is_floating(DType dtype);

// Copies `src` into the `dst` spans in order (their sizes must add up to src.size()), hashing chunk
// by chunk while each chunk is hot in cache (one pass over memory instead of two). Returns the
// xxh3-64 of the copied bytes.
std::uint64_t scatter_and_hash(std::span<const std::byte> src, const std::vector<std::span<std::byte>>& dst);

// One bucket's bytes ready to send: either views into the source (zero copy) or one encoded buffer.
struct EncodedBucket {
  std::size_t index = 0;
  std::vector<std::span<const std::byte>> parts;
  std::uint64_t wire_bytes = 0;
  std::uint64_t checksum = 0;
};

class BucketEncoder {
 public:
  // `base` is the previous version (delta payload only; same specs), may be null otherwise.
  // Sources views are resolved on construction; source and base must outlive the encoder.
  static Result<BucketEncoder> create(const Manifest& manifest, const WeightSource& source, const HostWeights* base);

  // Bytes a buffer needs to encode bucket i (0 when zero_copy()).
  std::uint64_t capacity(std::size_t i) const;
  std::uint64_t max_capacity() const;
  // Full payload without zstd: wire bytes are the source bytes, no buffer needed.
  bool zero_copy() const;
  // Encodes bucket i into `buffer` (>= capacity(i)) or gathers source views. Thread-safe for
  // different i (it keeps no per-call state except zstd scratch, which is per call).
  // `with_checksum = false` skips the hash for callers that hash while moving the bytes.
  Result<EncodedBucket> encode(std::size_t i, std::span<std::byte> buffer, bool with_checksum = true) const;

 private:
  const Manifest* manifest_ = nullptr;
  const HostWeights* base_ = nullptr;
  std::vector<std::span<const std::byte>> views_;  // per tensor
};

// Largest wire size bucket i can have under the manifest's payload (what a receive buffer needs).
std::uint64_t wire_capacity(const Manifest& manifest, std::size_t i);

// Decodes bucket `i` wire bytes into destination spans (per manifest tensor). Wire bytes must have
// been verified. Errors (kParse) on a malformed bucket.
Status decode_bucket(const Manifest& manifest, std::size_t i, std::span<const std::byte> wire,
                     const std::vector<std::span<std::byte>>& dest);

class BucketApplier {
 public:
  BucketApplier(const Manifest& manifest, std::vector<std::span<std::byte>> dest, ApplyMode mode);

  // In-place full payload without zstd: the transport may read bucket i straight into these spans
  // and then call verify_direct(). Empty when that is not possible.
  bool direct() const;
  std::vector<std::span<std::byte>> direct_spans(std::size_t i) const;
  Status verify_direct(std::size_t i, std::uint64_t checksum);

  // Verifies `wire` against `checksum`, then applies (in_place) or keeps a copy (staging).
  Status accept(std::size_t i, std::span<const std::byte> wire, std::uint64_t checksum);
  // Same as accept() for a caller that already hashed `wire` while receiving it and found it equal.
  Status accept_verified(std::size_t i, std::span<const std::byte> wire);
  // Direct mode: the caller read bucket i into direct_spans(i) and verified its hash while reading.
  void mark_direct_verified(std::size_t i) {
    touched_ = true;
    verified_[i] = true;
  }
  // Direct mode: bytes of bucket i were (partly) overwritten without verifying.
  void mark_touched() { touched_ = true; }
  bool verified(std::size_t i) const { return verified_[i]; }
  std::size_t verified_prefix() const;  // number of leading buckets verified
  bool complete() const;
  // Staging: decode the kept buckets into the sink. In place: nothing left to do.
  Status finish();
  // Whether destination bytes were written (an in-place failure then needs sink.discard()).
  bool touched() const { return touched_; }
  // Bytes of wire data kept for a bucket in staging mode (for relaying); empty otherwise.
  std::span<const std::byte> kept(std::size_t i) const;

 private:
  const Manifest* manifest_;
  std::vector<std::span<std::byte>> dest_;
  ApplyMode mode_;
  std::vector<bool> verified_;
  std::vector<std::unique_ptr<std::byte[]>> kept_;
  std::vector<std::uint64_t> kept_size_;
  bool touched_ = false;
};

}  // namespace arlo::weight_sync
