// The config loader against hostile and mistaken input: every problem is reported with its location,
// nothing crashes, and good input resolves with defaults filled.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <string_view>

#include "config/config.h"

namespace arlo::config {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

EnvLookup fake_env(std::map<std::string, std::string> vars) {
  return [vars](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

Resolution load(const std::string& yaml, std::vector<std::string> sets = {},
                std::map<std::string, std::string> env = {}) {
  LoadOptions options;
  options.overrides = std::move(sets);
  options.env = fake_env(std::move(env));
  return resolve(yaml, "test.yaml", options);
}

std::string all_text(const Resolution& r) {
  std::string out;
  for (const auto& d : r.diagnostics) out += d.text() + "\n";
  return out;
}

// Expects `r` to be refused with a diagnostic holding each of `expected`; returns all the diagnostics'
// text for the test's further checks.
std::string refused(const Resolution& r, std::initializer_list<std::string_view> expected) {
  const std::string text = all_text(r);
  EXPECT_FALSE(r.config) << "loaded although it should be refused";
  for (const auto e : expected) EXPECT_THAT(text, HasSubstr(std::string(e)));
  return text;
}

TEST(ConfigLoad, EmptyFileGivesAllDefaults) {
  Resolution r = load("");
  ASSERT_TRUE(r.config) << all_text(r);
  const Config& c = *r.config;
  EXPECT_EQ(c.integer("orchestrator.batch_size"), 32);
  EXPECT_EQ(c.integer("orchestrator.max_async_level"), 1);
  EXPECT_EQ(c.integer("orchestrator.max_off_policy_steps"), 2);
  EXPECT_EQ(c.integer("weight_sync.bucket_mb"), 256);
  EXPECT_DOUBLE_EQ(c.number("weight_sync.delta_density_threshold"), 0.25);
  EXPECT_TRUE(c.boolean("orchestrator.filter_equal_reward_groups"));
  EXPECT_EQ(c.string("run.dir"), "runs/quickstart");
  EXPECT_EQ(c.string("weight_sync.dir"), "runs/quickstart/weights");
  EXPECT_TRUE(c.strings("sampling.stop").empty());
  ASSERT_EQ(c.objects("reward.modules").size(), 1u);
  EXPECT_EQ(c.objects("reward.modules")[0].string("kind"), "exact_match");
  EXPECT_TRUE(c.objects("reward.modules")[0].map("config").empty());
  EXPECT_EQ(c.where("orchestrator.batch_size"), "default");
  EXPECT_FALSE(c.is_set("orchestrator.batch_size"));
}

TEST(ConfigLoad, ReadsEveryTypeAndRecordsWhereValuesCameFrom) {
  Resolution r = load(
      "run:\n"
      "  name: exp1\n"
      "orchestrator:\n"
      "  batch_size: 0x40\n"
      "  length_penalty: 0.001\n"
      "  filter_equal_reward_groups: false\n"
      "sampling:\n"
      "  stop: [\"\\n\", END]\n"
      "reward:\n"
      "  modules:\n"
      "    - kind: regex_match\n"
      "      pattern: '^[0-9]+$'\n"
      "      weight: 2\n"
      "    - kind: plugin\n"
      "      path: /opt/r.so\n"
      "      config: {threshold: 0.5, names: [a, b], nested: {deep: true}, quoted: \"7\"}\n");
  ASSERT_TRUE(r.config) << all_text(r);
  const Config& c = *r.config;
  EXPECT_EQ(c.integer("orchestrator.batch_size"), 64);
  EXPECT_DOUBLE_EQ(c.number("orchestrator.length_penalty"), 0.001);
  EXPECT_FALSE(c.boolean("orchestrator.filter_equal_reward_groups"));
  EXPECT_EQ(c.strings("sampling.stop"), (std::vector<std::string>{"\n", "END"}));
  EXPECT_EQ(c.string("run.dir"), "runs/exp1");  // the default follows run.name
  const auto& modules = c.objects("reward.modules");
  ASSERT_EQ(modules.size(), 2u);
  EXPECT_DOUBLE_EQ(modules[0].number("weight"), 2.0);
  EXPECT_EQ(modules[0].string("pattern"), "^[0-9]+$");
  EXPECT_DOUBLE_EQ(modules[1].number("weight"), 1.0);  // item default
  const nlohmann::json& cfg = modules[1].map("config");
  EXPECT_DOUBLE_EQ(cfg["threshold"].get<double>(), 0.5);
  EXPECT_EQ(cfg["names"], nlohmann::json({"a", "b"}));
  EXPECT_EQ(cfg["nested"]["deep"], true);
  EXPECT_EQ(cfg["quoted"], "7");  // quoted scalars stay strings
  EXPECT_EQ(c.where("orchestrator.batch_size"), "test.yaml:4:3");
  EXPECT_TRUE(c.is_set("orchestrator.batch_size"));
  EXPECT_EQ(modules[0].where("pattern"), "test.yaml:12:7");
}

TEST(ConfigLoad, UnknownKeyCitesLineColumnAndSuggests) {
  Resolution r = load("orchestrator:\n  group_size: 4\n  batchsize: 8\n");
  ASSERT_FALSE(r.config);
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_EQ(r.diagnostics[0].where, "test.yaml:3:3");
  EXPECT_THAT(r.diagnostics[0].message, HasSubstr("orchestrator.batchsize: unknown key"));
  EXPECT_THAT(r.diagnostics[0].message, HasSubstr("did you mean 'batch_size'?"));
}

TEST(ConfigLoad, UnknownSectionAndMisplacedKeySuggestions) {
  Resolution r = load("orchestrater:\n  batch_size: 8\nbatch_size: 8\nsampling:\n  group_size: 2\n");
  refused(r, {"test.yaml:1:1: unknown section 'orchestrater' (did you mean 'orchestrator'?)",
              "test.yaml:3:1: unknown section 'batch_size' (did you mean 'orchestrator.batch_size'?",
              "test.yaml:5:3: sampling.group_size: unknown key (did you mean 'orchestrator.group_size'?"});
}

TEST(ConfigLoad, CollectsEveryErrorNotJustTheFirst) {
  Resolution r = load(
      "orchestrator:\n"
      "  batch_size: many\n"                 // not an integer
      "  advantage: ppo\n"                   // not an allowed choice
      "  max_async_level: -1\n"              // out of range
      "  filter_equal_reward_groups: yes\n"  // not a boolean
      "sampling:\n"
      "  temperature: \"0.5\"\n"  // quoted number is a string
      "  stop: END\n"             // not a list
      "  top_p: [1]\n");          // not a scalar
  EXPECT_EQ(r.diagnostics.size(), 7u) << all_text(r);
  refused(r, {"test.yaml:2:15: orchestrator.batch_size: expected an integer, got 'many'",
              "test.yaml:3:14: orchestrator.advantage: must be one of grpo, dr_grpo, rloo; got 'ppo'",
              "orchestrator.max_async_level: must be between 0 and 1024, got -1", "expected true or false, got 'yes'",
              "sampling.temperature: expected float, got the quoted string \"0.5\"",
              "sampling.stop: expected a list of strings, got a scalar", "sampling.top_p: expected float, got a list"});
}

TEST(ConfigLoad, MalformedYamlIsOneClearError) {
  for (const std::string bad :
       {"orchestrator: [unclosed\n", "a: b: c\n", "orchestrator:\n  batch_size: 1\n \tx: 2\n", "key: \"unterminated\n",
        "- [\n", "{a: 1", "run: *undefined_alias\n", ", stray comma", "a: 1\n]\n"}) {
    Resolution r = load(bad);
    ASSERT_FALSE(r.config) << bad;
    ASSERT_FALSE(r.diagnostics.empty()) << bad;
    EXPECT_THAT(r.diagnostics[0].text(), HasSubstr("test.yaml")) << bad;
  }
  Resolution r = load("orchestrator:\n  batch_size: [1, 2\n");
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_THAT(r.diagnostics[0].message, HasSubstr("malformed YAML"));
  EXPECT_THAT(r.diagnostics[0].where, HasSubstr("test.yaml:"));
}

TEST(ConfigLoad, RootMustBeAMappingOfSections) {
  for (const std::string bad : {"just a string\n", "- a\n- b\n", "42\n"}) {
    Resolution r = load(bad);
    ASSERT_FALSE(r.config) << bad;
    ASSERT_EQ(r.diagnostics.size(), 1u) << bad;
    EXPECT_THAT(r.diagnostics[0].message, HasSubstr("the top level must be a mapping of sections")) << bad;
  }
  Resolution r = load("orchestrator: 5\nsampling: [a]\n");
  EXPECT_EQ(r.diagnostics.size(), 2u) << all_text(r);
  EXPECT_THAT(all_text(r), HasSubstr("orchestrator: a section must be a mapping of keys, got a scalar"));
  Resolution two_docs = load("run: {name: a}\n---\nrun: {name: b}\n");
  EXPECT_THAT(all_text(two_docs), HasSubstr("only one YAML document is allowed"));
}

TEST(ConfigLoad, DuplicateKeysAreErrors) {
  Resolution r = load("orchestrator:\n  batch_size: 8\n  batch_size: 16\norchestrator: {}\n");
  refused(r, {"test.yaml:3:3: orchestrator.batch_size: key appears twice",
              "test.yaml:4:1: section 'orchestrator' appears twice"});
}

TEST(ConfigLoad, DeepNestingIsAnErrorNotACrash) {
  // Deep enough to hit yaml-cpp's own recursion guard.
  const std::string deep_flow =
      "reward:\n  modules:\n    - kind: plugin\n      path: p\n      config: {a: " + std::string(5000, '[') +
      std::string(5000, ']') + "}\n";
  Resolution r = load(deep_flow);
  ASSERT_FALSE(r.config);
  EXPECT_FALSE(r.diagnostics.empty());

  // Deeper than the free-form map limit but within yaml-cpp's.
  std::string nested = "x";
  for (int i = 0; i < 60; ++i) nested = "{k: " + nested + "}";
  Resolution r2 = load("reward:\n  modules:\n    - kind: plugin\n      path: p\n      config: " + nested + "\n");
  refused(r2, {"nested deeper than 32 levels"});

  // A deep value where a scalar belongs is just the wrong type.
  Resolution r3 = load("orchestrator:\n  batch_size: " + std::string(100, '[') + std::string(100, ']') + "\n");
  EXPECT_THAT(all_text(r3), HasSubstr("expected int, got a list"));
}

TEST(ConfigLoad, AliasBombIsBounded) {
  std::string yaml = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 9; ++i) {
    const std::string n = std::to_string(i);
    yaml += "a";
    yaml += n;
    yaml += ": &a";
    yaml += n;
    yaml += " [";
    for (int j = 0; j < 10; ++j) {
      yaml += j ? ", *a" : "*a";
      yaml += std::to_string(i - 1);
    }
    yaml += "]\n";
  }
  // 10^9 leaves if expanded; used as a free-form map value.
  const std::string bomb = "reward:\n  modules:\n    - kind: plugin\n      path: p\n      config:\n" + [&] {
    std::string indented;
    std::size_t start = 0;
    while (start < yaml.size()) {
      const std::size_t end = yaml.find('\n', start);
      indented += "        " + yaml.substr(start, end - start + 1);
      start = end + 1;
    }
    return indented;
  }();
  Resolution r = load(bomb);
  refused(r, {"more than 100000 values"});
}

TEST(ConfigLoad, HugeNumbers) {
  Resolution r = load(
      "run:\n"
      "  seed: 99999999999999999999999\n"
      "  max_steps: 9223372036854775807\n"
      "sampling:\n"
      "  temperature: 1e999\n"
      "  top_p: .nan\n"
      "orchestrator:\n"
      "  batch_size: -9223372036854775809\n");
  const std::string text = refused(
      r, {"run.seed: integer '99999999999999999999999' is out of range (must fit in 64 bits)",
          "sampling.temperature: number '1e999' is out of range", "sampling.top_p: must be a finite number, got '.nan'",
          "orchestrator.batch_size: integer '-9223372036854775809' is out of range"});
  EXPECT_THAT(text, Not(HasSubstr("run.max_steps")));  // INT64_MAX fits and is >= 1
  EXPECT_EQ(r.diagnostics.size(), 4u) << text;
}

TEST(ConfigLoad, NullMeansEmptyForStringsAndListsButIsAnErrorForNumbers) {
  Resolution r = load("log:\n  file:\nsampling:\n  stop: ~\n");
  ASSERT_TRUE(r.config) << all_text(r);
  EXPECT_EQ(r.config->string("log.file"), "");
  EXPECT_TRUE(r.config->strings("sampling.stop").empty());
  Resolution bad = load("orchestrator:\n  batch_size:\n");
  refused(bad, {"orchestrator.batch_size: needs a value (int)"});
}

TEST(ConfigLoad, ObjectListItemsAreCheckedLikeSections) {
  Resolution r = load(
      "reward:\n"
      "  modules:\n"
      "    - kind: exact_match\n"
      "      wieght: 2\n"
      "    - weight: 1\n"
      "    - kind: plugin\n"
      "    - kind: regex_match\n"
      "      pattern: '(['\n"
      "    - just a string\n");
  refused(r, {"test.yaml:4:7: reward.modules[0].wieght: unknown key (did you mean 'weight'?)",
              "reward.modules[1]: missing required key 'kind'", "reward.modules[4]: expected a mapping, got a scalar"});
  // Cross-key rules run once every key has a well-typed value.
  Resolution rules =
      load("reward:\n  modules:\n    - kind: plugin\n    - kind: regex_match\n      pattern: '(['\n    - kind: http\n");
  refused(rules, {"test.yaml:3:7: reward.modules[0]: kind plugin needs 'path'",
                  "test.yaml:5:7: reward.modules[1].pattern: not a valid regular expression",
                  "reward.modules[2]: kind http needs 'url'"});
  EXPECT_THAT(all_text(load("reward:\n  modules: []\n")), HasSubstr("reward.modules: needs at least 1 item(s), got 0"));
}

TEST(ConfigLoad, CrossKeyRules) {
  Resolution r = load(
      "orchestrator:\n  batch_size: 30\n  group_size: 8\n"
      "env:\n  kind: jsonl\n"
      "inference:\n  launch: external\n"
      "model:\n  hidden: 64\n  heads: 5\n"
      "trainer:\n  num_ranks: 2\n");
  refused(r, {"test.yaml:2:3: orchestrator.batch_size (30) must be a multiple of orchestrator.group_size (8)",
              "test.yaml:5:3: env.path is required when env.kind is jsonl",
              "inference.urls must list the servers when inference.launch is external",
              "model.heads must divide model.hidden",
              "test.yaml:12:3: trainer.num_ranks is 2, but the built-in trainer (trainer.launch: embedded) is one "
              "rank"});
}

TEST(ConfigLoad, TheHttpEnvironmentNeedsAUrl) {
  refused(load("env:\n  kind: http\n  path: tasks.jsonl\n"),
          {"test.yaml:2:3: env.url is required when env.kind is http"});
  refused(load("eval:\n  env_kind: http\n  env_path: tasks.jsonl\n"),
          {"test.yaml:2:3: env.url is required when eval.env_kind is http"});
  Resolution given = load("env:\n  kind: http\n  path: tasks.jsonl\n  url: http://127.0.0.1:8765\n");
  EXPECT_TRUE(given.config) << all_text(given);
}

TEST(ConfigLoad, TheReferenceTrainerNeedsAModelDirectory) {
  refused(load("trainer:\n  launch: hf\n"),
          {"test.yaml:2:3: trainer.model must name a Hugging Face model directory when trainer.launch is hf"});
  refused(load("trainer:\n  launch: hf\n  model: /nonexistent/tiny\n"),
          {"test.yaml:3:3: trainer.model /nonexistent/tiny is not a Hugging Face model directory (no config.json "
           "in it)"});
}

TEST(ConfigLoad, ArloLaunchesArloWorkerAndVllmWithAModel) {
  refused(load("inference:\n  launch: embedded\n  kind: vllm\n"),
          {"test.yaml:2:3: inference.model (or trainer.model) must name the model directory when arlo launches "
           "vLLM"});
  refused(load("inference:\n  launch: embedded\n  kind: sglang\n"),
          {"test.yaml:3:3: inference.kind sglang needs inference.launch: external (arlo launches arlo-worker and "
           "vLLM)"});
}

TEST(ConfigOverrides, SetWinsOverFileAndIsTypeChecked) {
  Resolution r = load("orchestrator:\n  batch_size: 8\n  group_size: 4\n",
                      {"orchestrator.batch_size=16", "sampling.stop=[a, \"b c\"]", "run.name=exp-7",
                       "orchestrator.batch_size=64", "reward.modules=[{kind: numeric_match}]"});
  ASSERT_TRUE(r.config) << all_text(r);
  EXPECT_EQ(r.config->integer("orchestrator.batch_size"), 64);  // the later --set wins
  EXPECT_EQ(r.config->where("orchestrator.batch_size"), "--set orchestrator.batch_size=64");
  EXPECT_EQ(r.config->strings("sampling.stop"), (std::vector<std::string>{"a", "b c"}));
  EXPECT_EQ(r.config->string("run.dir"), "runs/exp-7");
  EXPECT_EQ(r.config->objects("reward.modules")[0].string("kind"), "numeric_match");
}

TEST(ConfigOverrides, BadOverridesCiteTheSetText) {
  Resolution r = load("", {"orchestrator.batch_size=big", "orchestrator.batchsize=8", "no_equals_sign",
                           "sampling.temperature=[1", "weight_sync.keep_last=1"});
  const std::string text =
      refused(r, {"--set orchestrator.batch_size=big: orchestrator.batch_size: expected an integer, got 'big'",
                  "--set orchestrator.batchsize=8: orchestrator.batchsize: unknown key (did you mean "
                  "'orchestrator.batch_size'?)",
                  "--set no_equals_sign: expected --set section.key=value",
                  "--set sampling.temperature=[1: sampling.temperature: the value is not valid YAML",
                  "--set weight_sync.keep_last=1: weight_sync.keep_last: must be between 2 and"});
  EXPECT_EQ(r.diagnostics.size(), 5u) << text;
}

TEST(ConfigEnv, ExpandsVariablesInValues) {
  Resolution r = load("run:\n  name: ${EXP:-fallback}\n  dir: ${ROOT}/runs\norchestrator:\n  batch_size: ${BS}\n",
                      {"log.file=${ROOT}/log.txt"}, {{"ROOT", "/data"}, {"BS", "16"}});
  ASSERT_TRUE(r.config) << all_text(r);
  EXPECT_EQ(r.config->string("run.name"), "fallback");
  EXPECT_EQ(r.config->string("run.dir"), "/data/runs");
  EXPECT_EQ(r.config->integer("orchestrator.batch_size"), 16);
  EXPECT_EQ(r.config->string("log.file"), "/data/log.txt");
}

TEST(ConfigEnv, UnsetVariableIsAnErrorWithLocation) {
  Resolution r = load("run:\n  dir: ${RUN_ROOT}/x\n");
  ASSERT_FALSE(r.config);
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_EQ(r.diagnostics[0].where, "test.yaml:2:8");
  EXPECT_THAT(r.diagnostics[0].message, HasSubstr("run.dir: environment variable RUN_ROOT is not set"));
}

TEST(ConfigYaml, RoundTripsThroughToYaml) {
  Resolution r = load(
      "run:\n  name: \"123\"\n  dir: \"literal $${NOT_EXPANDED}\"\n"
      "sampling:\n  stop: [\"\", \"true\", \"0x10\", \"a: b\"]\n  temperature: 1\n"
      "reward:\n  modules:\n    - kind: plugin\n      path: /p.so\n"
      "      config: {s: \"42\", f: 2.0, i: 3, b: false, n: ~, l: [1, \"x\"], m: {k: v}}\n");
  ASSERT_TRUE(r.config) << all_text(r);
  const std::string printed = r.config->to_yaml();
  Resolution again = load(printed);
  ASSERT_TRUE(again.config) << all_text(again) << printed;
  EXPECT_EQ(again.config->to_yaml(), printed);
  EXPECT_EQ(again.config->string("run.name"), "123");
  EXPECT_EQ(again.config->string("run.dir"), "literal ${NOT_EXPANDED}");
  EXPECT_EQ(again.config->strings("sampling.stop"), (std::vector<std::string>{"", "true", "0x10", "a: b"}));
  EXPECT_DOUBLE_EQ(again.config->number("sampling.temperature"), 1.0);
  EXPECT_EQ(again.config->objects("reward.modules")[0].map("config"),
            r.config->objects("reward.modules")[0].map("config"));
  // Every section and key appears, defaults included.
  EXPECT_THAT(printed, HasSubstr("max_off_policy_steps: 2"));
  EXPECT_THAT(printed, HasSubstr("delta_density_threshold: 0.25"));
}

TEST(ConfigFile, LoadFileReportsMissingAndDirectories) {
  auto missing = load_file("/nonexistent/arlo.yaml");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), ErrorCode::kNotFound);
  auto dir = load_file(std::filesystem::temp_directory_path().string());
  ASSERT_FALSE(dir);
  EXPECT_THAT(dir.error().message(), HasSubstr("is a directory"));

  const auto path =
      std::filesystem::temp_directory_path() / ("arlo_config_test_" + std::to_string(::getpid()) + ".yaml");
  {
    std::ofstream out(path);
    out << "orchestrator:\n  batchsize: 8\n  group_size: x\n";
  }
  auto bad = load_file(path.string());
  ASSERT_FALSE(bad);
  EXPECT_THAT(bad.error().message(), HasSubstr("2 problems in config " + path.string()));
  EXPECT_THAT(bad.error().message(), HasSubstr(path.string() + ":2:3: orchestrator.batchsize: unknown key"));
  std::filesystem::remove(path);
}

TEST(ConfigAccess, MisuseAbortsWithTheKeyName) {
  const Config c = defaults();
  EXPECT_DEATH(c.integer("orchestrator.no_such_key"), "orchestrator.no_such_key: not a declared configuration key");
  EXPECT_DEATH(c.string("orchestrator.batch_size"), "orchestrator.batch_size: is declared as int, read as string");
}

// Former keys (schema.h, FormerKey): for one release a config that uses one still loads, with a
// warning that says what to write instead.
namespace former {

const Schema& schema() {
  static const Schema s({{"a", "", {int_key("new_name", 1, "."), int_key("other", 0, ".")}}}, {},
                        {{"a.old_name", "a.new_name", ""}, {"a.gone", "", "nothing reads it"}});
  return s;
}

Resolution load(const std::string& yaml, std::vector<std::string> sets = {}) {
  LoadOptions options;
  options.overrides = std::move(sets);
  options.env = fake_env({});
  options.schema = &schema();
  return resolve(yaml, "test.yaml", options);
}

}  // namespace former

TEST(ConfigLoad, ARenamedKeyIsReadAsItsNewNameWithAWarning) {
  Resolution r = former::load("a:\n  old_name: 7\n");
  ASSERT_TRUE(r.config) << all_text(r);
  EXPECT_EQ(r.config->integer("a.new_name"), 7);
  EXPECT_EQ(r.config->where("a.new_name"), "test.yaml:2:3");
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_EQ(r.warnings[0].where, "test.yaml:2:3");
  EXPECT_THAT(r.warnings[0].message, HasSubstr("a.old_name is renamed a.new_name: write a.new_name"));
  Resolution s = former::load("", {"a.old_name=9"});
  ASSERT_TRUE(s.config) << all_text(s);
  EXPECT_EQ(s.config->integer("a.new_name"), 9);
  ASSERT_EQ(s.warnings.size(), 1u);
}

TEST(ConfigLoad, ARenamedKeyGivenTogetherWithItsNewNameIsAnError) {
  for (const char* yaml : {"a:\n  old_name: 7\n  new_name: 8\n", "a:\n  new_name: 8\n  old_name: 7\n"}) {
    Resolution r = former::load(yaml);
    EXPECT_FALSE(r.config) << yaml;
    EXPECT_THAT(all_text(r), HasSubstr("given twice")) << yaml;
  }
  // A --set of the new name overrides a file that used the former one.
  Resolution r = former::load("a:\n  old_name: 7\n", {"a.new_name=8"});
  ASSERT_TRUE(r.config) << all_text(r);
  EXPECT_EQ(r.config->integer("a.new_name"), 8);
}

TEST(ConfigLoad, ARetiredKeyIsIgnoredWithAWarningThatSaysWhy) {
  Resolution r = former::load("a:\n  gone: 3\n  other: 2\n");
  ASSERT_TRUE(r.config) << all_text(r);
  EXPECT_EQ(r.config->integer("a.other"), 2);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_THAT(r.warnings[0].message, HasSubstr("a.gone is retired and has no effect: nothing reads it; remove it"));
  // The product's ckpt.keep is such a key.
  Resolution p = load("ckpt:\n  keep: 3\n");
  ASSERT_TRUE(p.config) << all_text(p);
  ASSERT_EQ(p.warnings.size(), 1u);
  EXPECT_THAT(p.warnings[0].message, HasSubstr("ckpt.keep is retired"));
}

}  // namespace
}  // namespace arlo::config
