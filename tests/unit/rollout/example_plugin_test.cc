// The plugin SDK end to end: install the header with `cmake --install --component arlo_plugin_sdk`,
// configure and build examples/reward_plugin out of tree against that prefix, load the result.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "rollout/reward.h"

namespace arlo::rollout {
namespace {

namespace fs = std::filesystem;

// From the test environment, else the values baked in at configure time.
std::string env(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// Runs a shell command, its output appended to `log`; returns the exit status.
int sh(const std::string& cmd, const fs::path& log) {
  return std::system((cmd + " >>" + log.string() + " 2>&1").c_str());
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ExamplePlugin, BuildsOutOfTreeFromTheInstalledHeaderAndLoads) {
  const std::string source = env("ARLO_SOURCE_DIR", ARLO_TEST_SOURCE_DIR),
                    build = env("ARLO_BUILD_DIR", ARLO_TEST_BUILD_DIR);
  ASSERT_FALSE(source.empty() || build.empty()) << "run through ctest (ARLO_SOURCE_DIR/ARLO_BUILD_DIR)";
  std::string tmpl = (fs::temp_directory_path() / "arlo_plugin_sdk_XXXXXX").string();
  const fs::path root = mkdtemp(tmpl.data());
  const fs::path prefix = root / "prefix", out = root / "build", log = root / "log.txt";
  const std::string cmake = ARLO_CMAKE_COMMAND;

  ASSERT_EQ(sh(cmake + " --install " + build + " --prefix " + prefix.string() + " --component arlo_plugin_sdk", log), 0)
      << slurp(log);
  ASSERT_TRUE(fs::exists(prefix / "include" / "arlo" / "reward_plugin.h")) << slurp(log);
  ASSERT_EQ(sh(cmake + " -S " + source + "/examples/reward_plugin -B " + out.string() +
                   " -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=" + prefix.string(),
               log),
            0)
      << slurp(log);
  ASSERT_EQ(sh(cmake + " --build " + out.string(), log), 0) << slurp(log);
  const fs::path lib = out / "libarlo_keyword_reward.so";
  ASSERT_TRUE(fs::exists(lib)) << slurp(log);

  auto module = make_reward_module({{"kind", "plugin"}, {"path", lib.string()}, {"config", "keyword=cba;bonus=0.5"}});
  ASSERT_TRUE(module) << module.error().what();
  EXPECT_EQ((*module)->name(), "keyword");  // the plugin table names it
  Task t;
  t.id = "t";
  t.prompt = "reverse abc:";
  t.answer = "cba";
  Rollout r;
  r.text = "it is cba";
  r.finish_reason = FinishReason::kStop;
  auto s = (*module)->score(t, r);
  ASSERT_TRUE(s) << s.error().what();
  EXPECT_EQ(s->reward, 1.5);
  EXPECT_EQ(s->metrics.at("found"), 1.0);
  EXPECT_EQ(s->metrics.at("chars"), 9.0);

  // The config schema's form: a mapping handed over as JSON text.
  const Json schema_form = {{"kind", "plugin"}, {"weight", 1.0}, {"path", lib.string()},
                            {"url", ""},        {"pattern", ""}, {"config", {{"keyword", ""}, {"bonus", 0.25}}}};
  auto from_schema = make_reward_module(Json::array({schema_form}));
  ASSERT_TRUE(from_schema) << from_schema.error().what();
  s = (*from_schema)->score(t, r);  // empty keyword: the task's answer "cba"
  ASSERT_TRUE(s) << s.error().what();
  EXPECT_EQ(s->reward, 1.25);

  auto bad = make_reward_module({{"kind", "plugin"}, {"path", lib.string()}, {"config", "nope"}});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().what().find("config must be"), std::string::npos) << bad.error().what();
  fs::remove_all(root);
}

}  // namespace
}  // namespace arlo::rollout
