#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include <nlohmann/json.hpp>

#include "tests/unit/weight_sync/test_util.h"
#include "weight_sync/codec.h"
#include "weight_sync/manifest.h"
#include "weight_sync/qwen3.h"

namespace arlo::weight_sync {
namespace {

using testing::expected_after;
using testing::fill;
using testing::odd_specs;

TEST(WeightSyncBf16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  // 1 + 2^-8 is exactly half way between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.f, -8)), 0x3F80);
  // 1.0078125 + 2^-8 is half way to the next: ties to even (1.015625 = 0x3F82).
  EXPECT_EQ(f32_to_bf16(1.0078125f + std::ldexp(1.f, -8)), 0x3F82);
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.f, -8) + std::ldexp(1.f, -16)), 0x3F81);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-2.5f)), -2.5f);
}

TEST(WeightSyncE4m3, ExactValuesSaturationAndNaN) {
  EXPECT_EQ(f32_to_e4m3(0.f), 0x00);
  EXPECT_EQ(f32_to_e4m3(1.f), 0x38);
  EXPECT_EQ(f32_to_e4m3(-1.f), 0xB8);
  EXPECT_EQ(f32_to_e4m3(448.f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(1e6f), 0x7E);  // saturates, never NaN
  EXPECT_EQ(f32_to_e4m3(-1e6f), 0xFE);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN()) & 0x7F, 0x7F);
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.f, -9)), 0x01);  // smallest subnormal
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.f, -6)), 0x08);  // smallest normal
  // 1.0625 is half way between 1.0 (mantissa 0) and 1.125 (mantissa 1): ties to even -> 1.0.
  EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);
  // 1.1875 is half way between 1.125 (odd) and 1.25 (even) -> 1.25.
  EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3A);
  for (int v = 0; v < 256; ++v) {
    if ((v & 0x7F) == 0x7F) continue;
    EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(static_cast<std::uint8_t>(v))), v == 0x80 ? 0x80 : v) << v;
  }
}

TEST(WeightSyncE4m3, BlockScaledErrorBound) {
  // Documented bound: |x - x'| <= 2^-4 |x| + 2^-10 * scale, scale = block amax / 448.
  std::vector<TensorSpec> specs = {{"w", DType::F32, {4096 + 77}}};
  HostWeights w(specs);
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.f, 0.02f);
  auto* f = reinterpret_cast<float*>(w.bytes(0).data());
  for (std::size_t k = 0; k < specs[0].numel(); ++k) f[k] = n(rng) * (k % 300 == 0 ? 100.f : 1.f);
  auto out = expected_after(w, {PayloadKind::kCastFp8, false, 0.25});
  const auto* g = reinterpret_cast<const float*>(out.bytes(0).data());
  for (std::size_t b = 0; b * 128 < specs[0].numel(); ++b) {
    float amax = 0;
    const std::size_t end = std::min<std::size_t>(specs[0].numel(), (b + 1) * 128);
    for (std::size_t k = b * 128; k < end; ++k) amax = std::max(amax, std::fabs(f[k]));
    const float scale = amax / 448.f;
    for (std::size_t k = b * 128; k < end; ++k)
      ASSERT_LE(std::fabs(f[k] - g[k]), std::ldexp(std::fabs(f[k]), -4) + std::ldexp(scale, -10) + 1e-12f) << k;
  }
}

TEST(WeightSyncManifest, SplitsLargeTensorsOnBlockBoundaries) {
  auto m = Manifest::plan(odd_specs(), testing::kTestBucket, {}).value();
  std::uint64_t covered = 0;
  for (const auto& b : m.buckets) {
    EXPECT_LE(b.raw_bytes, testing::kTestBucket);
    for (const auto& it : b.items) {
      EXPECT_EQ(it.elem_offset % kBlockElems, 0u);
      covered += it.elem_count * safetensors::dtype_size(m.tensors[it.tensor].dtype);
    }
  }
  EXPECT_EQ(covered, m.total_bytes);
  EXPECT_GE(m.buckets.size(), 2u);
  auto again = Manifest::parse(m.dump()).value();
  EXPECT_EQ(again.fingerprint(), m.fingerprint());
  auto other_specs = odd_specs();
  other_specs[1].shape = {7, 13, 6};
  EXPECT_NE(Manifest::plan(other_specs, testing::kTestBucket, {}).value().fingerprint(), m.fingerprint());
  EXPECT_FALSE(Manifest::plan(odd_specs(), 1000, {}).has_value());
}

TEST(WeightSyncManifest, TamperedJsonIsRejected) {
  auto m = Manifest::plan(odd_specs(), testing::kTestBucket, {}).value();
  auto j = m.to_json();
  j["tensors"][0]["shape"][0] = 999;
  EXPECT_FALSE(Manifest::from_json(j).has_value());
}

TEST(WeightSyncDelta, SparseDenseAndIdempotent) {
  std::vector<TensorSpec> specs = {{"a", DType::BF16, {10000}}, {"b", DType::F32, {1000}}, {"c", DType::U8, {50}}};
  HostWeights base(specs), cur(specs);
  fill(base, 1);
  cur = testing::copy_of(base);
  testing::perturb(cur, 0.01, 2);  // a: sparse
  auto* b = reinterpret_cast<float*>(cur.bytes(1).data());
  for (int k = 0; k < 1000; k += 2) b[k] += 1.f;  // b: 50% changed -> dense
  PayloadOptions p{PayloadKind::kDelta, false, 0.25};
  auto m = Manifest::plan(specs, 1 << 20, p).value();
  auto enc = BucketEncoder::create(m, cur, &base).value();
  std::vector<std::byte> buf(enc.capacity(0));
  auto e = enc.encode(0, buf).value();
  EXPECT_LT(e.wire_bytes, cur.total_bytes() / 2);
  HostWeights recv = testing::copy_of(base);
  std::vector<std::span<std::byte>> dest = {recv.bytes(0), recv.bytes(1), recv.bytes(2)};
  ASSERT_TRUE(decode_bucket(m, 0, e.parts[0], dest));
  EXPECT_TRUE(testing::same_bytes(recv, cur));
  ASSERT_TRUE(decode_bucket(m, 0, e.parts[0], dest));  // twice: harmless
  EXPECT_TRUE(testing::same_bytes(recv, cur));
}

TEST(WeightSyncCodec, EveryPayloadWithZstdMatchesWithout) {
  HostWeights w(odd_specs());
  fill(w, 3);
  for (auto kind : {PayloadKind::kFull, PayloadKind::kCastBf16, PayloadKind::kCastFp8}) {
    auto plain = expected_after(w, {kind, false, 0.25});
    auto z = expected_after(w, {kind, true, 0.25});
    EXPECT_TRUE(testing::same_bytes(plain, z)) << to_string(kind);
  }
  EXPECT_TRUE(testing::same_bytes(expected_after(w, {}), w));
}

TEST(WeightSyncCodec, CorruptedZstdFrameIsAParseError) {
  HostWeights w(odd_specs());
  fill(w, 4);
  auto m = Manifest::plan(w.specs(), testing::kTestBucket, {PayloadKind::kFull, true, 0.25}).value();
  auto enc = BucketEncoder::create(m, w, nullptr).value();
  std::vector<std::byte> buf(enc.capacity(0));
  auto e = enc.encode(0, buf).value();
  std::vector<std::byte> wire(e.parts[0].begin(), e.parts[0].end());
  wire.resize(wire.size() / 2);
  HostWeights out(w.specs());
  std::vector<std::span<std::byte>> dest;
  for (std::size_t t = 0; t < w.specs().size(); ++t) dest.push_back(out.bytes(t));
  EXPECT_FALSE(decode_bucket(m, 0, wire, dest));
}

TEST(WeightSyncQwen3, LayoutMatchesPublicConfig) {
  auto specs = model_layout("qwen3-1.7b", DType::BF16).value();
  std::uint64_t params = 0;
  for (const auto& s : specs) params += s.numel();
  EXPECT_EQ(specs.size(), 1u + 28u * 11u + 1u);
  EXPECT_EQ(specs.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(specs[1 + 5].name, "model.layers.0.self_attn.q_norm.weight");
  EXPECT_NEAR(static_cast<double>(params), 1.72e9, 0.02e9);
  auto small = model_layout("qwen3-0.6b", DType::BF16).value();
  params = 0;
  for (const auto& s : small) params += s.numel();
  EXPECT_NEAR(static_cast<double>(params), 0.596e9, 0.01e9);
  EXPECT_FALSE(model_layout("llama", DType::BF16).has_value());
}

}  // namespace
}  // namespace arlo::weight_sync
