// The loss against values computed by hand (plain double arithmetic, no libtorch) on small cases.
#include <gtest/gtest.h>

#include <cmath>

#include "reference/loss.h"

namespace arlo::reference {
namespace {

// Vocabulary of 2. Row: tokens [0, 1, 0], positions [0, 1, 2].
// logits[0] = [0, ln 3]  -> p(token 1 at t=1) = 3/4
// logits[1] = [ln 4, 0]  -> p(token 0 at t=2) = 4/5
// Inference logprobs chosen so rho_1 = 2 and rho_2 = 1.25. Advantages: A_1 = 1, A_2 = -0.5.
struct Small {
  double p1 = 0.75, p2 = 0.8;
  double rho1 = 2.0, rho2 = 1.25;
  double a1 = 1.0, a2 = -0.5;
  LossInputs inputs(bool with_ce = false) const {
    LossInputs in;
    in.logits =
        at::tensor({0.0f, static_cast<float>(std::log(3.0)), static_cast<float>(std::log(4.0)), 0.0f, 0.0f, 0.0f})
            .view({1, 3, 2})
            .set_requires_grad(true);
    in.input_ids = at::tensor({0, 1, 0}, at::kLong).view({1, 3});
    in.position_ids = at::tensor({0, 1, 2}, at::kLong).view({1, 3});
    in.loss_mask = at::tensor({0, 1, 1}, at::kByte).view({1, 3});
    in.advantages = at::tensor({5.0f, static_cast<float>(a1), static_cast<float>(a2)}).view({1, 3});
    in.inference_logprobs =
        at::tensor({0.0f, static_cast<float>(std::log(p1 / rho1)), static_cast<float>(std::log(p2 / rho2))})
            .view({1, 3});
    if (with_ce) in.ce_weights = at::tensor({3.0f, 1.0f, 0.5f}).view({1, 3});
    return in;
  }
  double kl() const { return ((rho1 - 1 - std::log(rho1)) + (rho2 - 1 - std::log(rho2))) / 2; }
  double entropy() const {
    auto h = [](double p) { return -(p * std::log(p) + (1 - p) * std::log(1 - p)); };
    return (h(p1) + h(p2)) / 2;
  }
  double pg(double w1, double w2) const { return -(w1 * a1 * std::log(p1) + w2 * a2 * std::log(p2)) / 2; }
};

LossOutput run(const LossInputs& in, IsCorrection c) {
  LossOptions o;
  o.is_correction = c;
  o.is_low = 0.8;
  o.is_high = 1.5;
  auto out = compute_loss(in, o);
  EXPECT_TRUE(out) << out.error().what();
  return *out;
}

TEST(Loss, NoCorrection) {
  Small s;
  auto out = run(s.inputs(), IsCorrection::kNone);
  EXPECT_NEAR(out.loss.item<double>(), s.pg(1, 1), 1e-6);
  EXPECT_NEAR(out.mismatch_kl, s.kl(), 1e-6);
  EXPECT_NEAR(out.entropy, s.entropy(), 1e-6);
  EXPECT_EQ(out.clipped_fraction, 0.0);
  EXPECT_EQ(out.pg_tokens, 2);
}

TEST(Loss, TokenTruncatedIsClipsTheRatioAndKeepsItsGradientDetached) {
  Small s;
  auto in = s.inputs();
  auto out = run(in, IsCorrection::kTokenTis);
  EXPECT_NEAR(out.loss.item<double>(), s.pg(1.5, 1.25), 1e-6);
  EXPECT_NEAR(out.clipped_fraction, 0.5, 1e-9);
  EXPECT_NEAR(out.clipped_high_fraction, 0.5, 1e-9);
  EXPECT_EQ(out.clipped_low_fraction, 0.0);
  out.loss.backward();
  // d loss / d logits[0][1] = -(w1 * A1 / n) * (1 - p1): the weight is a constant.
  EXPECT_NEAR(in.logits.grad()[0][0][1].item<double>(), -(1.5 * 1.0 / 2) * (1 - s.p1), 1e-6);
  // Position 2 (the last) predicts nothing: no gradient.
  EXPECT_EQ(in.logits.grad()[0][2].abs().sum().item<double>(), 0.0);
}

TEST(Loss, SequenceTruncatedIsUsesTheProductOfRatios) {
  Small s;
  auto out = run(s.inputs(), IsCorrection::kSeqTis);
  // rho_seq = 2 * 1.25 = 2.5 > 1.5: both tokens weigh 1.5.
  EXPECT_NEAR(out.loss.item<double>(), s.pg(1.5, 1.5), 1e-6);
  EXPECT_NEAR(out.clipped_fraction, 1.0, 1e-9);
}

TEST(Loss, TokenMaskedIsDropsTokensOutsideTheBand) {
  Small s;
  auto out = run(s.inputs(), IsCorrection::kTokenMis);
  EXPECT_NEAR(out.loss.item<double>(), s.pg(0, 1), 1e-6);
  EXPECT_NEAR(out.clipped_fraction, 0.5, 1e-9);
  EXPECT_NEAR(out.clipped_high_fraction, 0.5, 1e-9);  // rho 2 > is_high; 1.25 is inside the band
  EXPECT_EQ(out.clipped_low_fraction, 0.0);
}

TEST(Loss, TokenMaskedIsCountsRatiosBelowTheBandAsLowClips) {
  Small s;
  s.rho1 = 0.5;  // below is_low: masked
  auto out = run(s.inputs(), IsCorrection::kTokenMis);
  EXPECT_NEAR(out.loss.item<double>(), s.pg(0, 1), 1e-6);
  EXPECT_NEAR(out.clipped_low_fraction, 0.5, 1e-9);
  EXPECT_EQ(out.clipped_high_fraction, 0.0);
  EXPECT_NEAR(out.clipped_fraction, 0.5, 1e-9);
}

TEST(Loss, SequenceRatiosStayWithinTheirSequence) {
  // Two packed sequences, vocabulary 2, all logits 0 (p = 1/2 everywhere).
  // Row: tokens [0, 1, 1, 0, 1], positions [0, 1, 2, 0, 1]: seq A predicts t1, t2; seq B predicts t4.
  LossInputs in;
  in.logits = at::zeros({1, 5, 2}, at::kFloat).set_requires_grad(true);
  in.input_ids = at::tensor({0, 1, 1, 0, 1}, at::kLong).view({1, 5});
  in.position_ids = at::tensor({0, 1, 2, 0, 1}, at::kLong).view({1, 5});
  in.loss_mask = at::ones({1, 5}, at::kByte);
  in.advantages = at::ones({1, 5}, at::kFloat);
  const double half = std::log(0.5);
  // Seq A: rho = 1.2 and 1.5 (product 1.8, clipped to 1.6); seq B: rho = 0.5.
  in.inference_logprobs =
      at::tensor({0.0f, float(half - std::log(1.2)), float(half - std::log(1.5)), 0.0f, float(half - std::log(0.5))})
          .view({1, 5});
  LossOptions o;
  o.is_correction = IsCorrection::kSeqTis;
  o.is_high = 1.6;
  auto out = compute_loss(in, o);
  ASSERT_TRUE(out);
  EXPECT_EQ(out->pg_tokens, 3);  // the two sequence starts have no prediction
  EXPECT_NEAR(out->loss.item<double>(), -(1.6 * half + 1.6 * half + 0.5 * half) / 3, 1e-6);
  EXPECT_NEAR(out->clipped_fraction, 2.0 / 3.0, 1e-9);
}

TEST(Loss, CrossEntropyOnWeightedTokens) {
  Small s;
  auto in = s.inputs(true);
  in.advantages.zero_();
  auto out = run(in, IsCorrection::kNone);
  // Position 0 has no prediction, so its weight of 3 does not count.
  const double ce = -(1.0 * std::log(s.p1) + 0.5 * std::log(s.p2)) / 1.5;
  EXPECT_NEAR(out.ce_loss, ce, 1e-6);
  EXPECT_NEAR(out.loss.item<double>(), ce, 1e-6);
  EXPECT_EQ(out.ce_tokens, 2);
}

TEST(Loss, TemperatureScalesTheLogits) {
  Small s;
  auto in = s.inputs();
  LossOptions o;
  o.is_correction = IsCorrection::kNone;
  o.temperature = 2.0;
  auto out = compute_loss(in, o);
  ASSERT_TRUE(out);
  // logits / 2: p1 = sqrt(3) / (1 + sqrt(3)), p2 = 2 / 3.
  const double p1 = std::sqrt(3.0) / (1 + std::sqrt(3.0)), p2 = 2.0 / 3.0;
  EXPECT_NEAR(out->loss.item<double>(), -(1.0 * std::log(p1) - 0.5 * std::log(p2)) / 2, 1e-6);
}

TEST(Loss, RejectsMismatchedShapes) {
  Small s;
  auto in = s.inputs();
  in.advantages = at::zeros({1, 2});
  EXPECT_FALSE(compute_loss(in, {}));
  EXPECT_EQ(parse_is_correction("seq_tis"), IsCorrection::kSeqTis);
  EXPECT_FALSE(parse_is_correction("ppo").has_value());
}

}  // namespace
}  // namespace arlo::reference
