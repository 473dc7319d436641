// write_file_atomically: the file holds the old contents or the new, never part; failures name the
// file and leave nothing behind; concurrent writers to one path never share a temporary file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/file.h"

namespace arlo {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> names(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}

class AtomicFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("arlo_file_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, ec);
    fs::remove_all(dir_, ec);
  }
  fs::path dir_;
};

TEST_F(AtomicFile, CreatesParentsReplacesContentsAndLeavesNoTemporary) {
  const fs::path p = dir_ / "a" / "b" / "state.json";
  ASSERT_TRUE(write_file_atomically(p, "first"));
  EXPECT_EQ(slurp(p), "first");
  const std::string big(3 << 20, 'x');  // several write() calls
  ASSERT_TRUE(write_file_atomically(p, big));
  EXPECT_EQ(slurp(p), big);
  ASSERT_TRUE(write_file_atomically(p, ""));
  EXPECT_EQ(slurp(p), "");
  EXPECT_EQ(names(p.parent_path()), std::vector<std::string>{"state.json"});
}

TEST_F(AtomicFile, FailureNamesTheFileAndKeepsTheOldContents) {
  const fs::path p = dir_ / "summary.json";
  ASSERT_TRUE(write_file_atomically(p, "old"));
  if (::geteuid() != 0) {  // root ignores directory permissions
    fs::permissions(dir_, fs::perms::owner_read | fs::perms::owner_exec);
    auto st = write_file_atomically(p, "new");
    ASSERT_FALSE(st);
    EXPECT_NE(st.error().what().find(dir_.string()), std::string::npos) << st.error().what();
    fs::permissions(dir_, fs::perms::owner_all);
    EXPECT_EQ(slurp(p), "old");
  }
  // A directory where the file should be: the rename fails, the temporary is removed.
  const fs::path blocked = dir_ / "blocked";
  fs::create_directories(blocked / "inside");
  auto st = write_file_atomically(blocked, "data");
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().what().find("blocked"), std::string::npos) << st.error().what();
  EXPECT_TRUE(fs::is_directory(blocked));
  for (const auto& n : names(dir_)) EXPECT_EQ(n.find(".tmp."), std::string::npos) << "left behind: " << n;
  EXPECT_EQ(slurp(p), "old");
}

TEST_F(AtomicFile, ConcurrentWritersLeaveOneWholeFile) {
  const fs::path p = dir_ / "latest";
  std::vector<std::thread> writers;
  for (int t = 0; t < 4; ++t)
    writers.emplace_back([&, t] {
      const std::string body(1 << 16, static_cast<char>('a' + t));
      for (int i = 0; i < 50; ++i) EXPECT_TRUE(write_file_atomically(p, body));
    });
  for (auto& w : writers) w.join();
  const std::string got = slurp(p);
  ASSERT_EQ(got.size(), 1u << 16);
  EXPECT_EQ(got, std::string(got.size(), got[0])) << "the file mixes two writers";
  EXPECT_EQ(names(dir_), std::vector<std::string>{"latest"});
}

TEST_F(AtomicFile, APartialLastLineIsDroppedAndWholeLinesAreKept) {
  fs::create_directories(dir_);
  const fs::path p = dir_ / "log.jsonl";
  EXPECT_TRUE(arlo::drop_partial_last_line(p).has_value());  // no file: nothing to do
  EXPECT_FALSE(fs::exists(p));
  { std::ofstream(p) << "{\"step\": 1}\n{\"step\": 2}\n{\"ste"; }
  ASSERT_TRUE(arlo::drop_partial_last_line(p).has_value());
  EXPECT_EQ(slurp(p), "{\"step\": 1}\n{\"step\": 2}\n");
  ASSERT_TRUE(arlo::drop_partial_last_line(p).has_value());  // whole lines: unchanged
  EXPECT_EQ(slurp(p), "{\"step\": 1}\n{\"step\": 2}\n");
  { std::ofstream(p, std::ios::trunc) << "{\"st"; }
  ASSERT_TRUE(arlo::drop_partial_last_line(p).has_value());  // one partial line: empty
  EXPECT_EQ(slurp(p), "");
}

}  // namespace
}  // namespace arlo
