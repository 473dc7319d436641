// `arlo check-config` and `arlo config-doc`.
#include <cstdio>

#include "apps/arlo/commands.h"
#include "session/server_support.h"
#include "config/config.h"
#include "common/file.h"

namespace arlo::cli {

std::optional<config::Config> load_config_or_report(const std::string& command, const std::string& file,
                                                    const std::vector<std::string>& overrides,
                                                    const std::string& consequence) {
  config::LoadOptions options;
  options.overrides = overrides;
  config::Resolution resolution = config::resolve_file(file, options);
  for (const auto& w : resolution.warnings)
    std::fprintf(stderr, "%s: warning: %s\n", command.c_str(), w.text().c_str());
  if (!resolution.config) {
    for (const auto& d : resolution.diagnostics) std::fprintf(stderr, "%s\n", d.text().c_str());
    std::fprintf(stderr, "%s: %zu problem(s) in %s%s\n", command.c_str(), resolution.diagnostics.size(), file.c_str(),
                 consequence.c_str());
  }
  return std::move(resolution.config);
}

int check_config(const ConfigArgs& args) {
  const auto cfg = load_config_or_report("check-config", args.file, args.overrides);
  if (!cfg) return kExitBadConfig;
  if (auto st = session::check_inference_support(*cfg); !st) {
    std::fprintf(stderr, "check-config: %s: %s\n", args.file.c_str(), st.error().what().c_str());
    return kExitBadConfig;
  }
  const std::string yaml = cfg->to_yaml();
  std::fwrite(yaml.data(), 1, yaml.size(), stdout);
  return kExitOk;
}

int config_doc(const std::optional<std::string>& output) {
  const std::string doc = config::generate_markdown(config::product_schema());
  if (!output) {
    std::fwrite(doc.data(), 1, doc.size(), stdout);
    return kExitOk;
  }
  if (auto st = write_file_atomically(*output, doc); !st) {
    std::fprintf(stderr, "config-doc: %s\n", st.error().what().c_str());
    return kExitFailure;
  }
  std::fprintf(stderr, "config-doc: wrote %s\n", output->c_str());
  return kExitOk;
}

}  // namespace arlo::cli
