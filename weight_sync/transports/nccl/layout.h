#pragma once
// How a weight set travels over an NCCL broadcast: the two layouts the inference servers read, the
// bucket plan both sides derive from the tensor list alone, and the dtype names and NCCL datatype
// values the peers use. Pure functions; no NCCL or CUDA needed.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"
#include "weight_sync/types.h"

namespace arlo::weight_sync::nccl {

struct Layout {
  // true: vLLM's packed layout, each bucket one uint8 broadcast of the tensors' bytes concatenated
  // in order with no padding. false: one broadcast per tensor in its own dtype (vLLM unpacked,
  // SGLang's default).
  bool packed = true;
  std::uint64_t packed_buffer_bytes = 1ull << 30;  // vLLM packed_buffer_size_bytes
  int packed_num_buffers = 2;                      // buffers (and streams) that overlap; >= 1
};

// Tensors [first, first + count) of the spec list, `bytes` in all.
struct Bucket {
  std::size_t first = 0, count = 0;
  std::uint64_t bytes = 0;
  friend bool operator==(const Bucket&, const Bucket&) = default;
};

// vLLM's rule (packed): walk the tensors in order and close a bucket right after the tensor that
// makes the running total exceed packed_buffer_bytes; the remainder is the last bucket. So a bucket
// holds at most packed_buffer_bytes + its last tensor. Per-tensor layout: one bucket per tensor.
// An empty list gives no buckets.
std::vector<Bucket> plan_buckets(const std::vector<TensorSpec>& specs, const Layout& layout);

// The largest bucket of a plan (0 for none): what one staging buffer must hold.
std::uint64_t largest_bucket(const std::vector<Bucket>& buckets);

// The layout's own limits: packed_buffer_bytes >= 1, packed_num_buffers in [1, 16].
Status validate(const Layout& layout);

// torch dtype names as vLLM and SGLang read them (getattr(torch, name)): BF16 -> "bfloat16",
// F32 -> "float32", F8_E4M3 -> "float8_e4m3fn", BOOL -> "bool", ...
Result<std::string> torch_dtype_name(DType dtype);

// ncclDataType_t value of a dtype, as pynccl and torch map them: I8 0, U8 1, I32 2, I64 4, F16 6,
// F32 7, F64 8, BF16 9, F8_E4M3 10, F8_E5M2 11 (NCCL >= 2.24; vLLM's pynccl refuses fp8 in
// the per-tensor layout: use packed). Error for a dtype NCCL has no type for (I16, BOOL).
Result<int> nccl_data_type(DType dtype);

inline constexpr int kNcclUint8 = 1;    // ncclUint8: packed buckets
inline constexpr int kNcclFloat32 = 7;  // ncclFloat32: the warm-up all-reduce

}  // namespace arlo::weight_sync::nccl
