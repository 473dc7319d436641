// env.sources in `arlo run` (session/rollout_parts.cc): the task mix in its ratio with tasks named by
// source, the eval set of each source, the resume cursor, the reward modules chosen per source with
// their per-source metrics, multi-turn environments by source name, check-config's errors naming
// env.sources[i].key, each source's own sampling, and a single-source config whose cursor is what it
// was.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "session/config_options.h"
#include "session/gateway.h"
#include "session/rollout_parts.h"
#include "session/verifiers_env.h"
#include "tests/unit/session/session_test_util.h"

namespace arlo::session {
namespace {

const char* kTwoSources = R"(run: {name: t}
eval: {interval: 5, size: 3}
env:
  sources:
    - {kind: arithmetic, ratio: 2, options: {max_operand: 30}}
    - kind: reverse_text
      name: rev
      seed: 5
      reward: [{kind: lcs_ratio}]
)";

Result<config::Config> load_yaml(const std::string& yaml) { return config::load_string(yaml, "<test>", {}); }

RolloutParts parts_of(const std::string& yaml) {
  auto cfg = load_yaml(yaml);
  EXPECT_TRUE(cfg) << cfg.error().what();
  auto parts = build_rollout_parts(*cfg);
  EXPECT_TRUE(parts) << parts.error().what();
  return *parts;
}

TEST(RunSources, TasksComeInTheRatioNamedBySource) {
  auto parts = parts_of(kTwoSources);
  RunTasks tasks(parts.stream, parts.tokenize);
  std::string pattern;
  for (int i = 0; i < 9; ++i) {
    auto t = tasks.next();
    ASSERT_TRUE(t) << t.error().what();
    pattern += t->env == "rev" ? 'r' : t->env == "arithmetic" ? 'a' : '?';
    EXPECT_FALSE(t->prompt_tokens.empty());  // prepared for arlo-worker as before
  }
  EXPECT_EQ(pattern, "araaraara");
  ASSERT_EQ(parts.eval_tasks.size(), 6u);  // eval.size of each source
  EXPECT_EQ(parts.eval_tasks[0].env, "arithmetic");
  EXPECT_EQ(parts.eval_tasks[5].env, "rev");
}

TEST(RunSources, ResumeContinuesTheMix) {
  auto a = parts_of(kTwoSources);
  RunTasks first(a.stream, a.tokenize);
  for (int i = 0; i < 11; ++i) ASSERT_TRUE(first.next());
  auto b = parts_of(kTwoSources);
  RunTasks second(b.stream, b.tokenize);
  ASSERT_TRUE(second.restore(first.cursor())) << first.cursor().dump();
  for (int i = 0; i < 20; ++i) {
    auto x = first.next(), y = second.next();
    ASSERT_EQ(x->id, y->id);
    ASSERT_EQ(x->env, y->env);
  }
}

TEST(RunSources, EachSourceItsOwnRewardModules) {
  auto parts = parts_of(kTwoSources);
  Task rev;
  rev.env = "rev";
  rev.prompt = "reverse abcd:";
  rev.answer = "dcba";
  rollout::Rollout r;
  r.text = "dcbx";
  auto own = parts.reward->score(rev, r);  // lcs_ratio: partial credit
  ASSERT_TRUE(own) << own.error().what();
  EXPECT_GT(own->reward, 0.5);
  EXPECT_LT(own->reward, 1.0);
  EXPECT_EQ(own->metrics.at("source/rev/share"), 1.0);
  EXPECT_EQ(own->metrics.at("source/rev/reward"), own->reward);
  Task sum = rev;
  sum.env = "arithmetic";  // reward.modules: exact_match
  auto fallback = parts.reward->score(sum, r);
  ASSERT_TRUE(fallback);
  EXPECT_EQ(fallback->reward, 0.0);
  EXPECT_EQ(fallback->metrics.count("source/arithmetic/share"), 1u);
}

TEST(RunSources, CheckConfigNamesTheSourceAndKey) {
  auto cfg = load_yaml(R"(env:
  sources:
    - {kind: arithmetic, options: {max_opernd: 3}, sampling: {temprature: 0.5}}
    - {kind: jsonl, sampling: {top_p: 2, stop: 3}}
    - {kind: arithmetic, options: {max_operand: 0}, reward: [{kind: regex_match}]}
)");
  ASSERT_FALSE(cfg);
  const std::string e = cfg.error().what();
  EXPECT_NE(e.find("env.sources[0].sampling: unknown option 'temprature'"), std::string::npos) << e;
  EXPECT_NE(e.find("env.sources[1].sampling.top_p"), std::string::npos) << e;
  EXPECT_NE(e.find("env.sources[1].sampling.stop: must be a list of strings"), std::string::npos) << e;
  EXPECT_NE(e.find("env.sources[0].options: unknown option 'max_opernd'"), std::string::npos) << e;
  EXPECT_NE(e.find("env.sources[1].path is required when its kind is jsonl"), std::string::npos) << e;
  EXPECT_NE(e.find("env.sources[2].options.max_operand"), std::string::npos) << e;
  EXPECT_NE(e.find("env.sources[2].name: 'arithmetic' is also env.sources[0]'s name"), std::string::npos) << e;
  EXPECT_NE(e.find("env.sources[2].reward[0]: kind regex_match needs 'pattern'"), std::string::npos) << e;
  auto bad_ratio = load_yaml("env:\n  sources: [{kind: arithmetic, ratio: 0}]\n");
  ASSERT_FALSE(bad_ratio);
  EXPECT_NE(std::string(bad_ratio.error().what()).find("env.sources[0].ratio"), std::string::npos)
      << bad_ratio.error().what();
}

// env.sources[].sampling: the named keys override the sampling section for that source's training
// rollouts (Options::source_sampling, by source name); a source without it uses the section (bad keys
// and values: CheckConfigNamesTheSourceAndKey).
TEST(RunSources, EachSourceItsOwnSampling) {
  auto cfg = load_yaml(R"(sampling: {temperature: 1.0, max_tokens: 16, stop: ["\n"]}
env:
  sources:
    - {kind: arithmetic, sampling: {temperature: 0.5, max_tokens: 4}}
    - {kind: reverse_text, name: rev}
)");
  ASSERT_TRUE(cfg) << cfg.error().what();
  auto o = options_from_config(*cfg);
  ASSERT_TRUE(o) << o.error().what();
  ASSERT_EQ(o->source_sampling.size(), 1u);
  const auto& a = o->source_sampling.at("arithmetic");
  EXPECT_EQ(a.temperature, 0.5);
  EXPECT_EQ(a.max_tokens, 4);
  EXPECT_EQ(a.stop, std::vector<std::string>{"\n"});  // not overridden: the section's
  EXPECT_EQ(o->sampling.max_tokens, 16);
}

TEST(RunSources, MultiTurnSourcesFindTheirEnvironmentByName) {
  auto parts = parts_of(R"(env:
  sources:
    - {kind: arithmetic}
    - {kind: arithmetic_retry, name: retry, options: {max_tries: 2}}
)");
  ASSERT_TRUE(parts.environments.contains("retry"));
  EXPECT_NE(parts.environments.at("retry"), nullptr);  // the tasks named "retry" run several turns
  EXPECT_EQ(parts.environments.at("arithmetic"), nullptr);
}

TEST(RunSources, OneSourceKeepsItsCursorAndNames) {
  auto parts = build_rollout_parts(test::load({}));
  ASSERT_TRUE(parts) << parts.error().what();
  RunTasks tasks(parts->stream, parts->tokenize);
  auto t = tasks.next();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->env, "arithmetic");
  const auto c = tasks.cursor();
  EXPECT_EQ(c["seq"], 1);
  EXPECT_EQ(c["stream"]["source"], "arithmetic");  // TaskStream's own cursor, as before env.sources
  Task task = *t;
  rollout::Rollout r;
  r.text = task.answer;
  auto s = parts->reward->score(task, r);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->reward, 1.0);
  EXPECT_EQ(s->metrics.count("source/arithmetic/share"), 0u);  // no per-source metrics without sources
}

// A verifiers source beside a built-in one and a second verifiers source: each its own environment
// (its child, its tasks' env, its options with defaults), served through the gateway.
const char* kVerifiersSources = R"(env:
  sources:
    - {kind: verifiers, name: echo, path: /nonexistent/echo.jsonl, options: {verifiers_env: arlo_vf_echo}}
    - {kind: arithmetic}
    - kind: verifiers
      path: /nonexistent/tools.jsonl
      options: {verifiers_env: arlo_vf_tools, verifiers_launch: external, verifiers_address: "tcp://127.0.0.1:1"}
)";

TEST(RunSources, EachVerifiersSourceItsOwnEnvironment) {
  auto cfg = load_yaml(kVerifiersSources);
  ASSERT_TRUE(cfg) << cfg.error().what();
  EXPECT_TRUE(gateway_enabled(*cfg));
  auto sources = verifiers_sources(*cfg);
  ASSERT_TRUE(sources) << sources.error().what();
  ASSERT_EQ(sources->size(), 2u);
  EXPECT_EQ((*sources)[0].envs, std::vector<std::string>{"echo"});
  EXPECT_EQ((*sources)[0].child, "verifiers-env-echo");
  EXPECT_EQ((*sources)[0].where, "env.sources[0].options");
  EXPECT_EQ((*sources)[0].options.value("verifiers_env", ""), "arlo_vf_echo");
  EXPECT_EQ((*sources)[0].options.value("verifiers_launch", ""), "embedded");  // the default, filled in
  EXPECT_EQ((*sources)[1].envs, std::vector<std::string>{"verifiers"});        // its name: the kind
  EXPECT_EQ((*sources)[1].child, "verifiers-env-verifiers");
  auto external = VerifiersEnv::create((*sources)[1], "token");
  ASSERT_TRUE(external) << external.error().what();
  EXPECT_EQ((*external)->address(), "tcp://127.0.0.1:1");
  EXPECT_FALSE((*external)->child());  // external: no child to start
  auto embedded = VerifiersEnv::create((*sources)[0], "token");
  ASSERT_TRUE(embedded) << embedded.error().what();
  ASSERT_TRUE((*embedded)->child());
  EXPECT_EQ((*embedded)->child()->name, "verifiers-env-echo");
}

// eval.env_kind verifiers: eval's tasks (env "verifiers") run on the environment of the
// env.verifiers_* keys: a source's when its options are the same, else its own; a source named
// "verifiers" with other options is refused.
TEST(RunSources, EvalRunsOnTheVerifiersEnvironmentOfTheEnvKeys) {
  const std::string eval = "eval: {interval: 5, env_kind: verifiers, env_path: /nonexistent/eval.jsonl}\n";
  auto shared = load_yaml(eval +
                          "env: {verifiers_env: arlo_vf_echo, sources: [{kind: verifiers, name: echo, "
                          "path: /x.jsonl, options: {verifiers_env: arlo_vf_echo}}, {kind: arithmetic}]}\n");
  ASSERT_TRUE(shared) << shared.error().what();
  auto one = verifiers_sources(*shared);
  ASSERT_TRUE(one) << one.error().what();
  ASSERT_EQ(one->size(), 1u) << (*one)[0].options.dump() << (*one).back().options.dump();
  EXPECT_EQ((*one)[0].envs, (std::vector<std::string>{"echo", "verifiers"}));
  auto own = load_yaml(eval + "env: {verifiers_env: arlo_vf_tools}\n");  // env.kind arithmetic
  ASSERT_TRUE(own) << own.error().what();
  EXPECT_TRUE(gateway_enabled(*own));
  auto two = verifiers_sources(*own);
  ASSERT_TRUE(two) << two.error().what();
  ASSERT_EQ(two->size(), 1u);
  EXPECT_EQ((*two)[0].child, "verifiers-env");  // the env.verifiers_* keys' environment
  EXPECT_EQ((*two)[0].options.value("verifiers_env", ""), "arlo_vf_tools");
  auto clash = load_yaml(eval +
                         "env: {verifiers_env: arlo_vf_tools, sources: [{kind: verifiers, path: /x.jsonl, "
                         "options: {verifiers_env: arlo_vf_echo}}]}\n");
  ASSERT_TRUE(clash) << clash.error().what();
  auto refused = verifiers_sources(*clash);
  ASSERT_FALSE(refused);
  EXPECT_NE(std::string(refused.error().what()).find("give that source another name"), std::string::npos)
      << refused.error().what();
  auto none = load_yaml("env: {kind: arithmetic}\n");
  ASSERT_TRUE(none);
  EXPECT_FALSE(gateway_enabled(*none));
  EXPECT_TRUE(verifiers_sources(*none)->empty());
}

TEST(RunSources, CheckConfigNamesTheVerifiersSourceAndKey) {
  auto cfg = load_yaml(R"(env:
  sources:
    - {kind: verifiers, path: /x.jsonl, options: {verifiers_launch: external}}
    - {kind: verifiers, name: b, path: /y.jsonl, options: {verifiers_env: e, verifiers_args: 3, verifiers_concurency: 1}}
)");
  ASSERT_FALSE(cfg);
  const std::string e = cfg.error().what();
  EXPECT_NE(e.find("env.sources[0].options.verifiers_env is required when its kind is verifiers"), std::string::npos)
      << e;
  EXPECT_NE(e.find("env.sources[0].options.verifiers_address is required when verifiers_launch is external"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("env.sources[1].options: unknown option 'verifiers_concurency'"), std::string::npos) << e;
}

}  // namespace
}  // namespace arlo::session
