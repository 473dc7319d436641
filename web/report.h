#pragma once
// `arlo report`: finished (or stopped) runs read from their run dirs, written as one self-contained
// HTML file (web/page/report.html with uPlot and the runs inlined) and PNG charts next to it.
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "web/raster.h"

namespace arlo::web {

struct RunData {
  std::string name;  // how the run is labelled: its dir as given
  std::filesystem::path dir;
  std::vector<nlohmann::json> records;    // metrics.jsonl, in file order
  std::optional<nlohmann::json> summary;  // summary.json; absent when the run did not get to write it
};

// Reads `dir`/metrics.jsonl (required: one JSON object a line, blank lines skipped) and
// `dir`/summary.json (optional). Errors name the file, and the line for a line that is not a JSON
// object.
Result<RunData> load_run(const std::filesystem::path& dir);

// The report page with `runs` inlined (no external URL); `generated` is shown in its header.
std::string report_html(const std::vector<RunData>& runs, std::string_view generated);

// The PNG charts of the report, one line per run: "reward" (train reward mean), "eval" (every
// eval pass@k) and "loss" (trainer loss), each by trainer step.
std::vector<std::pair<std::string, LineChart>> report_charts(const std::vector<RunData>& runs);

// Writes report_html() to `html` and each chart of report_charts() to <html stem>-<name>.png in
// the same directory; returns the paths written, the HTML first.
Result<std::vector<std::filesystem::path>> write_report(const std::vector<RunData>& runs,
                                                        const std::filesystem::path& html, std::string_view generated);

}  // namespace arlo::web
