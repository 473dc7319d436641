// A supervised sanity test: the model and optimizer learn a tiny task (two-digit sums), so later RL
// failures are not blamed on them.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "reference/adamw.h"
#include "reference/loss.h"
#include "reference/model_impl.h"
#include "reference/tokenizer.h"

namespace arlo::reference {
namespace {

TEST(Learning, SupervisedLossFallsWellBelowItsStart) {
  set_torch_threads(1);
  Tokenizer tok;
  auto m = Model::init({}, 1234);
  ASSERT_TRUE(m);
  Model& model = **m;
  model.impl().set_requires_grad(true);
  AdamW opt(model, {.lr = 3e-3, .max_grad_norm = 1.0});
  std::mt19937 rng(5);
  const int B = 32, T = 12;
  double first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    std::vector<std::int64_t> id_data(B * T, Tokenizer::kPad);
    std::vector<float> ce_data(B * T, 0.0f);
    for (int b = 0; b < B; ++b) {
      int x = static_cast<int>(rng() % 10), y = static_cast<int>(rng() % 10);
      auto prompt = tok.encode_prompt(std::to_string(x) + "+" + std::to_string(y) + "=");
      auto answer = tok.encode(std::to_string(x + y));
      answer.push_back(Tokenizer::kEos);
      std::vector<std::int32_t> seq = prompt;
      seq.insert(seq.end(), answer.begin(), answer.end());
      for (std::size_t t = 0; t < seq.size(); ++t) {
        id_data[b * T + t] = seq[t];
        if (t >= prompt.size()) ce_data[b * T + t] = 1.0f;
      }
    }
    auto ids = at::tensor(id_data, at::kLong).view({B, T});
    auto pos = at::arange(T, at::kLong).unsqueeze(0).repeat({B, 1});
    auto ce = at::tensor(ce_data, at::kFloat).view({B, T});
    LossInputs in{model.impl().forward(ids, pos),
                  ids,
                  pos,
                  at::zeros({B, T}, at::kByte),
                  at::zeros({B, T}),
                  at::zeros({B, T}),
                  ce};
    auto out = compute_loss(in, {});
    ASSERT_TRUE(out) << out.error().what();
    out->loss.backward();
    auto norm = opt.step();
    ASSERT_TRUE(norm) << norm.error().what();
    if (step == 0) first = out->ce_loss;
    last = out->ce_loss;
  }
  std::printf("supervised cross-entropy: step 1 %.3f, step 150 %.3f\n", first, last);
  // Chance is ln(104) = 4.6; the answers' tokens are far from random once learned.
  EXPECT_GT(first, 4.0);
  EXPECT_LT(last, 0.35 * first) << "first " << first << " last " << last;
}

TEST(Learning, OptimizerStateRoundTrips) {
  auto m = Model::init({}, 9);
  ASSERT_TRUE(m);
  Model& model = **m;
  model.impl().set_requires_grad(true);
  AdamW opt(model, {});
  auto ids = at::tensor({1, 20, 21, 22}, at::kLong).view({1, 4});
  auto pos = at::arange(4, at::kLong).view({1, 4});
  LossInputs in{model.impl().forward(ids, pos),
                ids,
                pos,
                at::zeros({1, 4}, at::kByte),
                at::zeros({1, 4}),
                at::zeros({1, 4}),
                at::ones({1, 4})};
  compute_loss(in, {})->loss.backward();
  ASSERT_TRUE(opt.step());
  auto path = std::filesystem::temp_directory_path() / ("arlo_adamw_" + std::to_string(::getpid()) + ".safetensors");
  ASSERT_TRUE(opt.save(path));
  AdamW other(model, {});
  ASSERT_TRUE(other.load(path));
  EXPECT_EQ(other.steps(), 1);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace arlo::reference
