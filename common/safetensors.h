#pragma once
// The safetensors format (Hugging Face): an 8-byte little-endian header length N, N bytes of JSON
// header {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
// then the data section. Offsets are relative to the start of the data section.
//
// Reading maps the file and hands out spans into the mapping: no copies. Writing streams: the
// header is computed from the declared tensors up front, then bytes are appended in order, to a
// temporary name renamed into place by finish() so readers never see a partial file.
//
// Validation is strict, so a hostile file yields an Error and never a crash or an unbounded
// allocation: header size limit, valid UTF-8 JSON object, known dtypes, shapes whose element count
// times dtype size equals the byte range, ranges inside the data section, no overlaps, no gaps
// (the format requires the data section to be fully covered), no duplicate names.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace arlo::safetensors {

enum class DType { F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U8, BOOL };

std::size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);  // "F32", "BF16", "F8_E4M3", ...
Result<DType> parse_dtype(std::string_view name);

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  std::uint64_t offset = 0;  // from the start of the data section
  std::uint64_t nbytes = 0;

  std::uint64_t numel() const;
};

struct Header {
  std::vector<TensorInfo> tensors;  // sorted by offset
  std::map<std::string, std::string> metadata;

  const TensorInfo* find(std::string_view name) const;
};

struct Limits {
  std::uint64_t max_header_bytes = 100ull << 20;  // the reference implementation's limit
  std::size_t max_tensors = 1u << 20;
  std::size_t max_rank = 16;
};

// Parses and validates a JSON header against a data section of `data_size` bytes.
// Exposed for fuzzing and for readers that fetch the header themselves.
Result<Header> parse_header(std::string_view json, std::uint64_t data_size, const Limits& limits = {});

// The parsed layout of a whole safetensors file held in memory.
struct Layout {
  Header header;
  std::uint64_t data_start = 0;  // file offset of the data section: 8 + header length
};

// Validates a whole file image exactly as File::open does: the 8-byte little-endian length, the
// header, and the data section that follows (its size is what remains after the header).
// `source` names the file in error messages. Never reads outside `file_bytes`; allocates at most
// in proportion to the header length. This is the single code path behind File::open and
// File::from_bytes, and the entry point of the fuzz target.
Result<Layout> parse_file_bytes(std::span<const std::byte> file_bytes, std::string_view source,
                                const Limits& limits = {});

// Serialises a header (offsets taken from `tensors` as given) to JSON, padded with spaces so the
// data section starts 8-byte aligned, as the reference writer does.
std::string serialize_header(const Header& header);

// A read-only memory-mapped safetensors file.
class File {
 public:
  // Maps `path` read-only (MAP_SHARED). The file must not be truncated while mapped: writers replace
  // files by rename, which leaves existing mappings intact.
  static Result<File> open(const std::filesystem::path& path, const Limits& limits = {});
  // A file image already in memory (received over a socket, say): validated like open(); the File
  // owns `bytes` and data() spans point into it. `name` stands for the path in error messages.
  static Result<File> from_bytes(std::vector<std::byte> bytes, std::string name, const Limits& limits = {});
  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  ~File();

  const Header& header() const { return header_; }
  const std::filesystem::path& path() const { return path_; }
  // Bytes of one tensor inside the mapping; valid while this File lives.
  std::span<const std::byte> data(const TensorInfo& info) const;
  Result<std::span<const std::byte>> data(std::string_view name) const;

 private:
  File() = default;
  std::filesystem::path path_;
  Header header_;
  const std::byte* map_ = nullptr;
  std::size_t map_size_ = 0;
  std::uint64_t data_start_ = 0;
  bool mapped_ = false;           // map_ came from mmap (else it points into owned_)
  std::vector<std::byte> owned_;  // from_bytes: the image itself
};

// What a writer declares up front.
struct TensorDecl {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
};

// Streaming writer: create() writes the header, write() appends tensor bytes in declaration order
// (any chunking), finish() checks every byte arrived, flushes, and renames into place.
// Dropping a writer without finish() removes the temporary file.
class Writer {
 public:
  static Result<Writer> create(const std::filesystem::path& path, std::vector<TensorDecl> tensors,
                               std::map<std::string, std::string> metadata = {});
  Writer(Writer&&) noexcept;
  Writer& operator=(Writer&&) noexcept;
  ~Writer();

  Status write(std::span<const std::byte> bytes);
  // Convenience: checks `name` is the next tensor and `bytes` its exact size, then writes it.
  Status write_tensor(std::string_view name, std::span<const std::byte> bytes);
  // fsync=true also syncs the file and its directory (durable against power loss).
  Status finish(bool fsync = false);

 private:
  Writer() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One-shot write of in-memory tensors.
struct TensorData {
  TensorDecl decl;
  std::span<const std::byte> bytes;
};
Status write_file(const std::filesystem::path& path, const std::vector<TensorData>& tensors,
                  const std::map<std::string, std::string>& metadata = {}, bool fsync = false);

}  // namespace arlo::safetensors
