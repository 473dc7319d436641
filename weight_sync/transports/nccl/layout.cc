#include "weight_sync/transports/nccl/layout.h"

#include <algorithm>
#include <string>

namespace arlo::weight_sync::nccl {

std::vector<Bucket> plan_buckets(const std::vector<TensorSpec>& specs, const Layout& layout) {
  std::vector<Bucket> buckets;
  if (!layout.packed) {
    buckets.reserve(specs.size());
    for (std::size_t i = 0; i < specs.size(); ++i) buckets.push_back({i, 1, specs[i].nbytes()});
    return buckets;
  }
  Bucket open;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (open.count == 0) open.first = i;
    ++open.count;
    open.bytes += specs[i].nbytes();
    if (open.bytes > layout.packed_buffer_bytes) {  // this tensor crossed the limit: close after it
      buckets.push_back(open);
      open = {};
    }
  }
  if (open.count > 0) buckets.push_back(open);
  return buckets;
}

std::uint64_t largest_bucket(const std::vector<Bucket>& buckets) {
  std::uint64_t largest = 0;
  for (const Bucket& b : buckets) largest = std::max(largest, b.bytes);
  return largest;
}

Status validate(const Layout& layout) {
  if (layout.packed_buffer_bytes < 1) {
    return make_error(ErrorCode::kInvalidArgument, "nccl layout: packed_buffer_bytes must be >= 1, got 0");
  }
  if (layout.packed_num_buffers < 1 || layout.packed_num_buffers > 16) {
    return make_error(ErrorCode::kInvalidArgument, "nccl layout: packed_num_buffers must be in [1, 16], got " +
                                                       std::to_string(layout.packed_num_buffers));
  }
  return ok();
}

Result<std::string> torch_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F64: return std::string("float64");
    case DType::F32: return std::string("float32");
    case DType::F16: return std::string("float16");
    case DType::BF16: return std::string("bfloat16");
    case DType::F8_E4M3: return std::string("float8_e4m3fn");
    case DType::F8_E5M2: return std::string("float8_e5m2");
    case DType::I64: return std::string("int64");
    case DType::I32: return std::string("int32");
    case DType::I16: return std::string("int16");
    case DType::I8: return std::string("int8");
    case DType::U8: return std::string("uint8");
    case DType::BOOL: return std::string("bool");
  }
  return make_error(ErrorCode::kInternal,
                    "torch_dtype_name: unknown dtype value " + std::to_string(static_cast<int>(dtype)));
}

Result<int> nccl_data_type(DType dtype) {
  switch (dtype) {
    case DType::I8: return 0;
    case DType::U8: return 1;
    case DType::I32: return 2;
    case DType::I64: return 4;
    case DType::F16: return 6;
    case DType::F32: return 7;
    case DType::F64: return 8;
    case DType::BF16: return 9;
    case DType::F8_E4M3: return 10;
    case DType::F8_E5M2: return 11;
    case DType::I16:
    case DType::BOOL: break;
  }
  return make_error(ErrorCode::kInvalidArgument,
                    "nccl: dtype " + std::string(safetensors::dtype_name(dtype)) +
                        " has no NCCL datatype, so a per-tensor broadcast cannot carry it; use the packed layout "
                        "(uint8 buckets) or convert the tensor");
}

}  // namespace arlo::weight_sync::nccl
