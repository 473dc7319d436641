#include "weight_sync/manifest.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include <nlohmann/json.hpp>
#include "weight_sync/wire.h"
#include "weight_sync/xxh.h"

namespace arlo::weight_sync {

std::string_view to_string(PayloadKind kind) {
  switch (kind) {
    case PayloadKind::kFull: return "full";
    case PayloadKind::kCastBf16: return "bf16";
    case PayloadKind::kCastFp8: return "fp8";
    case PayloadKind::kDelta: return "delta";
  }
  return "unknown";
}

Result<PayloadKind> parse_payload(std::string_view text) {
  if (text == "full") return PayloadKind::kFull;
  if (text == "bf16" || text == "cast_bf16") return PayloadKind::kCastBf16;
  if (text == "fp8" || text == "cast_fp8" || text == "fp8_e4m3") return PayloadKind::kCastFp8;
  if (text == "delta") return PayloadKind::kDelta;
  return make_error(ErrorCode::kInvalidArgument,
                    "payload '" + std::string(text) + "': expected full | bf16 | fp8 | delta");
}

bool PublishReport::all_ok() const {
  return std::all_of(peers.begin(), peers.end(), [](const PeerReport& p) { return p.ok; });
}

Result<Manifest> Manifest::plan(std::vector<TensorSpec> specs, std::uint64_t bucket_bytes, PayloadOptions payload) {
  if (bucket_bytes < (1ull << 20) || bucket_bytes >= (4ull << 30))
    return make_error(ErrorCode::kInvalidArgument,
                      "weight_sync.bucket_bytes = " + std::to_string(bucket_bytes) + ": must be in [1 MiB, 4 GiB)");
  if (specs.size() >= (1ull << 31)) return make_error(ErrorCode::kInvalidArgument, "too many tensors");
  Manifest m;
  m.payload = payload;
  m.bucket_bytes = bucket_bytes;
  m.tensors = std::move(specs);
  Bucket current;
  auto close = [&] {
    if (!current.items.empty()) m.buckets.push_back(std::move(current));
    current = Bucket{};
  };
  for (std::uint32_t t = 0; t < m.tensors.size(); ++t) {
    const auto& spec = m.tensors[t];
    for (auto d : spec.shape)
      if (d < 0) return make_error(ErrorCode::kInvalidArgument, "tensor '" + spec.name + "': negative dimension");
    const std::uint64_t es = safetensors::dtype_size(spec.dtype);
    const std::uint64_t n = spec.numel();
    const std::uint64_t bytes = n * es;
    m.total_bytes += bytes;
    if (current.raw_bytes + bytes <= bucket_bytes) {
      current.items.push_back({t, 0, n});
      current.raw_bytes += bytes;
      continue;
    }
    close();
    if (bytes <= bucket_bytes) {
      current.items.push_back({t, 0, n});
      current.raw_bytes = bytes;
      continue;
    }
    // Larger than a bucket: whole buckets of block-aligned element ranges, the tail stays open.
    const std::uint64_t chunk = std::max<std::uint64_t>(kBlockElems, bucket_bytes / es / kBlockElems * kBlockElems);
    for (std::uint64_t off = 0; off < n; off += chunk) {
      const std::uint64_t cnt = std::min(chunk, n - off);
      current.items.push_back({t, off, cnt});
      current.raw_bytes = cnt * es;
      if (off + cnt < n) close();
    }
  }
  close();
  return m;
}

std::uint64_t Manifest::max_bucket_bytes() const {
  std::uint64_t m = 0;
  for (const auto& b : buckets) m = std::max(m, b.raw_bytes);
  return m;
}

std::uint64_t Manifest::fingerprint() const {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  auto put = [&](const void* p, std::size_t n) { XXH3_64bits_update(st, p, n); };
  auto put_u64 = [&](std::uint64_t v) { put(&v, sizeof v); };
  put_u64(bucket_bytes);
  put_u64(static_cast<std::uint64_t>(payload.kind));
  put_u64(payload.zstd ? 1 : 0);
  put_u64(tensors.size());
  for (const auto& t : tensors) {
    put_u64(t.name.size());
    put(t.name.data(), t.name.size());
    put_u64(static_cast<std::uint64_t>(t.dtype));
    put_u64(t.shape.size());
    for (auto d : t.shape) put_u64(static_cast<std::uint64_t>(d));
  }
  put_u64(buckets.size());
  for (const auto& b : buckets) {
    put_u64(b.items.size());
    for (const auto& it : b.items) {
      put_u64(it.tensor);
      put_u64(it.elem_offset);
      put_u64(it.elem_count);
    }
  }
  std::uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

nlohmann::json Manifest::to_json() const {
  nlohmann::json j;
  j["format"] = "arlo-weight-sync/1";
  j["version"] = version;
  if (base_version) j["base_version"] = *base_version;
  j["payload"] = std::string(to_string(payload.kind));
  j["zstd"] = payload.zstd;
  j["delta_density_threshold"] = payload.delta_density_threshold;
  j["bucket_bytes"] = bucket_bytes;
  j["total_bytes"] = total_bytes;
  auto& ts = j["tensors"] = nlohmann::json::array();
  for (const auto& t : tensors)
    ts.push_back({{"name", t.name}, {"dtype", std::string(safetensors::dtype_name(t.dtype))}, {"shape", t.shape}});
  auto& bs = j["buckets"] = nlohmann::json::array();
  for (const auto& b : buckets) {
    auto items = nlohmann::json::array();
    for (const auto& it : b.items) items.push_back({it.tensor, it.elem_offset, it.elem_count});
    bs.push_back(std::move(items));
  }
  j["checksums"] = checksums;
  j["fingerprint"] = fingerprint();
  return j;
}

namespace {

// nlohmann converts a floating-point number to an integer with a plain cast, undefined when it is
// out of range (a manifest may say 1e300): integer fields accept integers only.
std::uint64_t unsigned_of(const nlohmann::json& v, const char* what) {
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<std::int64_t>() < 0))
    throw std::invalid_argument(std::string(what) + " must be a non-negative integer, not " + v.dump().substr(0, 40));
  return v.get<std::uint64_t>();
}
std::int64_t signed_of(const nlohmann::json& v, const char* what) {
  if (!v.is_number_integer() ||
      (v.is_number_unsigned() && v.get<std::uint64_t>() > std::numeric_limits<std::int64_t>::max()))
    throw std::invalid_argument(std::string(what) + " must be an integer, not " + v.dump().substr(0, 40));
  return v.get<std::int64_t>();
}

}  // namespace

Result<Manifest> Manifest::from_json(const nlohmann::json& j) {
  try {
    if (j.value("format", "") != "arlo-weight-sync/1")
      return make_error(ErrorCode::kMismatch, "manifest: unknown format '" + j.value("format", "") + "'");
    Manifest m;
    ARLO_ASSIGN_OR_RETURN(m.version, version_from_json(j.at("version"), "manifest 'version'"));
    if (j.contains("base_version")) {
      ARLO_ASSIGN_OR_RETURN(m.base_version, version_from_json(j.at("base_version"), "manifest 'base_version'"));
    }
    ARLO_ASSIGN_OR_RETURN(m.payload.kind, parse_payload(j.at("payload").get<std::string>()));
    m.payload.zstd = j.at("zstd").get<bool>();
    ARLO_ASSIGN_OR_RETURN(auto threshold, delta_density_threshold_of(j, "manifest"));
    m.payload.delta_density_threshold = threshold.value_or(0.25);
    m.bucket_bytes = unsigned_of(j.at("bucket_bytes"), "bucket_bytes");
    m.total_bytes = unsigned_of(j.at("total_bytes"), "total_bytes");
    for (const auto& t : j.at("tensors")) {
      TensorSpec s;
      s.name = t.at("name").get<std::string>();
      ARLO_ASSIGN_OR_RETURN(s.dtype, safetensors::parse_dtype(t.at("dtype").get<std::string>()));
      for (const auto& d : t.at("shape")) s.shape.push_back(signed_of(d, "a shape dimension"));
      // A receiver sizes buffers from these: a negative dimension or a size past 64 bits is refused.
      unsigned __int128 bytes = safetensors::dtype_size(s.dtype);
      for (auto d : s.shape) {
        bytes *= static_cast<unsigned __int128>(d < 0 ? 0 : d);
        if (d < 0 || bytes > std::numeric_limits<std::uint64_t>::max())
          return make_error(ErrorCode::kParse, "manifest: tensor '" + s.name + "' has a negative or oversized shape");
      }
      m.tensors.push_back(std::move(s));
    }
    std::uint64_t total = 0;
    for (const auto& t : m.tensors) {
      if (total + t.nbytes() < total) return make_error(ErrorCode::kParse, "manifest: tensor sizes overflow 64 bits");
      total += t.nbytes();
    }
    if (total != m.total_bytes) return make_error(ErrorCode::kParse, "manifest: total_bytes disagrees with tensors");
    for (const auto& b : j.at("buckets")) {
      Bucket bucket;
      for (const auto& it : b) {
        const auto tensor = unsigned_of(it.at(0), "a bucket item's tensor");
        if (tensor > std::numeric_limits<std::uint32_t>::max())
          return make_error(ErrorCode::kParse, "manifest: bucket item out of range");
        BucketItem item{static_cast<std::uint32_t>(tensor), unsigned_of(it.at(1), "a bucket item's offset"),
                        unsigned_of(it.at(2), "a bucket item's count")};
        if (item.tensor >= m.tensors.size() || item.elem_offset + item.elem_count > m.tensors[item.tensor].numel() ||
            item.elem_offset + item.elem_count < item.elem_offset)
          return make_error(ErrorCode::kParse, "manifest: bucket item out of range");
        bucket.raw_bytes += item.elem_count * safetensors::dtype_size(m.tensors[item.tensor].dtype);
        bucket.items.push_back(item);
      }
      if (bucket.raw_bytes > m.bucket_bytes) return make_error(ErrorCode::kParse, "manifest: bucket over bucket_bytes");
      m.buckets.push_back(std::move(bucket));
    }
    if (j.contains("checksums"))
      for (const auto& c : j.at("checksums")) m.checksums.push_back(unsigned_of(c, "a checksum"));
    if (!m.checksums.empty() && m.checksums.size() != m.buckets.size())
      return make_error(ErrorCode::kParse, "manifest: checksum count differs from bucket count");
    if (j.contains("fingerprint") && unsigned_of(j.at("fingerprint"), "fingerprint") != m.fingerprint())
      return make_error(ErrorCode::kMismatch, "manifest: fingerprint does not match its contents");
    return m;
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kParse, std::string("manifest: ") + e.what());
  }
}

std::string Manifest::dump() const { return to_json().dump(); }

Result<Manifest> Manifest::parse(std::string_view text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return make_error(ErrorCode::kParse, "manifest: not valid JSON");
  return from_json(j);
}

Result<std::vector<std::span<std::byte>>> bind_sink(const Manifest& manifest, WeightSink& sink) {
  if (!sink.device().is_cpu())
    return make_error(ErrorCode::kInvalidArgument,
                      "sink memory is on " + sink.device().str() + "; this transport needs cpu buffers");
  std::vector<std::span<std::byte>> out;
  out.reserve(manifest.tensors.size());
  for (const auto& t : manifest.tensors) {
    auto buf = sink.buffer_for(t);
    if (!buf)
      return make_error(ErrorCode::kMismatch, "manifest refused: tensor '" + t.name + "': " + buf.error().what());
    if (buf->size() != t.nbytes())
      return make_error(ErrorCode::kMismatch, "manifest refused: tensor '" + t.name + "': sink buffer has " +
                                                  std::to_string(buf->size()) + " bytes, manifest needs " +
                                                  std::to_string(t.nbytes()));
    out.push_back(*buf);
  }
  return out;
}

}  // namespace arlo::weight_sync
