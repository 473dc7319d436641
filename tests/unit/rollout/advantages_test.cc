#include <gtest/gtest.h>

#include <cmath>

#include "rollout/advantages.h"

namespace arlo::rollout {
namespace {

std::vector<SampleInput> rewards(std::initializer_list<double> r) {
  std::vector<SampleInput> out;
  for (double x : r) out.push_back({x, 10, false});
  return out;
}

TEST(Advantages, GrpoUsesGroupMeanAndPopulationStd) {
  // r = {1, 0, 0, 1}: mean 0.5, population std 0.5 -> A = +-1 (eps 0).
  AdvantageOptions o;
  o.std_eps = 0;
  auto g = compute_advantages(rewards({1, 0, 0, 1}), o);
  ASSERT_FALSE(g.group_dropped);
  EXPECT_DOUBLE_EQ(g.advantages[0], 1.0);
  EXPECT_DOUBLE_EQ(g.advantages[1], -1.0);
  EXPECT_DOUBLE_EQ(g.advantages[3], 1.0);
  // r = {2, 4, 9}: mean 5, var (9+1+16)/3 = 26/3.
  g = compute_advantages(rewards({2, 4, 9}), o);
  const double sd = std::sqrt(26.0 / 3.0);
  EXPECT_NEAR(g.advantages[0], -3 / sd, 1e-12);
  EXPECT_NEAR(g.advantages[1], -1 / sd, 1e-12);
  EXPECT_NEAR(g.advantages[2], 4 / sd, 1e-12);
  EXPECT_EQ(g.trainable(), 3u);
}

// The advantages `kind` gives the group of rewards {2, 4, 9}, each against `want` (to 4 ULPs).
void expect_advantages_of_2_4_9(AdvantageKind kind, const std::vector<double>& want) {
  AdvantageOptions o;
  o.kind = kind;
  auto g = compute_advantages(rewards({2, 4, 9}), o);
  ASSERT_EQ(g.advantages.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_DOUBLE_EQ(g.advantages[i], want[i]) << "sample " << i;
}

TEST(Advantages, DrGrpoSubtractsMeanOnly) { expect_advantages_of_2_4_9(AdvantageKind::kDrGrpo, {-3, -1, 4}); }

TEST(Advantages, RlooUsesLeaveOneOutBaseline) {
  // A_0 = 2 - (4+9)/2 = -4.5; A_1 = 4 - (2+9)/2 = -1.5; A_2 = 9 - 3 = 6.
  expect_advantages_of_2_4_9(AdvantageKind::kRloo, {-4.5, -1.5, 6});
  AdvantageOptions o;
  o.kind = AdvantageKind::kRloo;
  auto single = compute_advantages(rewards({1}), o);
  EXPECT_TRUE(single.group_dropped);
}

TEST(Advantages, EqualRewardGroupsAreDroppedUnlessAsked) {
  AdvantageOptions o;
  auto g = compute_advantages(rewards({1, 1, 1}), o);
  EXPECT_TRUE(g.group_dropped);
  EXPECT_EQ(g.drop_reason, "all rewards equal");
  EXPECT_EQ(g.trainable(), 0u);
  o.filter_equal_reward_groups = false;
  g = compute_advantages(rewards({1, 1, 1}), o);
  EXPECT_FALSE(g.group_dropped);
  for (double a : g.advantages) EXPECT_DOUBLE_EQ(a, 0.0);
}

TEST(Advantages, LengthPenaltyIsAppliedBeforeTheBaseline) {
  // Equal raw rewards, lengths 10 and 30, penalty 0.3 normalised by longest (30):
  // r' = {1 - 0.1, 1 - 0.3} = {0.9, 0.7}; dr_grpo: {+0.1, -0.1}.
  AdvantageOptions o;
  o.kind = AdvantageKind::kDrGrpo;
  o.length_penalty = 0.3;
  o.length_norm = 0;
  std::vector<SampleInput> s = {{1, 10, false}, {1, 30, false}};
  auto g = compute_advantages(s, o);
  ASSERT_FALSE(g.group_dropped);
  EXPECT_NEAR(g.advantages[0], 0.1, 1e-12);
  EXPECT_NEAR(g.advantages[1], -0.1, 1e-12);
  o.length_norm = 100;  // fixed normaliser: r' = {0.97, 0.91}
  g = compute_advantages(s, o);
  EXPECT_NEAR(g.advantages[0], 0.03, 1e-12);
  o.length_norm = 1;  // per token (the default): r' = {1 - 3, 1 - 9}; dr_grpo: {+3, -3}
  o.length_penalty = 0.3;
  g = compute_advantages(s, o);
  EXPECT_NEAR(g.advantages[0], 3.0, 1e-12);
}

TEST(Advantages, TruncatedSamplesAreDroppedOrMasked) {
  std::vector<SampleInput> s = {{1, 5, false}, {0, 5, false}, {0, 64, true}};
  AdvantageOptions o;
  o.kind = AdvantageKind::kDrGrpo;
  o.truncated = TruncationPolicy::kDrop;
  auto g = compute_advantages(s, o);  // stats over {1, 0}: mean 0.5
  EXPECT_DOUBLE_EQ(g.advantages[0], 0.5);
  EXPECT_DOUBLE_EQ(g.advantages[1], -0.5);
  EXPECT_EQ(g.fates[2], SampleFate::kDropped);
  EXPECT_DOUBLE_EQ(g.advantages[2], 0);
  EXPECT_EQ(g.trainable(), 2u);

  o.truncated = TruncationPolicy::kMask;
  g = compute_advantages(s, o);  // stats over {1, 0, 0}: mean 1/3
  EXPECT_NEAR(g.advantages[0], 2.0 / 3, 1e-12);
  EXPECT_NEAR(g.advantages[1], -1.0 / 3, 1e-12);
  EXPECT_EQ(g.fates[2], SampleFate::kMasked);
  EXPECT_DOUBLE_EQ(g.advantages[2], 0);

  o.truncated = TruncationPolicy::kKeep;
  g = compute_advantages(s, o);
  EXPECT_NEAR(g.advantages[2], -1.0 / 3, 1e-12);
  EXPECT_EQ(g.trainable(), 3u);
}

TEST(PassAtK, MatchesHandComputedValues) {
  // n=4, c=1, k=1: 1/4. n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5.
  EXPECT_NEAR(*pass_at_k(4, 1, 1), 0.25, 1e-12);
  EXPECT_NEAR(*pass_at_k(4, 1, 2), 0.5, 1e-12);
  // n=5, c=2, k=3: 1 - C(3,3)/C(5,3) = 1 - 1/10.
  EXPECT_NEAR(*pass_at_k(5, 2, 3), 0.9, 1e-12);
  EXPECT_DOUBLE_EQ(*pass_at_k(5, 0, 3), 0.0);
  EXPECT_DOUBLE_EQ(*pass_at_k(5, 3, 3), 1.0);  // n - c < k
  EXPECT_FALSE(pass_at_k(3, 1, 4));
  EXPECT_FALSE(pass_at_k(3, 4, 1));
  std::vector<std::pair<std::size_t, std::size_t>> tasks = {{4, 1}, {4, 4}};
  EXPECT_NEAR(*mean_pass_at_k(tasks, 1), (0.25 + 1.0) / 2, 1e-12);
  std::vector<double> r = {1, 0, 0.5, 0.5};
  EXPECT_DOUBLE_EQ(*avg_at_k(r), 0.5);
  EXPECT_FALSE(avg_at_k(std::span<const double>()));
}

}  // namespace
}  // namespace arlo::rollout
