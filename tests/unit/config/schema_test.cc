// The product schema itself: its defaults load, its docs are complete, and the checked-in
// docs/configuration.md is what the schema generates.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "config/config.h"
#include "rollout/admin.h"
#include "rollout/environment.h"
#include "rollout/reward.h"

namespace arlo::config {
namespace {

void check_keys(const std::string& prefix, const std::vector<Key>& keys) {
  std::set<std::string> names;
  for (const auto& key : keys) {
    const std::string path = prefix + key.name;
    EXPECT_TRUE(names.insert(key.name).second) << path << " declared twice";
    EXPECT_FALSE(key.doc.empty()) << path << " has no documentation";
    EXPECT_FALSE(key.doc.ends_with(" ")) << path;
    if (!key.choices.empty() && key.type == Type::kString && !key.required) {
      const auto& def = std::get<std::string>(key.default_value);
      EXPECT_NE(std::find(key.choices.begin(), key.choices.end(), def), key.choices.end())
          << path << ": default '" << def << "' is not one of its choices";
    }
    if (key.type == Type::kObjectList) check_keys(path + "[].", key.item_keys);
  }
}

TEST(ProductSchema, EveryKeyIsDocumentedAndDefaultsAreConsistent) {
  const Schema& schema = product_schema();
  std::set<std::string> sections;
  for (const auto& section : schema.sections()) {
    EXPECT_TRUE(sections.insert(section.name).second) << section.name;
    EXPECT_FALSE(section.doc.empty()) << section.name;
    check_keys(section.name + ".", section.keys);
  }
  for (const char* name : {"run", "orchestrator", "sampling", "env", "eval", "reward", "inference", "model", "trainer",
                           "bridge", "weight_sync", "log", "ckpt", "status"}) {
    EXPECT_TRUE(sections.contains(name)) << name;
  }
}

TEST(ProductSchema, DefaultsLoadCleanlyAndTemplatesAreFilled) {
  LoadOptions options;
  options.env = [](std::string_view) -> std::optional<std::string> { return std::nullopt; };
  Resolution r = resolve("", "defaults", options);
  ASSERT_TRUE(r.config) << (r.diagnostics.empty() ? "" : r.diagnostics[0].text());
  for (const auto& section : product_schema().sections()) {
    for (const auto& key : section.keys) {
      if (key.type != Type::kString) continue;
      const std::string& value = r.config->string(section.name + "." + key.name);
      EXPECT_EQ(value.find('{'), std::string::npos) << section.name << "." << key.name << " = " << value;
    }
  }
}

// The kinds a config may name, and their keys, are the registered extensions' (common/registry.h).
TEST(ProductSchema, KindsAndTheirKeysComeFromTheRegistries) {
  const Schema& schema = product_schema();
  std::vector<std::string> reward_kinds;
  for (const auto& k : rollout::reward_kinds())
    if (k.in_config) reward_kinds.push_back(k.name);
  const Key* modules = schema.find_key("reward.modules");
  ASSERT_TRUE(modules);
  auto item = [&](std::string_view name) -> const Key* {
    for (const auto& k : modules->item_keys)
      if (k.name == name) return &k;
    return nullptr;
  };
  ASSERT_TRUE(item("kind"));
  EXPECT_EQ(item("kind")->choices, reward_kinds);
  EXPECT_THAT(reward_kinds, ::testing::Not(::testing::Contains("weighted")));
  ASSERT_TRUE(item("pattern"));
  EXPECT_EQ(item("pattern")->doc, "regex_match: ECMAScript regular expression to search for.");
  ASSERT_TRUE(item("isolate"));
  EXPECT_EQ(std::get<std::string>(item("isolate")->default_value),
            "process");  // the config's default, not the library's
  EXPECT_EQ(item("isolate")->choices, (std::vector<std::string>{"none", "process"}));
  ASSERT_TRUE(item("config"));
  EXPECT_THAT(item("config")->doc, ::testing::HasSubstr("numeric_match: rel_tol (float, 1e-06: relative tolerance)"));

  EXPECT_EQ(schema.find_key("inference.kind")->choices, entry_names(rollout::admin_dialects()));
  EXPECT_EQ(schema.find_key("inference.kind")->doc,
            "Server dialect for admin calls: arlo (arlo-worker), vllm, sglang.");
  EXPECT_EQ(schema.find_key("env.kind")->choices, entry_names(rollout::environment_kinds()));
  EXPECT_THAT(schema.find_key("eval.env_kind")->choices, ::testing::Contains("reverse_text"));
  for (const auto& kind : rollout::environment_kinds())
    for (const auto& o : kind.options) {
      const Key* key = schema.find_key("env." + o.key);
      ASSERT_TRUE(key) << kind.name << " option " << o.key << " is no env key";
      EXPECT_THAT(key->doc, ::testing::HasSubstr(kind.name + ": " + o.doc));  // kinds may share a key
      EXPECT_EQ(key->min, o.min);
      EXPECT_EQ(key->max, o.max);
    }
  EXPECT_EQ(std::get<std::int64_t>(schema.find_key("env.max_operand")->default_value), 20);
}

TEST(ProductSchema, DocsAreUpToDate) {
  const char* source_dir = std::getenv("ARLO_SOURCE_DIR");
  ASSERT_NE(source_dir, nullptr) << "ARLO_SOURCE_DIR is set by ctest";
  const std::string path = std::string(source_dir) + "/docs/configuration.md";
  std::ifstream in(path, std::ios::binary);
  std::ostringstream checked_in;
  checked_in << in.rdbuf();
  const std::string generated = generate_markdown(product_schema());
  EXPECT_TRUE(checked_in.str() == generated) << path << " is out of date with config/schema.cc. Regenerate it with:\n"
                                             << "  arlo config-doc --output docs/configuration.md\n"
                                             << "(the binary is build/apps/arlo/arlo)";
}

TEST(ProductSchema, MarkdownListsEveryKey) {
  const std::string doc = generate_markdown(product_schema());
  for (const auto& section : product_schema().sections()) {
    EXPECT_NE(doc.find("\n## " + section.name + "\n"), std::string::npos) << section.name;
    for (const auto& key : section.keys) EXPECT_NE(doc.find("| `" + key.name + "` |"), std::string::npos) << key.name;
  }
  EXPECT_EQ(doc, generate_markdown(product_schema()));  // deterministic
}

}  // namespace
}  // namespace arlo::config
