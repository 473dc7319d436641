// `arlo bench NAME [args...]`: runs the benchmark binary arlo-bench-NAME.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "apps/arlo/commands.h"

namespace arlo::cli {
namespace {

namespace fs = std::filesystem;
constexpr std::string_view kPrefix = "arlo-bench-";

// Where benchmark binaries live: next to arlo (an install), or in the build tree, where arlo is
// <build>/apps/arlo/arlo and benchmarks are <build>/bench/<name>/arlo-bench-<name>.
std::vector<fs::path> search_dirs() {
  std::vector<fs::path> dirs;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return dirs;
  const fs::path here = self.parent_path();
  dirs.push_back(here);
  for (const fs::path& bench_root : {here / ".." / ".." / "bench", here / ".." / "bench", here / "bench"}) {
    if (!fs::is_directory(bench_root, ec)) continue;
    for (const auto& entry : fs::directory_iterator(bench_root, ec)) {
      if (entry.is_directory(ec)) dirs.push_back(entry.path());
    }
  }
  return dirs;
}

bool is_executable_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec) && ::access(p.c_str(), X_OK) == 0;
}

}  // namespace

int bench(const std::string& name, const std::vector<std::string>& args) {
  const std::vector<fs::path> dirs = search_dirs();
  std::set<std::string> available;
  for (const auto& dir : dirs) {
    const fs::path candidate = dir / (std::string(kPrefix) + name);
    if (is_executable_file(candidate)) {
      std::vector<std::string> argv_storage{candidate.string()};
      argv_storage.insert(argv_storage.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : argv_storage) argv.push_back(a.data());
      argv.push_back(nullptr);
      std::fflush(stdout);
      ::execv(candidate.c_str(), argv.data());
      std::fprintf(stderr, "arlo bench: cannot run %s: %s\n", candidate.c_str(), std::strerror(errno));
      return kExitFailure;
    }
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string file = entry.path().filename().string();
      if (file.starts_with(kPrefix) && is_executable_file(entry.path())) available.insert(file.substr(kPrefix.size()));
    }
  }
  std::fprintf(stderr, "arlo bench: no benchmark '%s' (looked for %s%s next to arlo and under <build>/bench/*/).\n",
               name.c_str(), std::string(kPrefix).c_str(), name.c_str());
  if (available.empty()) {
    std::fprintf(stderr, "No benchmarks are built; configure with -DARLO_BUILD_BENCH=ON and build them.\n");
  } else {
    std::string list;
    for (const auto& a : available) list += (list.empty() ? "" : ", ") + a;
    std::fprintf(stderr, "Available: %s\n", list.c_str());
  }
  return kExitBadConfig;
}

}  // namespace arlo::cli
