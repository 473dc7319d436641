// `arlo report` and web/report.h: runs read from run dirs (errors name the file and line), the HTML
// holds every run's records and loads nothing from elsewhere, the PNG charts decode to an image of
// the stated size with each run's line in its color, and the CLI exits 2 on bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/temp_dir.h"
#include "web/raster.h"
#include "web/report.h"

namespace {

namespace fs = std::filesystem;
using arlo::web::Rgb;

class ReportTest : public ::testing::Test {
 protected:
  // A run dir whose metrics.jsonl has `steps` step records (reward = offset + step / 1000, loss,
  // every 10th an eval record) and, when `summary`, a summary.json.
  fs::path make_run(const std::string& name, int steps, double offset, bool summary = true) {
    const auto run = dir_ / name;
    fs::create_directories(run);
    std::ofstream out(run / "metrics.jsonl");
    for (int s = 1; s <= steps; ++s) {
      nlohmann::json r = {{"kind", "step"},
                          {"step", s},
                          {"time", 1.7e9 + s},
                          {"train/supervised", false},
                          {"train/reward/mean", offset + s / 1000.0},
                          {"trainer/loss", offset + 1.0 / s},
                          {"off_policy/histogram", {3, 5}}};
      out << r.dump() << "\n";
      if (s % 10 == 0)
        out << nlohmann::json(
                   {{"kind", "eval"}, {"step", s}, {"time", 1.7e9 + s}, {"eval/arithmetic/pass@1", offset + s / 100.0}})
                   .dump()
            << "\n";
    }
    if (summary) std::ofstream(run / "summary.json") << nlohmann::json({{"ok", true}, {"steps", steps}}).dump();
    return run;
  }

  // Two runs of 40 steps, "first" and "second", loaded.
  std::vector<arlo::web::RunData> two_runs() {
    std::vector<arlo::web::RunData> runs;
    for (auto [name, offset] : {std::pair{"first", 0.25}, std::pair{"second", 0.5}}) {
      auto r = arlo::web::load_run(make_run(name, 40, offset));
      EXPECT_TRUE(r) << r.error().what();
      if (r) runs.push_back(std::move(*r));
    }
    return runs;
  }

  const arlo::test_files::TempDir tmp_{"arlo_web_report_test"};
  const fs::path& dir_ = tmp_.path();
};

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::uint32_t be32(const std::string& s, std::size_t at) {
  return (std::uint32_t(std::uint8_t(s[at])) << 24) | (std::uint32_t(std::uint8_t(s[at + 1])) << 16) |
         (std::uint32_t(std::uint8_t(s[at + 2])) << 8) | std::uint32_t(std::uint8_t(s[at + 3]));
}

struct Decoded {
  std::uint32_t width = 0, height = 0;
  std::vector<std::uint8_t> rgb;  // filter bytes removed (the encoder writes filter 0)
  int count(Rgb c) const {
    int n = 0;
    for (std::size_t i = 0; i + 2 < rgb.size(); i += 3) n += rgb[i] == c.r && rgb[i + 1] == c.g && rgb[i + 2] == c.b;
    return n;
  }
};

// Decodes the PNG the report writes (8-bit RGB, filter 0), checking the signature, chunk CRCs and
// that IHDR comes first and IEND last.
Decoded decode_png(const std::string& png) {
  Decoded d;
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  std::string idat;
  std::size_t at = 8;
  std::vector<std::string> types;
  while (at + 12 <= png.size()) {
    const auto len = be32(png, at);
    const auto type = png.substr(at + 4, 4);
    const auto data = png.substr(at + 8, len);
    const auto crc = ::crc32(0L, reinterpret_cast<const Bytef*>(png.data() + at + 4), len + 4);
    EXPECT_EQ(be32(png, at + 8 + len), crc) << type;
    types.push_back(type);
    if (type == "IHDR") {
      d.width = be32(data, 0);
      d.height = be32(data, 4);
      EXPECT_EQ(data[8], 8);  // bit depth
      EXPECT_EQ(data[9], 2);  // RGB
    }
    if (type == "IDAT") idat += data;
    at += 12 + len;
  }
  EXPECT_EQ(at, png.size());
  EXPECT_FALSE(types.empty());
  if (types.empty()) return d;
  EXPECT_EQ(types.front(), "IHDR");
  EXPECT_EQ(types.back(), "IEND");
  std::vector<std::uint8_t> raw((std::size_t(d.width) * 3 + 1) * d.height);
  uLongf size = raw.size();
  EXPECT_EQ(::uncompress(raw.data(), &size, reinterpret_cast<const Bytef*>(idat.data()), idat.size()), Z_OK);
  EXPECT_EQ(size, raw.size());
  for (std::uint32_t y = 0; y < d.height; ++y) {
    const auto* row = raw.data() + y * (std::size_t(d.width) * 3 + 1);
    EXPECT_EQ(row[0], 0) << "row " << y;
    d.rgb.insert(d.rgb.end(), row + 1, row + 1 + std::size_t(d.width) * 3);
  }
  return d;
}

constexpr Rgb kRun0{0x1f, 0x77, 0xb4}, kRun1{0xd6, 0x27, 0x28};

TEST_F(ReportTest, LoadsRecordsAndSummary) {
  const auto run = make_run("a", 30, 0.1);
  auto r = arlo::web::load_run(run);
  ASSERT_TRUE(r) << r.error().what();
  EXPECT_EQ(r->records.size(), 33u);  // 30 steps and 3 evals
  ASSERT_TRUE(r->summary);
  EXPECT_EQ(r->summary->at("steps"), 30);
  EXPECT_EQ(r->name, run.string());
}

TEST_F(ReportTest, RunWithoutSummaryLoads) {
  auto r = arlo::web::load_run(make_run("a", 5, 0.1, false));
  ASSERT_TRUE(r) << r.error().what();
  EXPECT_FALSE(r->summary);
}

TEST_F(ReportTest, MissingDirIsNamed) {
  auto r = arlo::web::load_run(dir_ / "nope");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find((dir_ / "nope").string()), std::string::npos) << r.error().what();
  EXPECT_NE(r.error().what().find("no such run directory"), std::string::npos) << r.error().what();
}

TEST_F(ReportTest, MissingMetricsIsNamed) {
  fs::create_directories(dir_ / "empty");
  auto r = arlo::web::load_run(dir_ / "empty");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find((dir_ / "empty" / "metrics.jsonl").string() + ": missing"), std::string::npos)
      << r.error().what();
}

TEST_F(ReportTest, CorruptLineIsNamedWithItsNumber) {
  const auto run = make_run("a", 3, 0.1);
  { std::ofstream(run / "metrics.jsonl", std::ios::app) << "{\"kind\": \"step\", \"step\": 4,\n"; }
  auto r = arlo::web::load_run(run);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find((run / "metrics.jsonl").string() + ":4: not a JSON object"), std::string::npos)
      << r.error().what();

  std::ofstream(run / "metrics.jsonl") << "{\"step\": 1}\n\n[1, 2]\n";
  r = arlo::web::load_run(run);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find("metrics.jsonl:3: not a JSON object"), std::string::npos) << r.error().what();
}

TEST_F(ReportTest, CorruptSummaryIsNamed) {
  const auto run = make_run("a", 3, 0.1);
  std::ofstream(run / "summary.json") << "{\"ok\": tru";
  auto r = arlo::web::load_run(run);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().what().find((run / "summary.json").string() + ": not a JSON object"), std::string::npos)
      << r.error().what();
}

// The JSON the page reads: the text of <script id="arlo-data">.
nlohmann::json inlined_data(const std::string& html) {
  const std::string open = "<script type=\"application/json\" id=\"arlo-data\">";
  const auto a = html.find(open);
  EXPECT_NE(a, std::string::npos);
  if (a == std::string::npos) return {};
  const auto b = html.find("</script>", a);
  return nlohmann::json::parse(html.substr(a + open.size(), b - a - open.size()));
}

TEST_F(ReportTest, HtmlHoldsEveryRunAndNoUrl) {
  std::vector<arlo::web::RunData> runs = two_runs();
  ASSERT_EQ(runs.size(), 2u);
  // A string that would end the data's <script> if it were inlined as it is.
  runs[1].records[0]["note"] = "</script><script>alert(1)</script> http://example.invalid/";
  const auto html = arlo::web::report_html(runs, "now");
  const auto data = inlined_data(html);
  ASSERT_EQ(data.at("runs").size(), 2u);
  for (std::size_t i = 0; i < runs.size(); ++i) {
    EXPECT_EQ(data["runs"][i]["name"], runs[i].name);
    EXPECT_EQ(data["runs"][i]["records"], nlohmann::json(runs[i].records)) << "run " << i;
    EXPECT_EQ(data["runs"][i]["summary"], *runs[i].summary);
  }
  EXPECT_EQ(html.find("</script><script>alert"), std::string::npos);
  // Outside the runs' own data, the page names no URL and loads nothing from elsewhere.
  const auto a = html.find("id=\"arlo-data\">"), b = html.find("</script>", a);
  const auto page = html.substr(0, a) + html.substr(b);
  EXPECT_EQ(page.find("http://"), std::string::npos);
  EXPECT_EQ(page.find("https://"), std::string::npos);
  EXPECT_FALSE(std::regex_search(page, std::regex(R"((src|href)\s*=\s*["'](?!data:))"))) << "external resource";
  EXPECT_NE(page.find("var uPlot="), std::string::npos) << "uPlot is inlined";
}

TEST_F(ReportTest, PngChartsDecodeWithEachRunsLine) {
  std::vector<arlo::web::RunData> runs = two_runs();
  ASSERT_EQ(runs.size(), 2u);
  const auto html = dir_ / "out" / "cmp.html";
  auto written = arlo::web::write_report(runs, html, "now");
  ASSERT_TRUE(written) << written.error().what();
  ASSERT_EQ(written->size(), 4u);
  EXPECT_EQ((*written)[0], html);
  for (const auto* name : {"reward", "eval", "loss"}) {
    const auto png = dir_ / "out" / (std::string("cmp-") + name + ".png");
    ASSERT_TRUE(fs::exists(png)) << png;
    const auto d = decode_png(read(png));
    EXPECT_EQ(d.width, 960u) << name;
    EXPECT_EQ(d.height, 540u) << name;
    ASSERT_EQ(d.rgb.size(), 960u * 540u * 3u);
    EXPECT_GT(d.count(kRun0), 200) << name << ": the first run's line";
    EXPECT_GT(d.count(kRun1), 200) << name << ": the second run's line";
    EXPECT_LT(d.count(Rgb{255, 255, 255}), 960 * 540) << name;
  }
}

TEST(RasterTest, LineChartPlacesPointsOnTheirAxes) {
  arlo::web::LineChart c;
  c.title = "t";
  c.series.push_back({.label = "up", .color = kRun0, .x = {0, 10}, .y = {0.0, 1.0}, .dash = 0});
  const auto img = arlo::web::render_line_chart(c);
  // The line rises from left to right: the run color is lower in the left half than in the right.
  auto mean_row = [&](int x0, int x1) {
    double sum = 0;
    int n = 0;
    for (int y = 0; y < img.height(); ++y)
      for (int x = x0; x < x1; ++x)
        if (img.at(x, y) == kRun0) sum += y, ++n;
    return n ? sum / n : -1;
  };
  const double left = mean_row(100, img.width() / 2), right = mean_row(img.width() / 2, img.width() - 30);
  ASSERT_GT(left, 0);
  ASSERT_GT(right, 0);
  EXPECT_GT(left, right + 100) << "image y grows downwards";
}

TEST(RasterTest, NiceTicksAreRound) {
  EXPECT_EQ(arlo::web::nice_ticks(0, 1), (std::vector<double>{0, 0.2, 0.4, 0.6000000000000001, 0.8, 1}));
  const auto t = arlo::web::nice_ticks(101, 1285, 8);
  ASSERT_GE(t.size(), 5u);
  EXPECT_EQ(t.front(), 200);
  EXPECT_EQ(t[1] - t[0], 200);
}

// `arlo report` as a process: exit status and what it printed.
std::pair<int, std::string> arlo_report(const std::vector<std::string>& args, const fs::path& dir) {
  std::string cmd = std::string(ARLO_CLI_PATH) + " report";
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " > '" + (dir / "out.txt").string() + "' 2>&1";
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read(dir / "out.txt")};
}

TEST_F(ReportTest, CliWritesTheReport) {
  const auto a = make_run("a", 20, 0.1), b = make_run("b", 25, 0.3);
  const auto [code, out] = arlo_report({a.string(), b.string() + "/", "-o", (dir_ / "r.html").string()}, dir_);
  ASSERT_EQ(code, 0) << out;
  for (const auto* f : {"r.html", "r-reward.png", "r-eval.png", "r-loss.png"}) {
    EXPECT_TRUE(fs::exists(dir_ / f)) << f;
    EXPECT_NE(out.find((dir_ / f).string()), std::string::npos) << out;
  }
  const auto data = inlined_data(read(dir_ / "r.html"));
  ASSERT_EQ(data["runs"].size(), 2u);
  EXPECT_EQ(data["runs"][1]["name"], b.string()) << "named by the dir as given, without the trailing /";
}

TEST_F(ReportTest, CliBadInputExits2AndNamesTheProblem) {
  const auto good = make_run("good", 5, 0.1);
  const auto bad = make_run("bad", 5, 0.1);
  { std::ofstream(bad / "metrics.jsonl", std::ios::app) << "not json\n"; }
  fs::create_directories(dir_ / "empty");
  const auto out_html = dir_ / "r.html";
  {
    const auto [code, out] = arlo_report({good.string(), bad.string(), "-o", out_html.string()}, dir_);
    EXPECT_EQ(code, 2) << out;
    EXPECT_NE(out.find((bad / "metrics.jsonl").string() + ":6: not a JSON object"), std::string::npos) << out;
  }
  {
    const auto [code, out] =
        arlo_report({(dir_ / "missing").string(), (dir_ / "empty").string(), "-o", out_html.string()}, dir_);
    EXPECT_EQ(code, 2) << out;
    EXPECT_NE(out.find((dir_ / "missing").string() + ": no such run directory"), std::string::npos) << out;
    EXPECT_NE(out.find((dir_ / "empty" / "metrics.jsonl").string() + ": missing"), std::string::npos) << out;
    EXPECT_NE(out.find("2 of 2 run dir(s) cannot be read"), std::string::npos) << out;
  }
  {
    const auto [code, out] = arlo_report({}, dir_);
    EXPECT_EQ(code, 2) << out << " (no run dir is a usage error)";
  }
  EXPECT_FALSE(fs::exists(out_html)) << "nothing is written when a run cannot be read";
}

}  // namespace
