// libFuzzer target for weight_sync's manifest.json parser (weight_sync/manifest.cc), what a
// receiver reads from a version directory or a publisher's MANIFEST frame before any byte moves.
//
// Input: the manifest text. Properties checked:
//   - Manifest::parse() never crashes, throws or hangs, whatever the bytes (ASan, UBSan, limits);
//   - an error always says why;
//   - an accepted manifest is coherent: every bucket item lies inside its tensor, no bucket holds
//     more than bucket_bytes, the tensors' sizes add up to total_bytes without overflowing (a
//     receiver allocates from these numbers);
//   - it prints (dump()) to text that parses again to the same text and fingerprint.
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "tests/fuzz/check.h"
#include "weight_sync/manifest.h"

namespace {

using arlo::fuzz::check;
using arlo::weight_sync::Manifest;

// numel * dtype size of a shape, or nullopt when a dimension is negative or the product overflows.
std::optional<std::uint64_t> exact_bytes(const arlo::weight_sync::TensorSpec& t) {
  unsigned __int128 n = arlo::safetensors::dtype_size(t.dtype);
  for (const auto d : t.shape) {
    if (d < 0) return std::nullopt;
    n *= static_cast<unsigned __int128>(d);
    if (n > std::numeric_limits<std::uint64_t>::max()) return std::nullopt;
  }
  return static_cast<std::uint64_t>(n);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto m = Manifest::parse(text);
  if (!m) {
    check(!m.error().what().empty(), "errors carry a message", text);
    return 0;
  }
  unsigned __int128 total = 0;
  for (const auto& t : m->tensors) {
    const auto bytes = exact_bytes(t);
    check(bytes.has_value(), "tensor sizes are non-negative and fit in 64 bits", text);
    check(*bytes == t.nbytes(), "nbytes() is the exact size", text);
    total += *bytes;
  }
  check(total == m->total_bytes, "total_bytes is the exact sum of the tensors", text);
  for (const auto& b : m->buckets) {
    unsigned __int128 raw = 0;
    for (const auto& it : b.items) {
      check(it.tensor < m->tensors.size(), "bucket item names a tensor", text);
      const auto& t = m->tensors[it.tensor];
      check(static_cast<unsigned __int128>(it.elem_offset) + it.elem_count <= t.numel(),
            "bucket item inside its tensor", text);
      raw += static_cast<unsigned __int128>(it.elem_count) * arlo::safetensors::dtype_size(t.dtype);
    }
    check(raw == b.raw_bytes, "bucket raw_bytes is the sum of its items", text);
    check(b.raw_bytes <= m->bucket_bytes, "bucket within bucket_bytes", text);
  }
  check(m->checksums.empty() || m->checksums.size() == m->buckets.size(), "one checksum per bucket", text);

  const std::string printed = m->dump();
  auto again = Manifest::parse(printed);
  check(again.has_value(), "the printed manifest parses again", printed);
  check(again->dump() == printed, "printing is stable across a reparse", printed);
  check(again->fingerprint() == m->fingerprint(), "fingerprint survives a reparse", printed);
  return 0;
}
