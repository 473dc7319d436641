#include "config/text.h"

#include <gtest/gtest.h>

#include <map>

namespace arlo::config {
namespace {

TEST(EditDistance, CountsEditsAndSwaps) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("abc", ""), 3u);
  EXPECT_EQ(edit_distance("batchsize", "batch_size"), 1u);
  EXPECT_EQ(edit_distance("bathc_size", "batch_size"), 1u);  // neighbouring swap
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
}

TEST(Nearest, SuggestsOnlyPlausibleTypos) {
  const std::vector<std::string> keys = {"batch_size", "group_size", "seq_len"};
  EXPECT_EQ(nearest("batchsize", keys), "batch_size");
  EXPECT_EQ(nearest("seqlen", keys), "seq_len");
  EXPECT_EQ(nearest("completely_different", keys), std::nullopt);
  EXPECT_EQ(nearest("x", {}), std::nullopt);
}

EnvLookup fake_env(std::map<std::string, std::string> vars) {
  return [vars](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(ExpandEnv, ReplacesVariablesAndFallbacks) {
  auto env = fake_env({{"HOME_DIR", "/home/a"}, {"EMPTY", ""}});
  EXPECT_EQ(*expand_env("${HOME_DIR}/runs", env), "/home/a/runs");
  EXPECT_EQ(*expand_env("${MISSING:-x}-${EMPTY:-y}", env), "x-y");
  EXPECT_EQ(*expand_env("${MISSING:-}", env), "");
  EXPECT_EQ(*expand_env("cost $5 and $${HOME_DIR}", env), "cost $5 and ${HOME_DIR}");
  EXPECT_EQ(*expand_env("no vars", env), "no vars");
}

TEST(ExpandEnv, ReportsUnsetAndMalformedReferences) {
  auto env = fake_env({});
  auto unset = expand_env("${RUN_NAME}", env);
  ASSERT_FALSE(unset);
  EXPECT_NE(unset.error().message().find("RUN_NAME is not set"), std::string::npos);
  EXPECT_FALSE(expand_env("${unterminated", env));
  EXPECT_FALSE(expand_env("${}", env));
  EXPECT_FALSE(expand_env("${1BAD}", env));
  EXPECT_FALSE(expand_env("${A B}", env));
}

}  // namespace
}  // namespace arlo::config
