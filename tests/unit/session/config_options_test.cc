// The run's orchestrator options read from a loaded configuration (session/config_options.h).
#include <gtest/gtest.h>

#include "session/config_options.h"

namespace arlo::session {
namespace {

TEST(Options, EvalPassKAndCorrectThresholdComeFromTheConfig) {
  auto cfg = config::load_string("eval:\n  k: 8\n  pass_k: [1, 4, 8]\n  correct_threshold: 0.5\n");
  ASSERT_TRUE(cfg) << cfg.error().what();
  auto o = options_from_config(*cfg);
  ASSERT_TRUE(o) << o.error().what();
  EXPECT_EQ(o->eval_pass_k, (std::vector<int>{1, 4, 8}));
  EXPECT_DOUBLE_EQ(o->eval_correct_threshold, 0.5);
  // Unset: pass@1 and pass@k.
  auto dflt = options_from_config(*config::load_string("eval:\n  k: 4\n"));
  ASSERT_TRUE(dflt);
  EXPECT_EQ(dflt->eval_pass_k, (std::vector<int>{1, 4}));
  // A k outside 1..eval.k, or not a number, is refused where it is written.
  for (const char* bad : {"eval:\n  k: 4\n  pass_k: [1, 5]\n", "eval:\n  k: 4\n  pass_k: [one]\n"}) {
    auto c = config::load_string(bad, "bad.yaml");
    ASSERT_FALSE(c) << bad;
    EXPECT_NE(c.error().what().find("eval.pass_k"), std::string::npos) << c.error().what();
    EXPECT_NE(c.error().what().find("bad.yaml"), std::string::npos) << c.error().what();
  }
}

// env.max_turns, env.max_trajectory_tokens and env.step_timeout_s bound a multi-turn trajectory; each
// must be positive.
TEST(Options, MultiTurnLimitsComeFromTheEnvSection) {
  auto dflt = options_from_config(*config::load_string("run:\n  max_steps: 1\n"));
  ASSERT_TRUE(dflt);
  EXPECT_EQ(dflt->max_turns, 8);
  EXPECT_EQ(dflt->max_trajectory_tokens, 1024);
  EXPECT_EQ(dflt->env_timeout, std::chrono::seconds(30));
  auto cfg = config::load_string("env:\n  max_turns: 3\n  max_trajectory_tokens: 200\n  step_timeout_s: 2.5\n");
  ASSERT_TRUE(cfg) << cfg.error().what();
  auto o = options_from_config(*cfg);
  ASSERT_TRUE(o) << o.error().what();
  EXPECT_EQ(o->max_turns, 3);
  EXPECT_EQ(o->max_trajectory_tokens, 200);
  EXPECT_EQ(o->env_timeout, std::chrono::milliseconds(2500));
  for (const char* bad :
       {"env:\n  max_turns: 0\n", "env:\n  max_trajectory_tokens: 0\n", "env:\n  step_timeout_s: 0\n"}) {
    auto c = config::load_string(bad, "bad.yaml");
    ASSERT_FALSE(c) << bad;
    EXPECT_NE(c.error().what().find("bad.yaml"), std::string::npos) << c.error().what();
  }
}

}  // namespace
}  // namespace arlo::session
