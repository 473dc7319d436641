#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "common/safetensors.h"
#include "reference/model_impl.h"

namespace arlo::reference {
namespace {

std::filesystem::path temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("arlo_reference_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(Model, HuggingFaceNamesAndShapes) {
  auto m = Model::init({}, 1);
  ASSERT_TRUE(m.has_value()) << m.error().what();
  const auto& p = (*m)->params();
  ASSERT_EQ(p.size(), 1 + 2 * 9 + 2u);
  EXPECT_EQ(p.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(p[2].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(p[7].name, "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(p[7].shape, (std::vector<std::int64_t>{256, 64}));
  EXPECT_EQ(p.back().name, "lm_head.weight");
  EXPECT_EQ(p.back().shape, (std::vector<std::int64_t>{104, 64}));
}

TEST(Model, InitIsDeterministicInTheSeed) {
  auto a = Model::init({}, 7), b = Model::init({}, 7), c = Model::init({}, 8);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ((*a)->checksum(), (*b)->checksum());
  EXPECT_NE((*a)->checksum(), (*c)->checksum());
  EXPECT_EQ((*a)->checksum().size(), 16u);
}

TEST(Model, CloneIsAnIndependentCopy) {
  auto a = Model::init({}, 7);
  ASSERT_TRUE(a);
  auto b = (*a)->clone();
  EXPECT_EQ(b->checksum(), (*a)->checksum());
  b->mutable_bytes("model.norm.weight")[0] = std::byte{0x7f};
  EXPECT_NE(b->checksum(), (*a)->checksum());
}

TEST(Model, SaveLoadRoundTripThroughSafetensors) {
  auto dir = temp_dir("roundtrip");
  ModelConfig cfg;
  cfg.layers = 1;
  cfg.hidden = 32;
  cfg.heads = 2;
  cfg.intermediate = 48;
  auto m = Model::init(cfg, 3);
  ASSERT_TRUE(m);
  ASSERT_TRUE((*m)->save(dir / "w.safetensors", {{"arlo.version", "5"}}));
  auto file = safetensors::File::open(dir / "w.safetensors");
  ASSERT_TRUE(file) << file.error().what();
  EXPECT_EQ(file->header().metadata.at("arlo.version"), "5");
  EXPECT_NE(file->header().find("model.layers.0.mlp.down_proj.weight"), nullptr);
  auto back = Model::load(dir / "w.safetensors");  // shape from the file's metadata
  ASSERT_TRUE(back) << back.error().what();
  EXPECT_EQ((*back)->config(), cfg);
  EXPECT_EQ((*back)->checksum(), (*m)->checksum());
  std::filesystem::remove_all(dir);
}

TEST(Model, LoadRejectsAMissingTensor) {
  auto dir = temp_dir("missing");
  std::vector<float> w(104 * 64, 0.0f);
  std::vector<safetensors::TensorData> data{{{"model.embed_tokens.weight", safetensors::DType::F32, {104, 64}},
                                             {reinterpret_cast<const std::byte*>(w.data()), w.size() * sizeof(float)}}};
  ASSERT_TRUE(safetensors::write_file(dir / "w.safetensors", data));
  auto back = Model::load(dir / "w.safetensors");
  ASSERT_FALSE(back);
  EXPECT_EQ(back.error().code(), ErrorCode::kMismatch);
  EXPECT_NE(back.error().what().find("model.layers.0.input_layernorm.weight"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(Model, PackedSequencesDoNotSeeEachOther) {
  auto m = Model::init({}, 11);
  ASSERT_TRUE(m);
  at::NoGradGuard no_grad;
  auto a = at::tensor({1, 20, 30, 40}, at::kLong).view({1, 4});
  auto b = at::tensor({1, 50, 60}, at::kLong).view({1, 3});
  auto packed = at::cat({a, b}, 1);
  auto pos = at::tensor({0, 1, 2, 3, 0, 1, 2}, at::kLong).view({1, 7});
  const auto& impl = (*m)->impl();
  auto la = impl.forward(a, at::arange(4, at::kLong).view({1, 4}));
  auto lb = impl.forward(b, at::arange(3, at::kLong).view({1, 3}));
  auto lp = impl.forward(packed, pos);
  EXPECT_LT((lp.narrow(1, 0, 4) - la).abs().max().item<float>(), 1e-5);
  EXPECT_LT((lp.narrow(1, 4, 3) - lb).abs().max().item<float>(), 1e-5);
}

TEST(Model, CachedDecodingMatchesFullForward) {
  auto m = Model::init({}, 5);
  ASSERT_TRUE(m);
  at::NoGradGuard no_grad;
  const auto& impl = (*m)->impl();
  std::vector<std::int64_t> seq{1, 20, 21, 22, 23, 24, 25};
  auto full = impl.forward(at::tensor(seq, at::kLong).view({1, 7}), at::arange(7, at::kLong).view({1, 7}));
  auto cache = impl.make_cache(4);
  auto slot = at::tensor({2}, at::kLong);
  auto first = impl.prefill(cache, at::tensor({1, 20, 21}, at::kLong).view({1, 3}), at::tensor({3}, at::kLong), slot);
  EXPECT_LT((first[0] - full[0][2]).abs().max().item<float>(), 1e-5);
  for (int t = 3; t < 7; ++t) {
    auto step = impl.decode(cache, at::tensor({seq[t]}, at::kLong), at::tensor({std::int64_t{t}}, at::kLong), slot);
    EXPECT_LT((step[0] - full[0][t]).abs().max().item<float>(), 1e-5) << "position " << t;
  }
}

}  // namespace
}  // namespace arlo::reference
