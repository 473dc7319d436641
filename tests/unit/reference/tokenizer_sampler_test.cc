#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "reference/sampler.h"
#include "reference/tokenizer.h"

namespace arlo::reference {
namespace {

TEST(Tokenizer, RoundTripsPrintableAscii) {
  Tokenizer tok;
  std::string all = "\t\n";
  for (char c = 0x20; c <= 0x7e; ++c) all += c;
  auto ids = tok.encode(all);
  ASSERT_EQ(ids.size(), all.size());
  for (auto id : ids) EXPECT_FALSE(tok.is_special(id));
  EXPECT_EQ(tok.decode(ids), all);
  EXPECT_EQ(ids.back(), Tokenizer::kVocabSize - 1);
}

TEST(Tokenizer, SpecialTokensAreNotProducedByText) {
  Tokenizer tok;
  auto ids = tok.encode_prompt("<eos>");
  ASSERT_EQ(ids.size(), 6u);
  EXPECT_EQ(ids[0], Tokenizer::kBos);
  for (std::size_t i = 1; i < ids.size(); ++i) EXPECT_FALSE(tok.is_special(ids[i]));
  EXPECT_EQ(tok.encode("\x01")[0], Tokenizer::kUnk);
  EXPECT_EQ(tok.decode({Tokenizer::kBos, 9 + ('a' - 0x20), Tokenizer::kEos}), "a");
  EXPECT_EQ(tok.decode({Tokenizer::kBos, Tokenizer::kEos}, true), "<bos><eos>");
}

TEST(Tokenizer, ChatTemplate) {
  Tokenizer tok;
  auto ids = tok.apply_chat_template({{"system", "s"}, {"user", "1+2"}});
  ASSERT_TRUE(ids.has_value());
  EXPECT_EQ(tok.decode(*ids, true), "<bos><|system|>s\n<|user|>1+2\n<|assistant|>");
  EXPECT_FALSE(tok.apply_chat_template({{"robot", "x"}}).has_value());
}

TEST(Sampler, GreedyPicksArgmaxAndReportsUntemperedLogprob) {
  std::vector<float> logits{0.0f, 2.0f, 1.0f};
  SamplerRng rng(1);
  auto t = sample_token(logits, 0.0, 0.5, rng);
  EXPECT_EQ(t.token, 1);
  const double z = std::exp(0.0) + std::exp(2.0) + std::exp(1.0);
  EXPECT_NEAR(t.logprob, 2.0 - std::log(z), 1e-6);
}

TEST(Sampler, LogprobIsUnderTemperatureAndNucleus) {
  // p ~ exp(l / 0.5) = {1, e^2, e^4, e^6}: the largest two hold > 0.9 of the mass.
  std::vector<float> logits{0.0f, 1.0f, 2.0f, 3.0f};
  const double w[4] = {1.0, std::exp(2.0), std::exp(4.0), std::exp(6.0)};
  const double total = w[0] + w[1] + w[2] + w[3];
  ASSERT_GT((w[3] + w[2]) / total, 0.9);
  ASSERT_LT(w[3] / total, 0.9);
  EXPECT_NEAR(token_logprob(logits, 3, 0.5, 0.9), std::log(w[3] / (w[3] + w[2])), 1e-9);
  EXPECT_NEAR(token_logprob(logits, 2, 0.5, 1.0), std::log(w[2] / total), 1e-9);
  EXPECT_TRUE(std::isinf(token_logprob(logits, 1, 0.5, 0.9)));
  std::map<int, int> counts;
  SamplerRng rng(7);
  for (int i = 0; i < 4000; ++i) {
    auto t = sample_token(logits, 0.5, 0.9, rng);
    ASSERT_TRUE(t.token == 2 || t.token == 3);
    EXPECT_NEAR(t.logprob, token_logprob(logits, t.token, 0.5, 0.9), 1e-6);
    ++counts[t.token];
  }
  const double expected3 = w[3] / (w[3] + w[2]);
  EXPECT_NEAR(counts[3] / 4000.0, expected3, 0.03);
}

TEST(Sampler, SameSeedSameStream) {
  std::vector<float> logits{0.1f, 0.2f, 0.3f, 0.4f, 0.5f};
  SamplerRng a(mix_seed(42, 0)), b(mix_seed(42, 0)), c(mix_seed(42, 1));
  int same_ab = 0, same_ac = 0;
  for (int i = 0; i < 200; ++i) {
    auto ta = sample_token(logits, 1.0, 1.0, a);
    auto tb = sample_token(logits, 1.0, 1.0, b);
    auto tc = sample_token(logits, 1.0, 1.0, c);
    same_ab += ta.token == tb.token;
    same_ac += ta.token == tc.token;
  }
  EXPECT_EQ(same_ab, 200);
  EXPECT_LT(same_ac, 120);
}

}  // namespace
}  // namespace arlo::reference
