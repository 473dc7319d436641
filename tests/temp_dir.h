#pragma once
// A fresh directory for one test, removed with everything in it when the TempDir goes. mkdtemp names
// it, so tests running at the same time (ctest -j, several build trees) never share one.
#include <stdlib.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace arlo::test_files {

class TempDir {
 public:
  // The directory is <system temp dir>/<prefix>-XXXXXX; a failure to make it throws (the test fails
  // there, saying why).
  explicit TempDir(const std::string& prefix = "arlo-test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr)
      throw std::system_error(errno, std::generic_category(), "mkdtemp " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::filesystem::path& name) const { return path_ / name; }

  // The names in the directory (not its subdirectories), in no particular order.
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path_)) out.push_back(e.path().filename().string());
    return out;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace arlo::test_files
