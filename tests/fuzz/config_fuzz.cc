// libFuzzer target for the config loader (config/).
//
// Input: YAML text, optionally followed by NUL-separated `--set` overrides. Properties checked:
//   - resolve() never crashes, hangs or leaks, whatever the bytes (ASan, UBSan, libFuzzer limits);
//   - a failed load always says why (at least one diagnostic), a successful one says nothing;
//   - a loaded config printed with to_yaml() loads again to the same printed text.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"

namespace {

// A fixed environment so ${VAR} expansion is exercised deterministically.
std::optional<std::string> fuzz_env(std::string_view name) {
  if (name == "HOME") return std::string("/home/fuzz");
  if (name == "N") return std::string("16");
  if (name == "EMPTY") return std::string();
  return std::nullopt;
}

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "config_fuzz: %s\n%s\n", what, detail.c_str());
  __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t first_nul = input.find('\0');
  const std::string_view yaml = input.substr(0, first_nul);

  arlo::config::LoadOptions options;
  options.env = fuzz_env;
  if (first_nul != std::string_view::npos) {
    std::string_view rest = input.substr(first_nul + 1);
    while (!rest.empty() && options.overrides.size() < 8) {
      const std::size_t nul = rest.find('\0');
      options.overrides.emplace_back(rest.substr(0, nul));
      rest = nul == std::string_view::npos ? std::string_view() : rest.substr(nul + 1);
    }
  }

  const arlo::config::Resolution first = arlo::config::resolve(yaml, "fuzz.yaml", options);
  if (first.config.has_value() == !first.diagnostics.empty()) {
    fail("a load must give either a config or diagnostics", std::string(yaml));
  }
  if (!first.config) return 0;

  const std::string printed = first.config->to_yaml();
  arlo::config::LoadOptions plain;
  plain.env = fuzz_env;
  const arlo::config::Resolution second = arlo::config::resolve(printed, "printed.yaml", plain);
  if (!second.config) {
    fail("the printed config does not load again", printed + "\n--- first diagnostic: " + second.diagnostics[0].text());
  }
  if (second.config->to_yaml() != printed) {
    fail("printing is not stable across a reload", printed + "\n--- became:\n" + second.config->to_yaml());
  }
  return 0;
}
