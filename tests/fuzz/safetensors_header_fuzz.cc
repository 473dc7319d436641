// libFuzzer target: arbitrary bytes as a whole safetensors file, through both reading paths:
//   1. parse_file_bytes() on the input buffer itself (8-byte length, header, data section), where
//      AddressSanitizer sees any read outside the input;
//   2. File::open() on a memfd holding the same bytes (open, fstat, mmap, validate, unmap).
// Any input must give an Error or a header whose invariants hold; the two paths must agree; and an
// accepted header must survive serialize_header() -> parse_header() unchanged. A broken invariant
// aborts, which libFuzzer reports as a crash.
#include <cstdint>
#include <string>

#include "common/safetensors.h"
#include "tests/fuzz/check.h"

namespace {

using namespace arlo::safetensors;
using arlo::fuzz::check;

void check_layout(const Layout& layout, std::span<const std::byte> file) {
  const Header& h = layout.header;
  check(layout.data_start >= 8 && layout.data_start <= file.size(), "data_start inside the file");
  const std::uint64_t data_size = file.size() - layout.data_start;
  std::uint64_t cursor = 0;
  unsigned sink = 0;
  for (const TensorInfo& t : h.tensors) {
    check(t.offset == cursor, "tensors tile the data section in order");
    check(t.numel() * dtype_size(t.dtype) == t.nbytes, "shape matches byte size");
    for (auto d : t.shape) check(d >= 0, "dimensions are non-negative");
    cursor += t.nbytes;
    // Touch every byte: out-of-range spans are caught by ASan here.
    const std::byte* p = file.data() + layout.data_start + t.offset;
    for (std::uint64_t i = 0; i < t.nbytes; ++i) sink += std::to_integer<unsigned>(p[i]);
  }
  check(cursor == data_size, "tensors cover the data section exactly");
  (void)sink;

  // Whatever we accept we can write back, and it reads the same.
  const std::string json = serialize_header(h);
  auto again = parse_header(json, data_size);
  check(again.has_value(), "serialised header parses");
  check(again->metadata == h.metadata, "metadata round-trips");
  check(again->tensors.size() == h.tensors.size(), "tensor count round-trips");
  for (std::size_t i = 0; i < h.tensors.size(); ++i) {
    const TensorInfo& a = h.tensors[i];
    const TensorInfo& b = again->tensors[i];
    check(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.offset == b.offset && a.nbytes == b.nbytes,
          "tensor round-trips");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  auto layout = parse_file_bytes(file, "fuzz-input");
  if (layout) {
    check_layout(*layout, file);
  } else {
    check(!layout.error().what().empty(), "errors carry a message");
  }

  // The full file path: the same bytes as a real file, opened, mapped and validated.
  auto opened = File::open(arlo::fuzz::as_file(data, size));
  check(opened.has_value() == layout.has_value(), "File::open agrees with parse_file_bytes");
  if (opened) {
    check(opened->header().tensors.size() == layout->header.tensors.size(), "same tensors");
    for (const TensorInfo& t : opened->header().tensors) {
      const auto span = opened->data(t);
      check(span.size() == t.nbytes, "span size");
      unsigned sink = 0;
      for (std::byte b : span) sink += std::to_integer<unsigned>(b);
      (void)sink;
    }
  } else {
    check(opened.error().code() == layout.error().code(), "same error code");
  }
  return 0;
}
