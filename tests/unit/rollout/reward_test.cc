// Built-in reward modules, weighted composition and the factory's error messages.
#include <gtest/gtest.h>

#include <algorithm>

#include "rollout/reward.h"
#include "tests/log_capture.h"

namespace arlo::rollout {
namespace {

Task task(std::string answer) {
  Task t;
  t.id = "t1";
  t.prompt = "q";
  t.answer = std::move(answer);
  return t;
}

Rollout sample(std::string text, std::size_t tokens = 0) {
  Rollout r;
  r.text = std::move(text);
  r.completion_tokens.assign(tokens, 1);
  return r;
}

double score_of(const Json& spec, const Task& t, const Rollout& r) {
  auto m = make_reward_module(spec);
  EXPECT_TRUE(m) << (m ? "" : m.error().what());
  if (!m) return -999;
  auto s = (*m)->score(t, r);
  EXPECT_TRUE(s) << (s ? "" : s.error().what());
  return s ? s->reward : -999;
}

TEST(Rewards, ExactMatchTrimsAndOptionallyIgnoresCase) {
  EXPECT_EQ(score_of({{"kind", "exact_match"}}, task("68"), sample(" 68\n")), 1.0);
  EXPECT_EQ(score_of({{"kind", "exact_match"}}, task("68"), sample("6 8")), 0.0);
  EXPECT_EQ(score_of({{"kind", "exact_match"}}, task("Abc"), sample("abc")), 0.0);
  EXPECT_EQ(score_of({{"kind", "exact_match"}, {"case_sensitive", false}}, task("Abc"), sample("abc")), 1.0);
}

TEST(Rewards, NumericMatchUsesTheLastNumber) {
  const Json spec = {{"kind", "numeric_match"}};
  EXPECT_EQ(score_of(spec, task("68"), sample("23+45 is 68.")), 1.0);
  EXPECT_EQ(score_of(spec, task("1234"), sample("the answer: 1,234")), 1.0);
  EXPECT_EQ(score_of(spec, task("0.5"), sample("0.50000001")), 1.0);
  EXPECT_EQ(score_of(spec, task("68"), sample("68 or 69")), 0.0);
  EXPECT_EQ(score_of(spec, task("-3"), sample("x=-3")), 1.0);
  EXPECT_EQ(score_of(spec, task("5"), sample("no number")), 0.0);
  auto m = make_reward_module(spec);
  auto bad = (*m)->score(task("none"), sample("5"));
  ASSERT_FALSE(bad);  // an answer without a number is a data error, not a zero
  EXPECT_EQ(*last_number("a 1e3 b"), 1000.0);
}

TEST(Rewards, LcsRatioIsTwiceLcsOverTotalLength) {
  EXPECT_EQ(lcs_length("abcde", "ace"), 3u);
  // "cba" vs "cab": LCS 2 -> 2*2/6.
  EXPECT_NEAR(score_of({{"kind", "lcs_ratio"}}, task("cba"), sample("cab")), 4.0 / 6.0, 1e-12);
  EXPECT_EQ(score_of({{"kind", "lcs_ratio"}}, task("cba"), sample("cba")), 1.0);
  EXPECT_EQ(score_of({{"kind", "lcs_ratio"}}, task("abc"), sample("")), 0.0);
}

TEST(Rewards, RegexMatchAndCapturedAnswer) {
  EXPECT_EQ(score_of({{"kind", "regex_match"}, {"pattern", "^\\d+$"}}, task(""), sample("123")), 1.0);
  EXPECT_EQ(score_of({{"kind", "regex_match"}, {"pattern", "^\\d+$"}}, task(""), sample("12a")), 0.0);
  const Json cmp = {{"kind", "regex_match"}, {"pattern", "<answer>(.*)</answer>"}, {"compare_answer", true}};
  EXPECT_EQ(score_of(cmp, task("42"), sample("think <answer>42</answer>")), 1.0);
  EXPECT_EQ(score_of(cmp, task("42"), sample("<answer>41</answer>")), 0.0);
  auto bad = make_reward_module({{"kind", "regex_match"}, {"pattern", "(unclosed"}});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().what().find("bad pattern"), std::string::npos);
}

TEST(Rewards, LengthPenaltyScalesBetweenFreeAndMaxTokens) {
  const Json spec = {{"kind", "length_penalty"}, {"max_tokens", 110}, {"free_tokens", 10}, {"coef", 0.5}};
  EXPECT_EQ(score_of(spec, task(""), sample("", 10)), 0.0);
  EXPECT_NEAR(score_of(spec, task(""), sample("", 60)), -0.25, 1e-12);
  EXPECT_NEAR(score_of(spec, task(""), sample("", 500)), -0.5, 1e-12);
}

TEST(Rewards, WeightedCompositionSumsAndPrefixesMetrics) {
  const Json spec = Json::array({{{"kind", "exact_match"}, {"weight", 0.8}, {"name", "acc"}},
                                 {{"kind", "length_penalty"}, {"weight", 0.5}, {"max_tokens", 10}}});
  auto m = make_reward_module(spec);
  ASSERT_TRUE(m) << m.error().what();
  auto s = (*m)->score(task("ab"), sample("ab", 5));
  ASSERT_TRUE(s);
  EXPECT_NEAR(s->reward, 0.8 * 1.0 + 0.5 * -0.5, 1e-12);
  EXPECT_EQ(s->metrics.at("acc"), 1.0);
  EXPECT_EQ(s->metrics.at("length_penalty"), -0.5);
  EXPECT_EQ(s->metrics.at("length_penalty/tokens"), 5.0);
  std::vector<Rollout> group = {sample("ab", 0), sample("x", 0)};
  auto g = (*m)->score_group(task("ab"), group);
  ASSERT_TRUE(g);
  EXPECT_NEAR((*g)[0].reward, 0.8, 1e-12);
  EXPECT_NEAR((*g)[1].reward, 0.0, 1e-12);
}

TEST(Rewards, AcceptsTheConfigSchemaShape) {
  // reward.modules entries as the config loader produces them: kind, weight, empty generic keys,
  // a built-in's options under config.
  const Json modules = Json::parse(R"([
    {"kind": "numeric_match", "weight": 1.0, "path": "", "url": "", "pattern": "", "config": {"abs_tol": 0.5}},
    {"kind": "regex_match", "weight": 0.5, "path": "", "url": "", "pattern": "^\\d+$", "config": {}}])");
  auto m = make_reward_module(modules);
  ASSERT_TRUE(m) << m.error().what();
  auto s = (*m)->score(task("68"), sample("68.4"));
  ASSERT_TRUE(s);
  EXPECT_NEAR(s->reward, 1.0, 1e-12);  // numeric within 0.5; regex fails on "68.4"
  auto twice = make_reward_module(Json::parse(R"({"kind": "numeric_match", "abs_tol": 1, "config": {"abs_tol": 2}})"));
  ASSERT_FALSE(twice);
  EXPECT_NE(twice.error().what().find("given twice"), std::string::npos);
}

TEST(Rewards, FactoryErrorsNameTheProblem) {
  auto r = make_reward_module({{"kind", "exact_macth"}});
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find("unknown reward kind 'exact_macth'"), std::string::npos);
  r = make_reward_module({{"kind", "exact_match"}, {"casesensitive", true}});
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find("unknown option 'casesensitive'"), std::string::npos) << r.error().what();
  r = make_reward_module({{"kind", "numeric_match"}, {"rel_tol", "big"}});
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find("wrong type"), std::string::npos);
  r = make_reward_module(Json::array({{{"kind", "exact_match"}}, {{"kind", "nope"}}}));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find("modules[1]"), std::string::npos) << r.error().what();
  r = make_reward_module({{"kind", "http"}, {"url", "ftp://x"}});
  ASSERT_FALSE(r);
}

// "type", the former name of "kind", builds the same module for one release and says so.
TEST(Rewards, TheFormerNameTypeIsReadWithAWarningNamingKind) {
  auto& log = test_log::log_capture();
  const auto before = log.count("'type' is the former name of 'kind'");
  EXPECT_EQ(score_of({{"type", "exact_match"}}, task("68"), sample(" 68\n")), 1.0);
  EXPECT_EQ(log.count("'type' is the former name of 'kind'"), before + 1);
  auto both = make_reward_module({{"type", "exact_match"}, {"kind", "lcs_ratio"}});
  ASSERT_FALSE(both);
  EXPECT_EQ(both.error().message(), "reward spec: give 'kind' (or its former name 'type'), not both");
}

// env: the multi-turn environment's reward; a sample without one fails with the reason.
TEST(Rewards, EnvIsTheEnvironmentsRewardAndFailsWithoutOne) {
  auto m = make_reward_module({{"kind", "env"}});
  ASSERT_TRUE(m) << m.error().what();
  Rollout r = sample("the last turn");
  r.turns = {{"assistant", "3"}, {"user", "no"}, {"assistant", "the last turn"}};
  r.env_reward = 0.75;
  auto s = (*m)->score(task("x"), r);
  ASSERT_TRUE(s) << s.error().what();
  EXPECT_EQ(s->reward, 0.75);
  EXPECT_EQ(s->metrics, (std::map<std::string, double>{{"turns", 2.0}}));
  r.env_reward.reset();
  s = (*m)->score(task("x"), r);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message().find("no environment reward"), std::string::npos) << s.error().message();
  // Weighted with another module, under a name of its own.
  r.env_reward = 1.0;
  EXPECT_NEAR(score_of(Json::array({{{"kind", "env"}, {"weight", 0.5}}, {{"kind", "exact_match"}, {"weight", 0.5}}}),
                       task("the last turn"), r),
              1.0, 1e-12);
}

TEST(Rewards, RegistryHoldsEachKindOnceAndItsErrorsListThem) {
  std::vector<std::string> names;
  for (const auto& k : reward_kinds()) {
    EXPECT_TRUE(k.make) << k.name;
    EXPECT_FALSE(k.doc.empty()) << k.name;
    EXPECT_EQ(std::count(names.begin(), names.end(), k.name), 0) << k.name << " registered twice";
    names.push_back(k.name);
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{"exact_match", "numeric_match", "lcs_ratio", "regex_match", "length_penalty",
                                      "plugin", "http", "code_exec", "weighted", "judge", "env"}));
  // The messages users saw before the registry, word for word.
  auto r = make_reward_module({{"kind", "nope"}});
  ASSERT_FALSE(r);
  EXPECT_EQ(
      r.error().message(),
      "unknown reward kind 'nope': use exact_match, numeric_match, lcs_ratio, regex_match, length_penalty, plugin, "
      "http, code_exec, weighted, judge or env");
  r = make_reward_module({{"kind", "numeric_match"}, {"tol", 1}});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message(),
            "reward 'numeric_match': unknown option 'tol' (known: kind, name, weight, rel_tol, abs_tol)");
  r = make_reward_module({{"kind", "lcs_ratio"}, {"x", 1}});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message(), "reward 'lcs_ratio': unknown option 'x' (known: kind, name, weight)");
  r = make_reward_module({{"kind", "exact_match"}, {"case_sensitive", 1}});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message(), "reward 'exact_match': option 'case_sensitive' has the wrong type (1)");
  r = make_reward_module({{"kind", "regex_match"}});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message(), "reward 'regex_match': needs 'pattern'");
  r = make_reward_module({{"kind", "plugin"}, {"path", ""}, {"config", Json::object()}});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message(), "reward 'plugin': needs 'path' to a shared library");
  // Defaults come from the kind's declared options: length_penalty's max_tokens is 256.
  EXPECT_NEAR(score_of({{"kind", "length_penalty"}, {"free_tokens", 0}}, task(""), sample("", 128)), -0.5, 1e-12);
}

}  // namespace
}  // namespace arlo::rollout
