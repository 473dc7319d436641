#include "web/raster.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

namespace arlo::web {
namespace {

constexpr int kGlyphW = 5, kGlyphH = 7, kAdvance = 6;

struct Glyph {
  char c;
  std::array<const char*, kGlyphH> rows;  // '#' on, anything else off
};

// The built-in font: 5x7 cells, one row a string.
constexpr Glyph kFont[] = {
    {' ', {".....", ".....", ".....", ".....", ".....", ".....", "....."}},
    {'0', {".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."}},
    {'1', {"..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."}},
    {'2', {".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"}},
    {'3', {"#####", "...#.", "..#..", "...#.", "....#", "#...#", ".###."}},
    {'4', {"...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."}},
    {'5', {"#####", "#....", "####.", "....#", "....#", "#...#", ".###."}},
    {'6', {"..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."}},
    {'7', {"#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."}},
    {'8', {".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."}},
    {'9', {".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."}},
    {'A', {".###.", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"}},
    {'B', {"####.", "#...#", "#...#", "####.", "#...#", "#...#", "####."}},
    {'C', {".###.", "#...#", "#....", "#....", "#....", "#...#", ".###."}},
    {'D', {"###..", "#..#.", "#...#", "#...#", "#...#", "#..#.", "###.."}},
    {'E', {"#####", "#....", "#....", "####.", "#....", "#....", "#####"}},
    {'F', {"#####", "#....", "#....", "####.", "#....", "#....", "#...."}},
    {'G', {".###.", "#...#", "#....", "#.###", "#...#", "#...#", ".####"}},
    {'H', {"#...#", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"}},
    {'I', {".###.", "..#..", "..#..", "..#..", "..#..", "..#..", ".###."}},
    {'J', {"..###", "...#.", "...#.", "...#.", "...#.", "#..#.", ".##.."}},
    {'K', {"#...#", "#..#.", "#.#..", "##...", "#.#..", "#..#.", "#...#"}},
    {'L', {"#....", "#....", "#....", "#....", "#....", "#....", "#####"}},
    {'M', {"#...#", "##.##", "#.#.#", "#.#.#", "#...#", "#...#", "#...#"}},
    {'N', {"#...#", "#...#", "##..#", "#.#.#", "#..##", "#...#", "#...#"}},
    {'O', {".###.", "#...#", "#...#", "#...#", "#...#", "#...#", ".###."}},
    {'P', {"####.", "#...#", "#...#", "####.", "#....", "#....", "#...."}},
    {'Q', {".###.", "#...#", "#...#", "#...#", "#.#.#", "#..#.", ".##.#"}},
    {'R', {"####.", "#...#", "#...#", "####.", "#.#..", "#..#.", "#...#"}},
    {'S', {".####", "#....", "#....", ".###.", "....#", "....#", "####."}},
    {'T', {"#####", "..#..", "..#..", "..#..", "..#..", "..#..", "..#.."}},
    {'U', {"#...#", "#...#", "#...#", "#...#", "#...#", "#...#", ".###."}},
    {'V', {"#...#", "#...#", "#...#", "#...#", "#...#", ".#.#.", "..#.."}},
    {'W', {"#...#", "#...#", "#...#", "#.#.#", "#.#.#", "#.#.#", ".#.#."}},
    {'X', {"#...#", "#...#", ".#.#.", "..#..", ".#.#.", "#...#", "#...#"}},
    {'Y', {"#...#", "#...#", ".#.#.", "..#..", "..#..", "..#..", "..#.."}},
    {'Z', {"#####", "....#", "...#.", "..#..", ".#...", "#....", "#####"}},
    {'.', {".....", ".....", ".....", ".....", ".....", ".##..", ".##.."}},
    {',', {".....", ".....", ".....", ".....", ".##..", "..#..", ".#..."}},
    {':', {".....", ".##..", ".##..", ".....", ".##..", ".##..", "....."}},
    {';', {".....", ".##..", ".##..", ".....", ".##..", "..#..", ".#..."}},
    {'-', {".....", ".....", ".....", "#####", ".....", ".....", "....."}},
    {'+', {".....", "..#..", "..#..", "#####", "..#..", "..#..", "....."}},
    {'=', {".....", ".....", "#####", ".....", "#####", ".....", "....."}},
    {'_', {".....", ".....", ".....", ".....", ".....", ".....", "#####"}},
    {'/', {".....", "....#", "...#.", "..#..", ".#...", "#....", "....."}},
    {'\\', {".....", "#....", ".#...", "..#..", "...#.", "....#", "....."}},
    {'(', {"...#.", "..#..", ".#...", ".#...", ".#...", "..#..", "...#."}},
    {')', {".#...", "..#..", "...#.", "...#.", "...#.", "..#..", ".#..."}},
    {'[', {".###.", ".#...", ".#...", ".#...", ".#...", ".#...", ".###."}},
    {']', {".###.", "...#.", "...#.", "...#.", "...#.", "...#.", ".###."}},
    {'<', {"...#.", "..#..", ".#...", "#....", ".#...", "..#..", "...#."}},
    {'>', {".#...", "..#..", "...#.", "....#", "...#.", "..#..", ".#..."}},
    {'%', {"##...", "##..#", "...#.", "..#..", ".#...", "#..##", "...##"}},
    {'@', {".###.", "#...#", "#.###", "#.#.#", "#.###", "#....", ".###."}},
    {'#', {".#.#.", ".#.#.", "#####", ".#.#.", "#####", ".#.#.", ".#.#."}},
    {'*', {".....", "..#..", "#.#.#", ".###.", "#.#.#", "..#..", "....."}},
    {'!', {"..#..", "..#..", "..#..", "..#..", "..#..", ".....", "..#.."}},
    {'?', {".###.", "#...#", "....#", "...#.", "..#..", ".....", "..#.."}},
    {'\'', {"..#..", "..#..", ".#...", ".....", ".....", ".....", "....."}},
    {'"', {".#.#.", ".#.#.", ".....", ".....", ".....", ".....", "....."}},
    {'&', {".##..", "#..#.", "#.#..", ".#...", "#.#.#", "#..#.", ".##.#"}},
    {'|', {"..#..", "..#..", "..#..", "..#..", "..#..", "..#..", "..#.."}},
    {'~', {".....", ".....", ".#...", "#.#.#", "...#.", ".....", "....."}},
};

const Glyph& glyph(char c) {
  if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  for (const auto& g : kFont)
    if (g.c == c) return g;
  for (const auto& g : kFont)
    if (g.c == '?') return g;
  return kFont[0];
}

void put_u32(std::string& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xff));
}

void chunk(std::string& out, const char type[4], std::string_view data) {
  put_u32(out, static_cast<std::uint32_t>(data.size()));
  const auto start = out.size();
  out.append(type, 4);
  out.append(data);
  const auto crc =
      ::crc32(0L, reinterpret_cast<const Bytef*>(out.data() + start), static_cast<uInt>(out.size() - start));
  put_u32(out, static_cast<std::uint32_t>(crc));
}

// A label for a tick value: as few digits as the step between ticks needs.
std::string tick_label(double v, double step) {
  if (std::abs(v) < step * 1e-9) v = 0;
  const double a = std::max(std::abs(v), step);
  if (a >= 1e5 || a < 1e-4) return fmt::format("{:.1e}", v);
  const int decimals = std::clamp(static_cast<int>(std::ceil(-std::log10(step) - 1e-9)), 0, 6);
  return fmt::format("{:.{}f}", v, decimals);
}

}  // namespace

Raster::Raster(int width, int height, Rgb background)
    : width_(std::max(width, 1)),
      height_(std::max(height, 1)),
      pixels_(static_cast<std::size_t>(width_) * static_cast<std::size_t>(height_) * 3) {
  fill_rect(0, 0, width_, height_, background);
}

Rgb Raster::at(int x, int y) const {
  if (x < 0 || y < 0 || x >= width_ || y >= height_) return {};
  const auto* p =
      &pixels_[(static_cast<std::size_t>(y) * static_cast<std::size_t>(width_) + static_cast<std::size_t>(x)) * 3];
  return {p[0], p[1], p[2]};
}

void Raster::set(int x, int y, Rgb c) {
  if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
  auto* p =
      &pixels_[(static_cast<std::size_t>(y) * static_cast<std::size_t>(width_) + static_cast<std::size_t>(x)) * 3];
  p[0] = c.r;
  p[1] = c.g;
  p[2] = c.b;
}

void Raster::fill_rect(int x, int y, int w, int h, Rgb c) {
  const int x0 = std::max(x, 0), y0 = std::max(y, 0);
  const int x1 = std::min(x + w, width_), y1 = std::min(y + h, height_);
  for (int yy = y0; yy < y1; ++yy)
    for (int xx = x0; xx < x1; ++xx) set(xx, yy, c);
}

void Raster::line(double x0, double y0, double x1, double y1, Rgb c, int thickness, int dash, double* dash_phase) {
  const double dx = x1 - x0, dy = y1 - y0;
  const double length = std::hypot(dx, dy);
  const int n = std::max(1, static_cast<int>(std::ceil(length * 2)));  // half-pixel steps
  const int lo = -(thickness - 1) / 2, hi = thickness / 2;
  const double phase = dash_phase ? *dash_phase : 0.0;
  if (dash_phase) *dash_phase += length;
  for (int i = 0; i <= n; ++i) {
    const double t = static_cast<double>(i) / n;
    if (dash > 0 && static_cast<long>((phase + length * t) / dash) % 2 == 1) continue;
    const int px = static_cast<int>(std::lround(x0 + dx * t)), py = static_cast<int>(std::lround(y0 + dy * t));
    for (int oy = lo; oy <= hi; ++oy)
      for (int ox = lo; ox <= hi; ++ox) set(px + ox, py + oy, c);
  }
}

void Raster::text(int x, int y, std::string_view s, Rgb c, int scale) {
  for (const char ch : s) {
    const auto& g = glyph(ch);
    for (int row = 0; row < kGlyphH; ++row)
      for (int col = 0; col < kGlyphW; ++col)
        if (g.rows[static_cast<std::size_t>(row)][col] == '#')
          fill_rect(x + col * scale, y + row * scale, scale, scale, c);
    x += kAdvance * scale;
  }
}

int Raster::text_width(std::string_view s, int scale) {
  return s.empty() ? 0 : (static_cast<int>(s.size()) * kAdvance - 1) * scale;
}

int Raster::text_height(int scale) { return kGlyphH * scale; }

std::string encode_png(const Raster& image) {
  std::string out("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  put_u32(ihdr, static_cast<std::uint32_t>(image.width()));
  put_u32(ihdr, static_cast<std::uint32_t>(image.height()));
  ihdr += std::string("\x08\x02\x00\x00\x00", 5);  // 8-bit depth, RGB, deflate, adaptive filters, no interlace
  chunk(out, "IHDR", ihdr);

  const std::size_t stride = static_cast<std::size_t>(image.width()) * 3;
  std::string raw;
  raw.reserve((stride + 1) * static_cast<std::size_t>(image.height()));
  for (int y = 0; y < image.height(); ++y) {
    raw.push_back('\0');  // filter: none
    raw.append(reinterpret_cast<const char*>(image.rgb().data()) + static_cast<std::size_t>(y) * stride, stride);
  }
  uLongf size = ::compressBound(static_cast<uLong>(raw.size()));
  std::string packed(size, '\0');
  ::compress2(reinterpret_cast<Bytef*>(packed.data()), &size, reinterpret_cast<const Bytef*>(raw.data()),
              static_cast<uLong>(raw.size()), Z_BEST_COMPRESSION);
  packed.resize(size);
  chunk(out, "IDAT", packed);
  chunk(out, "IEND", {});
  return out;
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) hi = lo + 1;
  const double raw = (hi - lo) / std::max(target - 1, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (const double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  std::vector<double> ticks;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step) ticks.push_back(v);
  return ticks;
}

Raster render_line_chart(const LineChart& chart) {
  const Rgb white{255, 255, 255}, ink{40, 44, 52}, muted{110, 118, 128}, grid{228, 232, 236};
  Raster img(chart.width, chart.height, white);
  constexpr int kText = 2;  // font scale: 10x14 pixel cells
  const int line_h = Raster::text_height(kText) + 6;

  // Title, then the legend in rows under it.
  img.text(20, 14, chart.title, ink, 3);
  int legend_y = 14 + Raster::text_height(3) + 12;
  int lx = 20;
  for (const auto& s : chart.series) {
    const int w = 28 + Raster::text_width(s.label, kText) + 24;
    if (lx + w > chart.width - 20 && lx > 20) {
      lx = 20;
      legend_y += line_h;
    }
    img.line(lx, legend_y + 7, lx + 22, legend_y + 7, s.color, 3, s.dash);
    img.text(lx + 28, legend_y, s.label, ink, kText);
    lx += w;
  }
  const int top = legend_y + line_h + Raster::text_height(kText) + 20;  // room for the y label
  const int left = 100, right = chart.width - 30, bottom = chart.height - 70;

  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
  for (const auto& s : chart.series)
    for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!s.y[i] || !std::isfinite(*s.y[i]) || !std::isfinite(s.x[i])) continue;
      xmin = std::min(xmin, s.x[i]);
      xmax = std::max(xmax, s.x[i]);
      ymin = std::min(ymin, *s.y[i]);
      ymax = std::max(ymax, *s.y[i]);
    }
  const bool empty = !std::isfinite(xmin);
  if (empty) xmin = 0, xmax = 1, ymin = 0, ymax = 1;
  if (chart.y_min) ymin = *chart.y_min;
  if (chart.y_max) ymax = *chart.y_max;
  if (xmax <= xmin) xmax = xmin + 1;
  if (ymax <= ymin) {
    const double pad = std::max(std::abs(ymin) * 0.1, 1e-3);
    ymin -= pad;
    ymax += pad;
  } else if (!chart.y_min || !chart.y_max) {
    const double pad = (ymax - ymin) * 0.05;
    if (!chart.y_min) ymin -= pad;
    if (!chart.y_max) ymax += pad;
  }
  const auto px = [&](double x) { return left + (x - xmin) / (xmax - xmin) * (right - left); };
  const auto py = [&](double y) { return bottom - (y - ymin) / (ymax - ymin) * (bottom - top); };

  const auto yt = nice_ticks(ymin, ymax);
  const double ystep = yt.size() > 1 ? yt[1] - yt[0] : 1;
  for (const double v : yt) {
    const int y = static_cast<int>(std::lround(py(v)));
    img.line(left, y, right, y, grid);
    img.line(left - 6, y, left, y, ink);
    const auto label = tick_label(v, ystep);
    img.text(left - 10 - Raster::text_width(label, kText), y - Raster::text_height(kText) / 2, label, ink, kText);
  }
  const auto xt = nice_ticks(xmin, xmax, 8);
  const double xstep = xt.size() > 1 ? xt[1] - xt[0] : 1;
  for (const double v : xt) {
    const int x = static_cast<int>(std::lround(px(v)));
    img.line(x, top, x, bottom, grid);
    img.line(x, bottom, x, bottom + 6, ink);
    const auto label = tick_label(v, xstep);
    img.text(x - Raster::text_width(label, kText) / 2, bottom + 12, label, ink, kText);
  }
  img.line(left, top, left, bottom, ink, 2);
  img.line(left, bottom, right, bottom, ink, 2);
  img.text(left - 10 - Raster::text_width(chart.y_label, kText) / 4, top - Raster::text_height(kText) - 10,
           chart.y_label, muted, kText);
  img.text((left + right) / 2 - Raster::text_width(chart.x_label, kText) / 2, bottom + 40, chart.x_label, muted, kText);
  if (empty) {
    img.text((left + right) / 2 - Raster::text_width("no data", 3) / 2, (top + bottom) / 2, "no data", muted, 3);
    return img;
  }

  for (const auto& s : chart.series) {
    std::optional<std::pair<double, double>> prev;
    double phase = 0;
    for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!s.y[i] || !std::isfinite(*s.y[i])) {
        prev.reset();
        continue;
      }
      const double x = px(s.x[i]), y = py(std::clamp(*s.y[i], ymin, ymax));
      if (prev) img.line(prev->first, prev->second, x, y, s.color, 2, s.dash, &phase);
      // Sparse series (evals) show their points; a lone point shows anyway.
      if (s.x.size() < 60 || !prev) img.fill_rect(static_cast<int>(x) - 3, static_cast<int>(y) - 3, 7, 7, s.color);
      prev = {x, y};
    }
  }
  return img;
}

}  // namespace arlo::web
