#include "weight_sync/codec.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "weight_sync/xxh.h"
#include <zstd.h>

namespace arlo::weight_sync {
namespace {

constexpr std::uint64_t kDeltaHeader = 16;  // u8 mode, 7 pad, u64 count

std::uint64_t esize(DType d) { return safetensors::dtype_size(d); }

// Wire bytes of one element of `dtype` under a cast payload (0 = not cast: as-is).
bool casts(PayloadKind kind, DType d) {
  if (kind == PayloadKind::kCastBf16) return d == DType::F32 || d == DType::F16 || d == DType::F64;
  if (kind == PayloadKind::kCastFp8) return is_floating(d);
  return false;
}

std::uint64_t item_wire_capacity(const Manifest& m, const BucketItem& it) {
  const DType d = m.tensors[it.tensor].dtype;
  const std::uint64_t n = it.elem_count;
  switch (m.payload.kind) {
    case PayloadKind::kFull: return n * esize(d);
    case PayloadKind::kCastBf16: return casts(m.payload.kind, d) ? n * 2 : n * esize(d);
    case PayloadKind::kCastFp8:
      return casts(m.payload.kind, d) ? (n + kBlockElems - 1) / kBlockElems * 4 + n : n * esize(d);
    case PayloadKind::kDelta: return kDeltaHeader + n * esize(d);
  }
  return 0;
}

std::uint64_t bucket_plain_capacity(const Manifest& m, std::size_t i) {
  std::uint64_t c = 0;
  for (const auto& it : m.buckets[i].items) c += item_wire_capacity(m, it);
  return c;
}

inline float load_float(const std::byte* p, DType d) {
  switch (d) {
    case DType::F32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::F64: {
      double x;
      std::memcpy(&x, p, 8);
      return static_cast<float>(x);
    }
    case DType::F16: {
      _Float16 h;
      std::memcpy(&h, p, 2);
      return static_cast<float>(h);
    }
    case DType::BF16: {
      std::uint16_t b;
      std::memcpy(&b, p, 2);
      return bf16_to_f32(b);
    }
    default: return 0.f;
  }
}

inline void store_float(std::byte* p, DType d, float f) {
  switch (d) {
    case DType::F32: std::memcpy(p, &f, 4); break;
    case DType::F64: {
      double x = f;
      std::memcpy(p, &x, 8);
      break;
    }
    case DType::F16: {
      _Float16 h = static_cast<_Float16>(f);
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::BF16: {
      std::uint16_t b = f32_to_bf16(f);
      std::memcpy(p, &b, 2);
      break;
    }
    default: break;
  }
}

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int v = 0; v < 256; ++v) {
      const int sign = v >> 7, exp = (v >> 3) & 15, man = v & 7;
      float f;
      if (exp == 15 && man == 7)
        f = std::numeric_limits<float>::quiet_NaN();
      else if (exp == 0)
        f = std::ldexp(static_cast<float>(man), -9);
      else
        f = std::ldexp(1.f + man / 8.f, exp - 7);
      t[v] = sign ? -f : f;
    }
    return t;
  }();
  return table;
}

// Encodes one item of a cast payload. Returns bytes written.
std::uint64_t encode_cast(PayloadKind kind, DType d, const std::byte* src, std::uint64_t n, std::byte* out) {
  const std::uint64_t es = esize(d);
  if (kind == PayloadKind::kCastBf16) {
    if (d == DType::F32) {
      for (std::uint64_t k = 0; k < n; ++k) {
        float f;
        std::memcpy(&f, src + 4 * k, 4);
        std::uint16_t b = f32_to_bf16(f);
        std::memcpy(out + 2 * k, &b, 2);
      }
    } else {
      for (std::uint64_t k = 0; k < n; ++k) {
        std::uint16_t b = f32_to_bf16(load_float(src + es * k, d));
        std::memcpy(out + 2 * k, &b, 2);
      }
    }
    return 2 * n;
  }
  // fp8 e4m3 with one fp32 scale per block: scale = amax / 448, so the block's largest magnitude maps
  // to the largest finite e4m3 value.
  const std::uint64_t blocks = (n + kBlockElems - 1) / kBlockElems;
  std::byte* scales = out;
  std::byte* q = out + blocks * 4;
  float vals[kBlockElems];
  for (std::uint64_t b = 0; b < blocks; ++b) {
    const std::uint64_t begin = b * kBlockElems, cnt = std::min(kBlockElems, n - begin);
    float amax = 0.f;
    for (std::uint64_t k = 0; k < cnt; ++k) {
      vals[k] = load_float(src + es * (begin + k), d);
      const float a = std::fabs(vals[k]);
      if (std::isfinite(a)) amax = std::max(amax, a);
    }
    const float scale = amax > 0.f ? amax / 448.f : 1.f;
    const float inv = 1.f / scale;
    std::memcpy(scales + 4 * b, &scale, 4);
    for (std::uint64_t k = 0; k < cnt; ++k) q[begin + k] = static_cast<std::byte>(f32_to_e4m3(vals[k] * inv));
  }
  return blocks * 4 + n;
}

Status decode_cast(PayloadKind kind, DType d, const std::byte* in, std::uint64_t avail, std::uint64_t n, std::byte* dst,
                   std::uint64_t& used) {
  const std::uint64_t es = esize(d);
  if (kind == PayloadKind::kCastBf16) {
    used = 2 * n;
    if (avail < used) return make_error(ErrorCode::kParse, "bf16 item truncated");
    for (std::uint64_t k = 0; k < n; ++k) {
      std::uint16_t b;
      std::memcpy(&b, in + 2 * k, 2);
      store_float(dst + es * k, d, bf16_to_f32(b));
    }
    return ok();
  }
  const std::uint64_t blocks = (n + kBlockElems - 1) / kBlockElems;
  used = blocks * 4 + n;
  if (avail < used) return make_error(ErrorCode::kParse, "fp8 item truncated");
  const auto& table = e4m3_table();
  const std::byte* q = in + blocks * 4;
  for (std::uint64_t b = 0; b < blocks; ++b) {
    float scale;
    std::memcpy(&scale, in + 4 * b, 4);
    const std::uint64_t begin = b * kBlockElems, cnt = std::min(kBlockElems, n - begin);
    for (std::uint64_t k = 0; k < cnt; ++k)
      store_float(dst + es * (begin + k), d, table[static_cast<std::uint8_t>(q[begin + k])] * scale);
  }
  return ok();
}

// Delta of one item against the base: sparse pairs when few elements changed, else dense.
template <std::size_t ES>
std::uint64_t encode_delta_t(const std::byte* cur, const std::byte* base, std::uint64_t n, double threshold,
                             std::byte* out) {
  const std::uint64_t limit_count = static_cast<std::uint64_t>(threshold * static_cast<double>(n));
  const std::uint64_t dense_bytes = n * ES;
  std::byte* p = out + kDeltaHeader;
  std::uint64_t count = 0;
  bool sparse = true;
  constexpr std::uint64_t kChunk = 64;
  for (std::uint64_t k0 = 0; k0 < n && sparse; k0 += kChunk) {
    const std::uint64_t c = std::min(kChunk, n - k0);
    if (std::memcmp(cur + k0 * ES, base + k0 * ES, c * ES) == 0) continue;
    for (std::uint64_t k = k0; k < k0 + c; ++k) {
      if (std::memcmp(cur + k * ES, base + k * ES, ES) == 0) continue;
      ++count;
      if (count > limit_count || count * (4 + ES) >= dense_bytes) {
        sparse = false;
        break;
      }
      const std::uint32_t idx = static_cast<std::uint32_t>(k);
      std::memcpy(p, &idx, 4);
      std::memcpy(p + 4, cur + k * ES, ES);
      p += 4 + ES;
    }
  }
  std::memset(out, 0, kDeltaHeader);
  if (sparse) {
    out[0] = std::byte{1};
    std::memcpy(out + 8, &count, 8);
    return kDeltaHeader + count * (4 + ES);
  }
  out[0] = std::byte{0};
  std::memcpy(out + 8, &n, 8);
  std::memcpy(out + kDeltaHeader, cur, dense_bytes);
  return kDeltaHeader + dense_bytes;
}

std::uint64_t encode_delta(std::uint64_t es, const std::byte* cur, const std::byte* base, std::uint64_t n,
                           double threshold, std::byte* out) {
  switch (es) {
    case 1: return encode_delta_t<1>(cur, base, n, threshold, out);
    case 2: return encode_delta_t<2>(cur, base, n, threshold, out);
    case 4: return encode_delta_t<4>(cur, base, n, threshold, out);
    default: return encode_delta_t<8>(cur, base, n, threshold, out);
  }
}

Status decode_delta(std::uint64_t es, const std::byte* in, std::uint64_t avail, std::uint64_t n, std::byte* dst,
                    std::uint64_t& used) {
  if (avail < kDeltaHeader) return make_error(ErrorCode::kParse, "delta item header truncated");
  const auto mode = static_cast<std::uint8_t>(in[0]);
  std::uint64_t count;
  std::memcpy(&count, in + 8, 8);
  if (mode == 0) {
    if (count != n) return make_error(ErrorCode::kParse, "dense delta item has the wrong element count");
    used = kDeltaHeader + n * es;
    if (avail < used) return make_error(ErrorCode::kParse, "dense delta item truncated");
    std::memcpy(dst, in + kDeltaHeader, n * es);
    return ok();
  }
  if (mode != 1 || count > n) return make_error(ErrorCode::kParse, "delta item has a bad mode or count");
  used = kDeltaHeader + count * (4 + es);
  if (avail < used) return make_error(ErrorCode::kParse, "sparse delta item truncated");
  const std::byte* p = in + kDeltaHeader;
  for (std::uint64_t k = 0; k < count; ++k, p += 4 + es) {
    std::uint32_t idx;
    std::memcpy(&idx, p, 4);
    if (idx >= n) return make_error(ErrorCode::kParse, "sparse delta index out of range");
    std::memcpy(dst + idx * es, p + 4, es);
  }
  return ok();
}

// Encodes bucket i without zstd into out; returns bytes written.
std::uint64_t encode_plain(const Manifest& m, std::size_t i, const std::vector<std::span<const std::byte>>& views,
                           const HostWeights* base, std::byte* out) {
  std::byte* p = out;
  for (const auto& it : m.buckets[i].items) {
    const DType d = m.tensors[it.tensor].dtype;
    const std::uint64_t es = esize(d);
    const std::byte* src = views[it.tensor].data() + it.elem_offset * es;
    switch (m.payload.kind) {
      case PayloadKind::kFull:
        std::memcpy(p, src, it.elem_count * es);
        p += it.elem_count * es;
        break;
      case PayloadKind::kCastBf16:
      case PayloadKind::kCastFp8:
        if (casts(m.payload.kind, d)) {
          p += encode_cast(m.payload.kind, d, src, it.elem_count, p);
        } else {
          std::memcpy(p, src, it.elem_count * es);
          p += it.elem_count * es;
        }
        break;
      case PayloadKind::kDelta: {
        const std::byte* b = base->bytes(it.tensor).data() + it.elem_offset * es;
        p += encode_delta(es, src, b, it.elem_count, m.payload.delta_density_threshold, p);
        break;
      }
    }
  }
  return static_cast<std::uint64_t>(p - out);
}

}  // namespace

std::uint64_t xxh3(std::span<const std::byte> bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

std::uint64_t xxh3(const std::vector<std::span<const std::byte>>& parts) {
  if (parts.size() == 1) return xxh3(parts[0]);
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  for (const auto& p : parts) XXH3_64bits_update(&st, p.data(), p.size());
  return XXH3_64bits_digest(&st);
}

namespace {
constexpr std::size_t kHashChunk = 128u << 10;
}

std::uint64_t scatter_and_hash(std::span<const std::byte> src, const std::vector<std::span<std::byte>>& dst) {
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  const std::byte* p = src.data();
  for (const auto& d : dst) {
    for (std::size_t off = 0; off < d.size(); off += kHashChunk) {
      const std::size_t n = std::min(kHashChunk, d.size() - off);
      XXH3_64bits_update(&st, p, n);
      std::memcpy(d.data() + off, p, n);
      p += n;
    }
  }
  return XXH3_64bits_digest(&st);
}

std::uint16_t f32_to_bf16(float value) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(value);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

float bf16_to_f32(std::uint16_t value) { return std::bit_cast<float>(static_cast<std::uint32_t>(value) << 16); }

std::uint8_t f32_to_e4m3(float value) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(value);
  const std::uint8_t sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7F;                            // NaN
  if (a >= 0x43E00000u) return sign | 0x7E;                           // >= 448 (and inf): saturate
  if (a < 0x3C800000u) {                                              // below 2^-6: subnormal steps of 2^-9
    const float m = std::nearbyint(std::bit_cast<float>(a) * 512.f);  // RNE in the default mode
    return sign | static_cast<std::uint8_t>(m);                       // m == 8 is the smallest normal: same encoding
  }
  std::uint32_t r = (a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;  // RNE to 3 mantissa bits
  r -= 120u << 3;                                             // rebias exponent 127 -> 7
  if (r > 0x7Eu) r = 0x7Eu;
  return sign | static_cast<std::uint8_t>(r);
}

float e4m3_to_f32(std::uint8_t value) { return e4m3_table()[value]; }

bool is_floating(DType d) { return d == DType::F32 || d == DType::F16 || d == DType::BF16 || d == DType::F64; }

Result<BucketEncoder> BucketEncoder::create(const Manifest& manifest, const WeightSource& source,
                                            const HostWeights* base) {
  BucketEncoder e;
  e.manifest_ = &manifest;
  e.base_ = base;
  const auto& specs = source.specs();
  if (specs.size() != manifest.tensors.size())
    return make_error(ErrorCode::kMismatch, "source has " + std::to_string(specs.size()) + " tensors, manifest " +
                                                std::to_string(manifest.tensors.size()));
  for (std::size_t t = 0; t < specs.size(); ++t) {
    ARLO_ASSIGN_OR_RETURN(auto v, source.view(t));
    if (!v.device.is_cpu())
      return make_error(ErrorCode::kInvalidArgument, "tensor '" + specs[t].name + "' is on " + v.device.str() +
                                                         "; this transport moves cpu tensors only");
    if (!(*v.spec == manifest.tensors[t]) || v.bytes.size() != manifest.tensors[t].nbytes())
      return make_error(ErrorCode::kMismatch, "tensor '" + specs[t].name + "' does not match the manifest");
    e.views_.push_back(v.bytes);
  }
  if (manifest.payload.kind == PayloadKind::kDelta) {
    if (!base || base->specs() != manifest.tensors)
      return make_error(ErrorCode::kInternal, "delta payload without a matching base snapshot");
  }
  return e;
}

bool BucketEncoder::zero_copy() const {
  return manifest_->payload.kind == PayloadKind::kFull && !manifest_->payload.zstd;
}

std::uint64_t BucketEncoder::capacity(std::size_t i) const {
  if (zero_copy()) return 0;
  const std::uint64_t plain = bucket_plain_capacity(*manifest_, i);
  if (!manifest_->payload.zstd) return plain;
  return ZSTD_compressBound(plain);
}

std::uint64_t BucketEncoder::max_capacity() const {
  std::uint64_t c = 0;
  for (std::size_t i = 0; i < manifest_->buckets.size(); ++i) c = std::max(c, capacity(i));
  return c;
}

Result<EncodedBucket> BucketEncoder::encode(std::size_t i, std::span<std::byte> buffer, bool with_checksum) const {
  EncodedBucket out;
  out.index = i;
  const auto& m = *manifest_;
  if (zero_copy()) {
    for (const auto& it : m.buckets[i].items) {
      const std::uint64_t es = esize(m.tensors[it.tensor].dtype);
      if (it.elem_count == 0) continue;
      out.parts.push_back(views_[it.tensor].subspan(it.elem_offset * es, it.elem_count * es));
      out.wire_bytes += it.elem_count * es;
    }
    if (with_checksum) out.checksum = xxh3(out.parts);
    return out;
  }
  if (buffer.size() < capacity(i))
    return make_error(ErrorCode::kInternal, "encode buffer too small for bucket " + std::to_string(i));
  std::uint64_t n;
  if (!m.payload.zstd) {
    n = encode_plain(m, i, views_, base_, buffer.data());
  } else {
    // Plain encoding into scratch, then one zstd frame (level 1) into the buffer.
    const std::uint64_t plain_cap = bucket_plain_capacity(m, i);
    std::unique_ptr<std::byte[]> scratch(new std::byte[plain_cap ? plain_cap : 1]);
    const std::uint64_t plain = encode_plain(m, i, views_, base_, scratch.get());
    const std::size_t z = ZSTD_compress(buffer.data(), buffer.size(), scratch.get(), plain, 1);
    if (ZSTD_isError(z))
      return make_error(ErrorCode::kInternal,
                        std::string("zstd compress bucket ") + std::to_string(i) + ": " + ZSTD_getErrorName(z));
    n = z;
  }
  out.parts.push_back(buffer.subspan(0, n));
  out.wire_bytes = n;
  if (with_checksum) out.checksum = xxh3(out.parts[0]);
  return out;
}

std::uint64_t wire_capacity(const Manifest& m, std::size_t i) {
  const std::uint64_t plain = bucket_plain_capacity(m, i);
  return m.payload.zstd ? ZSTD_compressBound(plain) : plain;
}

Status decode_bucket(const Manifest& m, std::size_t i, std::span<const std::byte> wire,
                     const std::vector<std::span<std::byte>>& dest) {
  std::unique_ptr<std::byte[]> plain_buf;
  std::span<const std::byte> plain = wire;
  if (m.payload.zstd) {
    const std::uint64_t cap = bucket_plain_capacity(m, i);
    const unsigned long long size = ZSTD_getFrameContentSize(wire.data(), wire.size());
    if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN || size > cap)
      return make_error(ErrorCode::kParse, "bucket " + std::to_string(i) + ": bad zstd frame");
    plain_buf.reset(new std::byte[size ? size : 1]);
    const std::size_t got = ZSTD_decompress(plain_buf.get(), size, wire.data(), wire.size());
    if (ZSTD_isError(got) || got != size)
      return make_error(ErrorCode::kParse, "bucket " + std::to_string(i) + ": zstd decompress failed");
    plain = {plain_buf.get(), static_cast<std::size_t>(size)};
  }
  const std::byte* p = plain.data();
  std::uint64_t avail = plain.size();
  for (const auto& it : m.buckets[i].items) {
    const DType d = m.tensors[it.tensor].dtype;
    const std::uint64_t es = esize(d);
    std::byte* dst = dest[it.tensor].data() + it.elem_offset * es;
    std::uint64_t used = 0;
    switch (m.payload.kind) {
      case PayloadKind::kFull:
        used = it.elem_count * es;
        if (avail < used) return make_error(ErrorCode::kParse, "bucket " + std::to_string(i) + " truncated");
        std::memcpy(dst, p, used);
        break;
      case PayloadKind::kCastBf16:
      case PayloadKind::kCastFp8:
        if (casts(m.payload.kind, d)) {
          ARLO_TRY(with_context(decode_cast(m.payload.kind, d, p, avail, it.elem_count, dst, used),
                                "bucket " + std::to_string(i)));
        } else {
          used = it.elem_count * es;
          if (avail < used) return make_error(ErrorCode::kParse, "bucket " + std::to_string(i) + " truncated");
          std::memcpy(dst, p, used);
        }
        break;
      case PayloadKind::kDelta:
        ARLO_TRY(with_context(decode_delta(es, p, avail, it.elem_count, dst, used), "bucket " + std::to_string(i)));
        break;
    }
    p += used;
    avail -= used;
  }
  if (avail != 0)
    return make_error(ErrorCode::kParse,
                      "bucket " + std::to_string(i) + ": " + std::to_string(avail) + " trailing bytes");
  return ok();
}

BucketApplier::BucketApplier(const Manifest& manifest, std::vector<std::span<std::byte>> dest, ApplyMode mode)
    : manifest_(&manifest),
      dest_(std::move(dest)),
      mode_(mode),
      verified_(manifest.buckets.size(), false),
      kept_(manifest.buckets.size()),
      kept_size_(manifest.buckets.size(), 0) {}

bool BucketApplier::direct() const {
  return mode_ == ApplyMode::kInPlace && manifest_->payload.kind == PayloadKind::kFull && !manifest_->payload.zstd;
}

std::vector<std::span<std::byte>> BucketApplier::direct_spans(std::size_t i) const {
  std::vector<std::span<std::byte>> out;
  for (const auto& it : manifest_->buckets[i].items) {
    const std::uint64_t es = esize(manifest_->tensors[it.tensor].dtype);
    if (it.elem_count == 0) continue;
    out.push_back(dest_[it.tensor].subspan(it.elem_offset * es, it.elem_count * es));
  }
  return out;
}

Status BucketApplier::verify_direct(std::size_t i, std::uint64_t checksum) {
  touched_ = true;
  auto spans = direct_spans(i);
  std::vector<std::span<const std::byte>> parts(spans.begin(), spans.end());
  const std::uint64_t got = xxh3(parts);
  if (got != checksum)
    return make_error(ErrorCode::kMismatch,
                      "bucket " + std::to_string(i) + ": checksum mismatch (corrupted in transit)");
  verified_[i] = true;
  return ok();
}

Status BucketApplier::accept(std::size_t i, std::span<const std::byte> wire, std::uint64_t checksum) {
  if (i >= verified_.size())
    return make_error(ErrorCode::kParse, "bucket index " + std::to_string(i) + " out of range");
  const auto mismatch = [&] {
    return make_error(ErrorCode::kMismatch,
                      "bucket " + std::to_string(i) + ": checksum mismatch (corrupted in transit)");
  };
  const bool plain_full = manifest_->payload.kind == PayloadKind::kFull && !manifest_->payload.zstd;
  if (plain_full && mode_ == ApplyMode::kInPlace) {
    // One pass: hash each chunk, then copy it while hot. A mismatch leaves this bucket's destination
    // bytes written (touched_), so the caller retries the bucket or discards the version.
    auto spans = direct_spans(i);
    std::uint64_t need = 0;
    for (const auto& s : spans) need += s.size();
    if (need != wire.size())
      return make_error(ErrorCode::kParse, "bucket " + std::to_string(i) + " has the wrong size");
    touched_ = true;
    if (scatter_and_hash(wire, spans) != checksum) return mismatch();
    verified_[i] = true;
    return ok();
  }
  if (xxh3(wire) != checksum) return mismatch();
  return accept_verified(i, wire);
}

Status BucketApplier::accept_verified(std::size_t i, std::span<const std::byte> wire) {
  if (i >= verified_.size())
    return make_error(ErrorCode::kParse, "bucket index " + std::to_string(i) + " out of range");
  if (mode_ == ApplyMode::kInPlace) {
    touched_ = true;
    ARLO_TRY(decode_bucket(*manifest_, i, wire, dest_));
  } else {
    // Kept as received; decoded into the sink by finish() once every bucket verified.
    kept_[i].reset(new std::byte[wire.size() ? wire.size() : 1]);
    std::memcpy(kept_[i].get(), wire.data(), wire.size());
    kept_size_[i] = wire.size();
  }
  verified_[i] = true;
  return ok();
}

std::size_t BucketApplier::verified_prefix() const {
  std::size_t k = 0;
  while (k < verified_.size() && verified_[k]) ++k;
  return k;
}

bool BucketApplier::complete() const { return verified_prefix() == verified_.size(); }

std::span<const std::byte> BucketApplier::kept(std::size_t i) const {
  if (!kept_[i]) return {};
  return {kept_[i].get(), kept_size_[i]};
}

Status BucketApplier::finish() {
  if (!complete())
    return make_error(ErrorCode::kInternal,
                      "finish() before bucket " + std::to_string(verified_prefix()) + " verified");
  if (mode_ == ApplyMode::kStaging) {
    touched_ = true;
    for (std::size_t i = 0; i < kept_.size(); ++i) {
      ARLO_TRY(decode_bucket(*manifest_, i, kept(i), dest_));
      kept_[i].reset();
    }
  }
  return ok();
}

}  // namespace arlo::weight_sync
