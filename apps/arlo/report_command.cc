// `arlo report RUN_DIR [RUN_DIR...] [-o OUT.html]`: one self-contained HTML file overlaying the runs,
// and PNG charts next to it (web/report.h does the work).
#include <chrono>
#include <cstdio>
#include <ctime>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include "apps/arlo/commands.h"
#include "web/report.h"

namespace arlo::cli {

int report(const ReportArgs& args) {
  std::vector<web::RunData> runs;
  int problems = 0;
  for (const auto& dir : args.run_dirs) {
    auto run = web::load_run(dir);
    if (!run) {
      std::fprintf(stderr, "report: %s\n", run.error().what().c_str());
      ++problems;
      continue;
    }
    runs.push_back(std::move(*run));
  }
  if (problems > 0) {
    std::fprintf(stderr, "report: %d of %zu run dir(s) cannot be read; nothing written\n", problems,
                 args.run_dirs.size());
    return kExitBadConfig;
  }
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  const auto generated = fmt::format("{:%Y-%m-%d %H:%M:%S} UTC", fmt::gmtime(now));
  auto written = web::write_report(runs, args.output, generated);
  if (!written) {
    std::fprintf(stderr, "report: %s\n", written.error().what().c_str());
    return kExitFailure;
  }
  for (const auto& path : *written) std::printf("report: wrote %s\n", path.string().c_str());
  return kExitOk;
}

}  // namespace arlo::cli
