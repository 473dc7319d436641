#pragma once
// A small raster renderer for the PNG charts of `arlo report`: an RGB image, lines, rectangles and
// text in a built-in 5x7 bitmap font (upper case, digits, punctuation), a line chart with axes,
// ticks, labels and a legend, and a PNG encoder (zlib). No browser, no font files.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace arlo::web {

struct Rgb {
  std::uint8_t r = 0, g = 0, b = 0;
  friend bool operator==(const Rgb&, const Rgb&) = default;
};

class Raster {
 public:
  Raster(int width, int height, Rgb background);

  int width() const { return width_; }
  int height() const { return height_; }
  Rgb at(int x, int y) const;
  const std::vector<std::uint8_t>& rgb() const { return pixels_; }  // row-major, 3 bytes a pixel

  // Every drawing call clips to the image.
  void set(int x, int y, Rgb c);
  void fill_rect(int x, int y, int w, int h, Rgb c);
  // A line `thickness` pixels wide; `dash` > 0 draws dash pixels on, dash pixels off, the pattern
  // continuing from `*dash_phase` (pixels drawn so far along a polyline) when given.
  void line(double x0, double y0, double x1, double y1, Rgb c, int thickness = 1, int dash = 0,
            double* dash_phase = nullptr);
  // Text with its top-left corner at (x, y), each font pixel drawn as scale x scale. Lower case is
  // drawn as upper case; characters without a glyph as '?'.
  void text(int x, int y, std::string_view s, Rgb c, int scale = 1);
  static int text_width(std::string_view s, int scale = 1);
  static int text_height(int scale = 1);

 private:
  int width_, height_;
  std::vector<std::uint8_t> pixels_;
};

// The PNG file of `image` (8-bit RGB, zlib-compressed, CRC-checked chunks).
std::string encode_png(const Raster& image);

struct ChartSeries {
  std::string label;
  Rgb color;
  std::vector<double> x;
  std::vector<std::optional<double>> y;  // nullopt breaks the line
  int dash = 0;                          // 0: solid
};

struct LineChart {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<ChartSeries> series;
  std::optional<double> y_min, y_max;  // unset: from the data
  int width = 960;
  int height = 540;
};

// Draws `chart`: title, legend, axes with round-number ticks and labels, one line per series.
// A chart without any point draws the frame and says "no data".
Raster render_line_chart(const LineChart& chart);

// Round-number tick values covering [lo, hi] (about `target` of them, steps of 1, 2 or 5 x 10^k).
std::vector<double> nice_ticks(double lo, double hi, int target = 6);

}  // namespace arlo::web
