#pragma once
// The manifest of one published version: what both sides agree on before any byte moves.
//
// Layout: tensors in source order are packed into buckets of at most `bucket_bytes` raw bytes. A
// tensor larger than a bucket is split into element ranges (aligned to kBlockElems so fp8 blocks
// never straddle buckets). The layout fingerprint covers names, dtypes, shapes, bucket size and
// payload; a receiver compares it (and its sink's buffers) and refuses on any difference.
// Per-bucket checksums (xxh3-64 of the bucket's wire bytes) are filled as buckets are encoded; the
// streaming transports carry each with its bucket, the filesystem transport stores them all here.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/result.h"
#include "weight_sync/types.h"
#include "weight_sync/weight_sync.h"

namespace arlo::weight_sync {

inline constexpr std::uint64_t kBlockElems = 128;  // fp8 scale block

// A contiguous element range of one tensor inside a bucket.
struct BucketItem {
  std::uint32_t tensor = 0;  // index into Manifest::tensors
  std::uint64_t elem_offset = 0;
  std::uint64_t elem_count = 0;
  friend bool operator==(const BucketItem&, const BucketItem&) = default;
};

struct Bucket {
  std::vector<BucketItem> items;
  std::uint64_t raw_bytes = 0;  // sum of item bytes in the source dtype
};

struct Manifest {
  Version version = 0;
  std::optional<Version> base_version;  // delta: the version the receiver must hold
  PayloadOptions payload;
  std::uint64_t bucket_bytes = 0;
  std::vector<TensorSpec> tensors;
  std::vector<Bucket> buckets;
  std::vector<std::uint64_t> checksums;  // per bucket, when known (filesystem); else empty
  std::uint64_t total_bytes = 0;

  // Plans the bucket layout for `specs`. bucket_bytes must be >= 1 MiB and < 4 GiB.
  static Result<Manifest> plan(std::vector<TensorSpec> specs, std::uint64_t bucket_bytes, PayloadOptions payload);

  // Hash of names, dtypes, shapes, bucket size and layout, payload kind/zstd (not version/checksums).
  std::uint64_t fingerprint() const;
  // Largest raw bucket.
  std::uint64_t max_bucket_bytes() const;

  nlohmann::json to_json() const;
  static Result<Manifest> from_json(const nlohmann::json& j);
  std::string dump() const;  // compact JSON text
  static Result<Manifest> parse(std::string_view text);
};

// Checks that `sink` holds every tensor of `manifest` with the right size (calls buffer_for once per
// tensor) and returns the destination spans, indexed like manifest.tensors. kMismatch otherwise,
// naming the tensor.
Result<std::vector<std::span<std::byte>>> bind_sink(const Manifest& manifest, WeightSink& sink);

}  // namespace arlo::weight_sync
