#pragma once
// Helpers shared by the weight_sync tests: odd tensor layouts, seeded fills, expected decodes.
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "weight_sync/codec.h"
#include "weight_sync/manifest.h"
#include "weight_sync/transport.h"
#include "weight_sync/types.h"
#include "weight_sync/weight_sync.h"

namespace arlo::weight_sync::testing {

inline constexpr std::uint64_t kTestBucket = 1u << 20;

// Every dtype, odd shapes, an empty tensor, a scalar, sizes not a multiple of 128, and a tensor
// larger than one bucket (split across buckets).
inline std::vector<TensorSpec> odd_specs() {
  using D = DType;
  return {
      {"model.big.f32", D::F32, {1000, 301}},  // 1.2 MB: spans buckets
      {"model.w.bf16", D::BF16, {7, 13, 5}},
      {"model.w.f16", D::F16, {129}},
      {"model.w.f64", D::F64, {3, 41}},
      {"model.empty", D::F32, {0, 5}},
      {"model.scalar", D::F32, {}},
      {"model.i32", D::I32, {17}},
      {"model.i64", D::I64, {5}},
      {"model.i16", D::I16, {11}},
      {"model.i8", D::I8, {9}},
      {"model.u8", D::U8, {1023}},
      {"model.bool", D::BOOL, {3}},
      {"model.f8", D::F8_E4M3, {33}},
      {"model.f8b", D::F8_E5M2, {2}},
      {"model.mid.bf16", D::BF16, {300, 777}},  // 466 KB
  };
}

// Fills floating tensors with finite values in [-4, 4] (bool with 0/1), others with random bytes.
inline void fill(HostWeights& w, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-4.f, 4.f);
  for (std::size_t t = 0; t < w.specs().size(); ++t) {
    auto b = w.bytes(t);
    const DType d = w.specs()[t].dtype;
    const std::size_t es = safetensors::dtype_size(d);
    for (std::size_t k = 0; k < b.size() / es; ++k) {
      std::byte* p = b.data() + k * es;
      const float f = u(rng);
      if (d == DType::F32)
        std::memcpy(p, &f, 4);
      else if (d == DType::F64) {
        double x = f;
        std::memcpy(p, &x, 8);
      } else if (d == DType::F16) {
        _Float16 h = static_cast<_Float16>(f);
        std::memcpy(p, &h, 2);
      } else if (d == DType::BF16) {
        auto h = f32_to_bf16(f);
        std::memcpy(p, &h, 2);
      } else if (d == DType::BOOL)
        *p = static_cast<std::byte>(rng() & 1);
      else
        for (std::size_t j = 0; j < es; ++j) p[j] = static_cast<std::byte>(rng() & 0xFF);
    }
  }
}

// Changes about `fraction` of elements (byte-flip of the element's first byte, never a no-op).
inline void perturb(HostWeights& w, double fraction, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  for (std::size_t t = 0; t < w.specs().size(); ++t) {
    const DType d = w.specs()[t].dtype;
    if (d == DType::BOOL) continue;
    const std::size_t es = safetensors::dtype_size(d);
    auto b = w.bytes(t);
    for (std::size_t k = 0; k < b.size() / es; ++k)
      if (u(rng) < fraction) b[k * es] ^= std::byte{0x01};
  }
}

inline HostWeights copy_of(const HostWeights& w) {
  HostWeights out(w.specs());
  for (std::size_t t = 0; t < w.specs().size(); ++t)
    std::memcpy(out.bytes(t).data(), w.bytes(t).data(), w.bytes(t).size());
  return out;
}

// What a receiver should hold after `w` went through `payload` (lossy for casts).
inline HostWeights expected_after(const HostWeights& w, PayloadOptions payload, std::uint64_t bucket = kTestBucket) {
  if (payload.kind == PayloadKind::kDelta) payload.kind = PayloadKind::kFull;
  auto m = Manifest::plan(w.specs(), bucket, payload).value();
  auto enc = BucketEncoder::create(m, w, nullptr).value();
  HostWeights out(w.specs());
  std::vector<std::span<std::byte>> dest;
  for (std::size_t t = 0; t < w.specs().size(); ++t) dest.push_back(out.bytes(t));
  std::vector<std::byte> buf(std::max<std::uint64_t>(enc.max_capacity(), 1));
  for (std::size_t i = 0; i < m.buckets.size(); ++i) {
    auto b = enc.encode(i, buf).value();
    std::vector<std::byte> wire;
    for (auto p : b.parts) wire.insert(wire.end(), p.begin(), p.end());
    auto s = decode_bucket(m, i, wire, dest);
    if (!s) throw std::runtime_error(s.error().what());
  }
  return out;
}

// A name unique to this process and call ("<prefix>-<pid>-<n>").
inline std::string unique_name(const std::string& prefix) {
  static std::atomic<int> n{0};
  return prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

// Options::params for `transport` that keep concurrent tests apart: its own shm segment name and
// its own directory where the descriptor has such keys (a transport with another per-run resource
// adds its key here); every other key keeps the descriptor's default (tcp: a free loopback port).
inline nlohmann::json isolated_params(const std::string& transport, const std::string& shm_name,
                                      const std::filesystem::path& dir) {
  nlohmann::json p = nlohmann::json::object();
  auto d = find_transport(transport);
  if (!d) return p;
  if ((*d)->option("shm_name")) p["shm_name"] = shm_name;
  if ((*d)->option("dir")) p["dir"] = dir.string();
  return p;
}

// Receiver options that reach `endpoint` (a Publisher::endpoint() or relay_endpoint() object):
// its keys are the receiver's params of the same names, as an announcement hands them on.
inline Options reaching(Options o, const nlohmann::json& endpoint) {
  for (const auto& [k, v] : endpoint.items()) o.params[k] = v;
  return o;
}

// Faults for testing::ScopedFaults (designated initializers trip -Wmissing-field-initializers).
inline Faults corrupt_bucket(std::size_t i) {
  Faults f;
  f.corrupt_bucket = i;
  return f;
}
inline Faults stop_before_bucket(std::size_t i) {
  Faults f;
  f.stop_before_bucket = i;
  return f;
}

inline bool same_bytes(const HostWeights& a, const HostWeights& b) {
  if (a.specs() != b.specs()) return false;
  for (std::size_t t = 0; t < a.specs().size(); ++t)
    if (std::memcmp(a.bytes(t).data(), b.bytes(t).data(), a.bytes(t).size()) != 0) return false;
  return true;
}

}  // namespace arlo::weight_sync::testing
