#include "web/report.h"

#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "common/file.h"
#include "web/assets.h"

namespace arlo::web {
namespace {

// The first colors of web/page/charts.js's PALETTE: a run has the same color in the HTML and the PNGs.
constexpr Rgb kPalette[] = {{0x1f, 0x77, 0xb4}, {0xd6, 0x27, 0x28}, {0x2c, 0xa0, 0x2c}, {0xff, 0x7f, 0x0e},
                            {0x94, 0x67, 0xbd}, {0x8c, 0x56, 0x4b}, {0xe3, 0x77, 0xc2}, {0x17, 0xbe, 0xcf},
                            {0x7f, 0x7f, 0x7f}, {0xbc, 0xbd, 0x22}};

Result<std::string> read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::kIo, fmt::format("{}: cannot be read", path.string()));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Records written before "kind" existed are told apart by their keys (as charts.js does).
std::string kind_of(const nlohmann::json& r) {
  if (auto it = r.find("kind"); it != r.end() && it->is_string()) return it->get<std::string>();
  for (const auto& [key, value] : r.items())
    if (key.starts_with("eval/")) return "eval";
  return "step";
}

std::optional<double> number(const nlohmann::json& r, const std::string& key) {
  auto it = r.find(key);
  if (it == r.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

// One series per run (and per key matched by `pick`): value at each record of `kind` that has it.
template <typename Pick>
std::vector<ChartSeries> series_of(const std::vector<RunData>& runs, const std::string& kind, Pick pick) {
  std::vector<ChartSeries> out;
  for (std::size_t r = 0; r < runs.size(); ++r) {
    std::map<std::string, ChartSeries> by_key;  // key -> series, in key order
    for (const auto& rec : runs[r].records) {
      if (kind_of(rec) != kind) continue;
      const auto step = number(rec, "step");
      if (!step) continue;
      for (const auto& [key, value] : rec.items()) {
        if (!value.is_number()) continue;
        auto label = pick(key);
        if (!label) continue;
        auto& s = by_key[key];
        s.label = *label;
        s.x.push_back(*step);
        s.y.emplace_back(value.template get<double>());
      }
    }
    int dash = 0;
    for (auto& [key, s] : by_key) {
      s.label = by_key.size() == 1 ? runs[r].name : runs[r].name + ": " + s.label;
      s.color = kPalette[r % std::size(kPalette)];
      s.dash = dash;
      dash = dash == 0 ? 8 : dash + 4;
      out.push_back(std::move(s));
    }
  }
  return out;
}

LineChart chart(std::string title, std::string x_label, std::string y_label) {
  LineChart c;
  c.title = std::move(title);
  c.x_label = std::move(x_label);
  c.y_label = std::move(y_label);
  return c;
}

}  // namespace

Result<RunData> load_run(const std::filesystem::path& dir) {
  RunData run;
  run.dir = dir;
  run.name = dir.string();
  while (run.name.size() > 1 && run.name.back() == '/') run.name.pop_back();
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    return make_error(ErrorCode::kNotFound, fmt::format("{}: no such run directory", dir.string()));
  const auto metrics = dir / "metrics.jsonl";
  if (!std::filesystem::is_regular_file(metrics, ec))
    return make_error(ErrorCode::kNotFound,
                      fmt::format("{}: missing: is {} a run dir (arlo run writes metrics.jsonl there)?",
                                  metrics.string(), dir.string()));
  ARLO_ASSIGN_OR_RETURN(const auto text, read_text(metrics));
  std::size_t line_no = 0, pos = 0;
  while (pos < text.size()) {
    auto end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object())
      return make_error(ErrorCode::kParse, fmt::format("{}:{}: not a JSON object (metrics.jsonl holds one a line): {}",
                                                       metrics.string(), line_no, line.substr(0, 80)));
    run.records.push_back(std::move(j));
  }
  const auto summary = dir / "summary.json";
  if (std::filesystem::exists(summary, ec)) {
    ARLO_ASSIGN_OR_RETURN(const auto s, read_text(summary));
    auto j = nlohmann::json::parse(s, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object())
      return make_error(ErrorCode::kParse, fmt::format("{}: not a JSON object", summary.string()));
    run.summary = std::move(j);
  }
  return run;
}

std::string report_html(const std::vector<RunData>& runs, std::string_view generated) {
  nlohmann::json data = {{"generated", generated}, {"runs", nlohmann::json::array()}};
  for (const auto& run : runs)
    data["runs"].push_back({{"name", run.name},
                            {"dir", run.dir.string()},
                            {"summary", run.summary ? *run.summary : nlohmann::json(nullptr)},
                            {"records", run.records}});
  // Inside <script>, "<" only appears in JSON strings, where \u003c reads the same.
  const std::string json = data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string inlined;
  inlined.reserve(json.size());
  for (const char c : json) {
    if (c == '<')
      inlined += "\\u003c";
    else
      inlined += c;
  }
  std::string page(report_page());
  const auto at = page.find(kReportDataMarker);
  if (at != std::string::npos) page.replace(at, kReportDataMarker.size(), inlined);
  return page;
}

std::vector<std::pair<std::string, LineChart>> report_charts(const std::vector<RunData>& runs) {
  std::vector<std::pair<std::string, LineChart>> charts;
  auto reward = chart("Train reward", "trainer step", "mean reward");
  reward.series = series_of(runs, "step", [](const std::string& key) -> std::optional<std::string> {
    if (key == "train/reward/mean") return "train mean";
    return std::nullopt;
  });
  charts.emplace_back("reward", std::move(reward));
  auto eval = chart("Eval pass@k", "version (trainer step)", "fraction correct");
  eval.y_min = 0;
  eval.y_max = 1;
  eval.series = series_of(runs, "eval", [](const std::string& key) -> std::optional<std::string> {
    if (!key.starts_with("eval/") || key.find("/pass@") == std::string::npos) return std::nullopt;
    auto label = key.substr(5);
    label[label.find('/')] = ' ';
    return label;
  });
  charts.emplace_back("eval", std::move(eval));
  auto loss = chart("Trainer loss", "trainer step", "loss");
  loss.series = series_of(runs, "step", [](const std::string& key) -> std::optional<std::string> {
    if (key == "trainer/loss") return "loss";
    return std::nullopt;
  });
  charts.emplace_back("loss", std::move(loss));
  return charts;
}

Result<std::vector<std::filesystem::path>> write_report(const std::vector<RunData>& runs,
                                                        const std::filesystem::path& html, std::string_view generated) {
  std::vector<std::filesystem::path> written;
  ARLO_TRY(write_file_atomically(html, report_html(runs, generated)));
  written.push_back(html);
  for (const auto& [name, chart] : report_charts(runs)) {
    auto png = html.parent_path() / fmt::format("{}-{}.png", html.stem().string(), name);
    ARLO_TRY(write_file_atomically(png, encode_png(render_line_chart(chart))));
    written.push_back(std::move(png));
  }
  return written;
}

}  // namespace arlo::web
