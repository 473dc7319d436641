#include "common/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

namespace arlo::safetensors {
namespace {

// Every dtype with its name in a file's header and its element size, in the enum's order.
struct DTypeInfo {
  DType dtype;
  std::string_view name;
  std::size_t size;
};
constexpr std::array<DTypeInfo, 12> kDTypes = {{{DType::F64, "F64", 8},
                                                {DType::F32, "F32", 4},
                                                {DType::F16, "F16", 2},
                                                {DType::BF16, "BF16", 2},
                                                {DType::F8_E4M3, "F8_E4M3", 1},
                                                {DType::F8_E5M2, "F8_E5M2", 1},
                                                {DType::I64, "I64", 8},
                                                {DType::I32, "I32", 4},
                                                {DType::I16, "I16", 2},
                                                {DType::I8, "I8", 1},
                                                {DType::U8, "U8", 1},
                                                {DType::BOOL, "BOOL", 1}}};
static_assert(std::ranges::all_of(kDTypes,
                                  [](const DTypeInfo& d) { return &d - kDTypes.data() == static_cast<int>(d.dtype); }),
              "kDTypes lists the dtypes in the enum's order");

// The row of `dtype`; null for a value outside the enum.
const DTypeInfo* dtype_info(DType dtype) {
  const auto i = static_cast<std::size_t>(dtype);
  return i < kDTypes.size() ? &kDTypes[i] : nullptr;
}

std::string errno_text(int err) { return std::strerror(err); }

// Keeps error messages printable and short whatever bytes a hostile file contains.
std::string printable(std::string_view s, std::size_t max_len = 80) {
  std::string out;
  for (char c : s.substr(0, std::min(s.size(), max_len))) {
    const auto u = static_cast<unsigned char>(c);
    out += (u >= 0x20 && u < 0x7f) ? c : '?';
  }
  if (s.size() > max_len) out += "...";
  return out;
}

std::string q_name(std::string_view name) { return "'" + printable(name) + "'"; }

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

// Element count with overflow detection; a zero dimension makes the count zero regardless of the
// other dimensions. Returns nullopt on overflow.
std::optional<std::uint64_t> checked_numel(const std::vector<std::int64_t>& shape) {
  for (auto d : shape) {
    if (d == 0) return 0;
  }
  std::uint64_t n = 1;
  for (auto d : shape) {
    if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n)) return std::nullopt;
  }
  return n;
}

bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t len = 0;
    std::uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (std::size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)) return false;
    if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += len;
  }
  return true;
}

void append_json_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (u < 0x20) {
          out += "\\u00";
          out += kHex[u >> 4];
          out += kHex[u & 0xf];
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

// ---------------------------------------------------------------------------------------------
// Header parsing: a SAX handler over nlohmann's iterative parser. The header grammar is fixed and
// at most three containers deep ({ name: { shape: [ ... ] } }), so anything deeper or of the wrong
// kind is rejected at the token where it appears: deep nesting costs nothing, duplicate keys (which
// a DOM parser would silently collapse) are caught, and nothing is built for a bad document.
// ---------------------------------------------------------------------------------------------

struct RawTensor {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::vector<std::uint64_t> offsets;
  unsigned seen = 0;  // bit set of kDType | kShape | kOffsets
};

class HeaderSax {
 public:
  using json = nlohmann::json;
  static constexpr unsigned kDType = 1, kShape = 2, kOffsets = 4;

  explicit HeaderSax(const Limits& limits) : limits_(limits) {}

  std::vector<RawTensor> tensors;
  std::map<std::string, std::string> metadata;
  std::string error;  // set when a callback returned false
  ErrorCode error_code = ErrorCode::kParse;

  bool null() { return scalar("null"); }
  bool boolean(bool) { return scalar("a boolean"); }
  bool number_integer(json::number_integer_t v) {
    if (depth_ == 3) {
      if (v < 0) return fail(field_context() + " has a negative value " + std::to_string(v));
      return push_index(static_cast<std::uint64_t>(v));
    }
    return scalar("a number");
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (depth_ == 3) return push_index(v);
    return scalar("a number");
  }
  bool number_float(json::number_float_t, const std::string& text) {
    if (depth_ == 3) {
      return fail(field_context() + " holds " + printable(text) + ", which is not an integer in the range [0, 2^63)");
    }
    return scalar("a number");
  }
  bool string(std::string& v) {
    if (depth_ == 2 && in_metadata_) {
      metadata.emplace(std::move(pending_key_), std::move(v));
      return true;
    }
    if (depth_ == 2 && field_ == kDType) {
      tensors.back().dtype = std::move(v);
      return true;
    }
    return scalar("a string");
  }
  bool binary(json::binary_t&) { return scalar("binary data"); }

  bool start_object(std::size_t) {
    if (depth_ == 0) {
      depth_ = 1;
      return true;
    }
    if (depth_ == 1) {
      depth_ = 2;
      if (top_key_ == "__metadata__") {
        if (seen_metadata_) return fail("duplicate \"__metadata__\" entry");
        seen_metadata_ = true;
        in_metadata_ = true;
      } else {
        in_metadata_ = false;
        if (tensors.size() >= limits_.max_tensors) {
          error_code = ErrorCode::kResourceExhausted;
          return fail("more than " + std::to_string(limits_.max_tensors) + " tensors");
        }
        if (!names_.insert(top_key_).second) return fail("duplicate tensor name " + q_name(top_key_));
        tensors.emplace_back();
        tensors.back().name = top_key_;
      }
      return true;
    }
    return scalar("an object");
  }
  bool key(std::string& k) {
    if (depth_ == 1) {
      top_key_ = std::move(k);
      return true;
    }
    // depth_ == 2
    if (in_metadata_) {
      if (metadata.count(k)) return fail("duplicate __metadata__ key " + q_name(k));
      pending_key_ = std::move(k);
      return true;
    }
    unsigned f = 0;
    if (k == "dtype")
      f = kDType;
    else if (k == "shape")
      f = kShape;
    else if (k == "data_offsets")
      f = kOffsets;
    else
      return fail("tensor " + q_name(top_key_) + " has unknown field " + q_name(k) +
                  " (expected dtype, shape, data_offsets)");
    if (tensors.back().seen & f) return fail("tensor " + q_name(top_key_) + " repeats field " + q_name(k));
    tensors.back().seen |= f;
    field_ = f;
    return true;
  }
  bool end_object() {
    if (depth_ == 2) {
      if (!in_metadata_) {
        const RawTensor& t = tensors.back();
        for (auto [bit, name] : {std::pair{kDType, "dtype"}, {kShape, "shape"}, {kOffsets, "data_offsets"}}) {
          if (!(t.seen & bit)) return fail("tensor " + q_name(t.name) + " has no " + name);
        }
      }
      in_metadata_ = false;
      field_ = 0;
    }
    --depth_;
    return true;
  }
  bool start_array(std::size_t) {
    if (depth_ == 2 && !in_metadata_ && (field_ == kShape || field_ == kOffsets)) {
      depth_ = 3;
      return true;
    }
    return scalar("an array");
  }
  bool end_array() {
    depth_ = 2;
    if (field_ == kOffsets && tensors.back().offsets.size() != 2) {
      return fail("tensor " + q_name(tensors.back().name) + ": data_offsets must be [begin, end], got " +
                  std::to_string(tensors.back().offsets.size()) + " values");
    }
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::json::exception& ex) {
    if (error.empty()) {
      // nlohmann's message quotes the offending bytes; keep it printable.
      error = "malformed JSON near byte " + std::to_string(position) + ": " + printable(ex.what(), 200);
    }
    return false;
  }

 private:
  // A value of the wrong kind at the current position.
  bool scalar(const char* what) {
    switch (depth_) {
      case 0: return fail(std::string("header must be a JSON object, found ") + what);
      case 1:
        if (top_key_ == "__metadata__") return fail(std::string("__metadata__ must be an object, found ") + what);
        return fail("entry " + q_name(top_key_) + " must be an object, found " + what);
      case 2:
        if (in_metadata_) {
          return fail("__metadata__ value for " + q_name(pending_key_) + " must be a string, found " + what);
        }
        return fail(field_context() + " must be " + (field_ == kDType ? "a string" : "an array") + ", found " + what);
      default: return fail(field_context() + " must hold non-negative integers, found " + what);
    }
  }
  std::string field_context() const {
    const char* f = field_ == kDType ? "dtype" : field_ == kShape ? "shape" : "data_offsets";
    return "tensor " + q_name(top_key_) + ": " + f;
  }
  bool push_index(std::uint64_t v) {
    RawTensor& t = tensors.back();
    if (field_ == kShape) {
      if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        return fail(field_context() + " has dimension " + std::to_string(v) + ", above 2^63-1");
      }
      if (t.shape.size() >= limits_.max_rank) {
        return fail(field_context() + " has more than " + std::to_string(limits_.max_rank) + " dimensions");
      }
      t.shape.push_back(static_cast<std::int64_t>(v));
    } else {
      if (t.offsets.size() >= 2) return fail(field_context() + " must be [begin, end], got more than 2 values");
      t.offsets.push_back(v);
    }
    return true;
  }
  bool fail(std::string message) {
    if (error.empty()) error = std::move(message);
    return false;
  }

  const Limits& limits_;
  int depth_ = 0;
  std::string top_key_;
  std::string pending_key_;
  bool in_metadata_ = false;
  bool seen_metadata_ = false;
  unsigned field_ = 0;
  std::set<std::string> names_;
};

std::uint64_t read_le64(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | std::to_integer<std::uint64_t>(p[i]);
  return v;
}

Status write_all(int fd, const void* data, std::size_t size, const std::string& what) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return make_error(ErrorCode::kIo, "writing " + what + ": " + errno_text(errno));
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return ok();
}

Status validate_decls(const std::vector<TensorDecl>& tensors, const std::map<std::string, std::string>& metadata,
                      const Limits& limits) {
  std::set<std::string_view> names;
  for (const auto& t : tensors) {
    if (t.name == "__metadata__")
      return make_error(ErrorCode::kInvalidArgument, "tensor name \"__metadata__\" is reserved");
    if (!valid_utf8(t.name))
      return make_error(ErrorCode::kInvalidArgument, "tensor name " + q_name(t.name) + " is not valid UTF-8");
    if (!names.insert(t.name).second)
      return make_error(ErrorCode::kInvalidArgument, "duplicate tensor name " + q_name(t.name));
    if (t.shape.size() > limits.max_rank) {
      return make_error(ErrorCode::kInvalidArgument, "tensor " + q_name(t.name) + " has rank " +
                                                         std::to_string(t.shape.size()) + " above the limit " +
                                                         std::to_string(limits.max_rank));
    }
    for (auto d : t.shape) {
      if (d < 0) {
        return make_error(ErrorCode::kInvalidArgument,
                          "tensor " + q_name(t.name) + " has negative dimension in shape " + shape_text(t.shape));
      }
    }
    auto numel = checked_numel(t.shape);
    std::uint64_t nbytes = 0;
    if (!numel || __builtin_mul_overflow(*numel, static_cast<std::uint64_t>(dtype_size(t.dtype)), &nbytes)) {
      return make_error(ErrorCode::kInvalidArgument,
                        "tensor " + q_name(t.name) + " shape " + shape_text(t.shape) + " overflows 64-bit byte size");
    }
  }
  if (tensors.size() > limits.max_tensors) {
    return make_error(ErrorCode::kInvalidArgument, std::to_string(tensors.size()) + " tensors exceed the limit " +
                                                       std::to_string(limits.max_tensors));
  }
  for (const auto& [k, v] : metadata) {
    if (!valid_utf8(k) || !valid_utf8(v)) {
      return make_error(ErrorCode::kInvalidArgument, "__metadata__ entry " + q_name(k) + " is not valid UTF-8");
    }
  }
  return ok();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// dtypes, TensorInfo, Header
// ---------------------------------------------------------------------------------------------

std::size_t dtype_size(DType dtype) {
  const DTypeInfo* d = dtype_info(dtype);
  return d ? d->size : 1;
}

std::string_view dtype_name(DType dtype) {
  const DTypeInfo* d = dtype_info(dtype);
  return d ? d->name : "?";
}

Result<DType> parse_dtype(std::string_view name) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.name == name) return d.dtype;
  }
  return make_error(ErrorCode::kParse, "unknown dtype " + q_name(name) +
                                           " (supported: F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32 I16 I8 U8 BOOL)");
}

std::uint64_t TensorInfo::numel() const { return checked_numel(shape).value_or(0); }

const TensorInfo* Header::find(std::string_view name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// ---------------------------------------------------------------------------------------------
// parse / serialise
// ---------------------------------------------------------------------------------------------

Result<Header> parse_header(std::string_view json, std::uint64_t data_size, const Limits& limits) {
  if (json.size() > limits.max_header_bytes) {
    return make_error(ErrorCode::kResourceExhausted, "header of " + std::to_string(json.size()) +
                                                         " bytes exceeds the limit of " +
                                                         std::to_string(limits.max_header_bytes));
  }
  // JSON never holds a raw NUL (control characters must be escaped inside strings), and the JSON
  // library treats one as end of input, which would let bytes after it pass unchecked.
  if (const auto nul = json.find('\0'); nul != std::string_view::npos) {
    return make_error(ErrorCode::kParse, "malformed JSON: NUL byte at header offset " + std::to_string(nul));
  }
  HeaderSax sax(limits);
  bool parsed = false;
  try {
    parsed = nlohmann::json::sax_parse(json.begin(), json.end(), &sax, nlohmann::json::input_format_t::json,
                                       /*strict=*/true, /*ignore_comments=*/false);
  } catch (const std::exception& e) {  // edge: the JSON library; only allocation failure is expected
    return make_error(ErrorCode::kParse, std::string("parsing header: ") + printable(e.what(), 200));
  }
  if (!parsed) {
    return make_error(sax.error_code, sax.error.empty() ? std::string("malformed JSON header") : sax.error);
  }

  Header header;
  header.metadata = std::move(sax.metadata);
  header.tensors.reserve(sax.tensors.size());
  for (RawTensor& raw : sax.tensors) {
    const std::string where = "tensor " + q_name(raw.name);
    ARLO_ASSIGN_OR_RETURN(DType dtype, with_context(parse_dtype(raw.dtype), where));
    const std::uint64_t begin = raw.offsets[0], end = raw.offsets[1];
    if (begin > end) {
      return make_error(ErrorCode::kParse, where + ": data_offsets [" + std::to_string(begin) + ", " +
                                               std::to_string(end) + "] begin after end");
    }
    if (end > data_size) {
      return make_error(ErrorCode::kParse, where + ": data_offsets [" + std::to_string(begin) + ", " +
                                               std::to_string(end) + "] run past the data section of " +
                                               std::to_string(data_size) + " bytes");
    }
    auto numel = checked_numel(raw.shape);
    std::uint64_t need = 0;
    if (!numel || __builtin_mul_overflow(*numel, static_cast<std::uint64_t>(dtype_size(dtype)), &need)) {
      return make_error(ErrorCode::kParse, where + ": shape " + shape_text(raw.shape) + " overflows 64-bit byte size");
    }
    if (need != end - begin) {
      return make_error(ErrorCode::kParse, where + ": " + std::string(dtype_name(dtype)) + " shape " +
                                               shape_text(raw.shape) + " needs " + std::to_string(need) +
                                               " bytes but data_offsets [" + std::to_string(begin) + ", " +
                                               std::to_string(end) + "] hold " + std::to_string(end - begin));
    }
    header.tensors.push_back(TensorInfo{.name = std::move(raw.name),
                                        .dtype = dtype,
                                        .shape = std::move(raw.shape),
                                        .offset = begin,
                                        .nbytes = end - begin});
  }

  // The data section must be tiled exactly: sorted by (begin, end), each tensor starts where the
  // previous one ended (zero-size tensors sit at a boundary), and the last ends at data_size.
  std::stable_sort(header.tensors.begin(), header.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
  });
  std::uint64_t cursor = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : header.tensors) {
    if (t.offset < cursor) {
      return make_error(ErrorCode::kParse, "tensor " + q_name(t.name) + " at bytes [" + std::to_string(t.offset) +
                                               ", " + std::to_string(t.offset + t.nbytes) + ") overlaps tensor " +
                                               q_name(prev->name) + " ending at byte " + std::to_string(cursor));
    }
    if (t.offset > cursor) {
      return make_error(ErrorCode::kParse, "gap in the data section: bytes [" + std::to_string(cursor) + ", " +
                                               std::to_string(t.offset) + ") before tensor " + q_name(t.name) +
                                               " belong to no tensor");
    }
    cursor = t.offset + t.nbytes;
    prev = &t;
  }
  if (cursor != data_size) {
    return make_error(ErrorCode::kParse, "data section is " + std::to_string(data_size) +
                                             " bytes but the tensors cover only " + std::to_string(cursor) +
                                             " (trailing bytes belong to no tensor)");
  }
  return header;
}

std::string serialize_header(const Header& header) {
  std::string out = "{";
  bool first = true;
  if (!header.metadata.empty()) {
    out += "\"__metadata__\":{";
    for (const auto& [k, v] : header.metadata) {
      if (!first) out += ',';
      first = false;
      append_json_string(out, k);
      out += ':';
      append_json_string(out, v);
    }
    out += '}';
    first = false;
  }
  for (const auto& t : header.tensors) {
    if (!first) out += ',';
    first = false;
    append_json_string(out, t.name);
    out += ":{\"dtype\":\"";
    out += dtype_name(t.dtype);
    out += "\",\"shape\":[";
    for (std::size_t i = 0; i < t.shape.size(); ++i) {
      if (i) out += ',';
      out += std::to_string(t.shape[i]);
    }
    out += "],\"data_offsets\":[";
    out += std::to_string(t.offset);
    out += ',';
    out += std::to_string(t.offset + t.nbytes);
    out += "]}";
  }
  out += '}';
  // Pad with spaces so the data section (at 8 + header length) starts 8-byte aligned.
  out.append((8 - out.size() % 8) % 8, ' ');
  return out;
}

Result<Layout> parse_file_bytes(std::span<const std::byte> file_bytes, std::string_view source, const Limits& limits) {
  const std::string where = "safetensors file " + std::string(source);
  const std::uint64_t size = file_bytes.size();
  if (size < 8) {
    return make_error(ErrorCode::kParse,
                      where + ": " + std::to_string(size) + " bytes is too short for the 8-byte header length");
  }
  const std::uint64_t n = read_le64(file_bytes.data());
  if (n > limits.max_header_bytes) {
    return make_error(ErrorCode::kResourceExhausted, where + ": header length " + std::to_string(n) +
                                                         " exceeds the limit of " +
                                                         std::to_string(limits.max_header_bytes) + " bytes");
  }
  if (n > size - 8) {
    return make_error(ErrorCode::kParse, where + ": header length " + std::to_string(n) +
                                             " runs past the end of the file (" + std::to_string(size) +
                                             " bytes); the file is truncated or not safetensors");
  }
  const std::string_view json(reinterpret_cast<const char*>(file_bytes.data()) + 8, n);
  auto header = parse_header(json, size - 8 - n, limits);
  if (!header) return std::unexpected(std::move(header).error().with_context(where));
  return Layout{.header = std::move(*header), .data_start = 8 + n};
}

// ---------------------------------------------------------------------------------------------
// File
// ---------------------------------------------------------------------------------------------

Result<File> File::open(const std::filesystem::path& path, const Limits& limits) {
  const std::string where = "safetensors file " + path.string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return make_error(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo,
                      "opening " + where + ": " + errno_text(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return make_error(ErrorCode::kIo, "stat " + where + ": " + errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error(ErrorCode::kInvalidArgument, where + " is not a regular file");
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return make_error(ErrorCode::kParse,
                      where + ": " + std::to_string(size) + " bytes is too short for the 8-byte header length");
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  const int map_err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) return make_error(ErrorCode::kIo, "mapping " + where + ": " + errno_text(map_err));

  File file;
  file.path_ = path;
  file.map_ = static_cast<const std::byte*>(map);
  file.map_size_ = size;
  file.mapped_ = true;
  auto layout = parse_file_bytes({file.map_, file.map_size_}, path.string(), limits);
  if (!layout) return std::unexpected(std::move(layout).error());  // ~File unmaps
  file.header_ = std::move(layout->header);
  file.data_start_ = layout->data_start;
  return file;
}

Result<File> File::from_bytes(std::vector<std::byte> bytes, std::string name, const Limits& limits) {
  File file;
  file.path_ = name;
  file.owned_ = std::move(bytes);
  file.map_ = file.owned_.data();
  file.map_size_ = file.owned_.size();
  ARLO_ASSIGN_OR_RETURN(Layout layout, parse_file_bytes({file.map_, file.map_size_}, name, limits));
  file.header_ = std::move(layout.header);
  file.data_start_ = layout.data_start;
  return file;
}

File::File(File&& other) noexcept
    : path_(std::move(other.path_)),
      header_(std::move(other.header_)),
      map_(std::exchange(other.map_, nullptr)),
      map_size_(std::exchange(other.map_size_, 0)),
      data_start_(other.data_start_),
      mapped_(std::exchange(other.mapped_, false)),
      owned_(std::move(other.owned_)) {}  // a moved vector keeps its buffer, so map_ stays valid

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (mapped_ && map_) ::munmap(const_cast<std::byte*>(map_), map_size_);
    path_ = std::move(other.path_);
    header_ = std::move(other.header_);
    map_ = std::exchange(other.map_, nullptr);
    map_size_ = std::exchange(other.map_size_, 0);
    data_start_ = other.data_start_;
    mapped_ = std::exchange(other.mapped_, false);
    owned_ = std::move(other.owned_);
  }
  return *this;
}

File::~File() {
  if (mapped_ && map_) ::munmap(const_cast<std::byte*>(map_), map_size_);
}

std::span<const std::byte> File::data(const TensorInfo& info) const {
  return {map_ + data_start_ + info.offset, static_cast<std::size_t>(info.nbytes)};
}

Result<std::span<const std::byte>> File::data(std::string_view name) const {
  const TensorInfo* info = header_.find(name);
  if (!info) {
    return make_error(ErrorCode::kNotFound, "safetensors file " + path_.string() + ": no tensor " + q_name(name));
  }
  return data(*info);
}

// ---------------------------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------------------------

struct Writer::Impl {
  std::filesystem::path path;
  std::filesystem::path temp_path;
  int fd = -1;
  std::vector<TensorInfo> tensors;  // declaration order, offsets assigned sequentially
  std::uint64_t total = 0;          // data section size
  std::uint64_t written = 0;        // data bytes accepted so far
  std::vector<char> buffer;         // coalesces small writes
  bool failed = false;
  bool finished = false;

  static constexpr std::size_t kBufferBytes = 1 << 20;

  std::string where() const { return "safetensors file " + path.string(); }

  Status flush() {
    if (buffer.empty()) return ok();
    auto st = write_all(fd, buffer.data(), buffer.size(), temp_path.string());
    buffer.clear();
    if (!st) failed = true;
    return st;
  }

  void discard() {
    if (fd >= 0) {
      ::close(fd);
      fd = -1;
    }
    if (!finished && !temp_path.empty()) ::unlink(temp_path.c_str());
  }
};

Result<Writer> Writer::create(const std::filesystem::path& path, std::vector<TensorDecl> tensors,
                              std::map<std::string, std::string> metadata) {
  const std::string where = "safetensors file " + path.string();
  if (auto st = validate_decls(tensors, metadata, Limits{}); !st) {
    return std::unexpected(std::move(st).error().with_context("writing " + where));
  }
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  Header header;
  header.metadata = std::move(metadata);
  std::uint64_t offset = 0;
  for (auto& decl : tensors) {
    const std::uint64_t nbytes = *checked_numel(decl.shape) * dtype_size(decl.dtype);
    if (__builtin_add_overflow(offset, nbytes, &offset)) {
      return make_error(ErrorCode::kInvalidArgument, "writing " + where + ": total size overflows 64 bits");
    }
    header.tensors.push_back(TensorInfo{.name = std::move(decl.name),
                                        .dtype = decl.dtype,
                                        .shape = std::move(decl.shape),
                                        .offset = offset - nbytes,
                                        .nbytes = nbytes});
  }
  impl->total = offset;
  const std::string json = serialize_header(header);
  impl->tensors = std::move(header.tensors);

  // Hidden temporary name beside the target so the rename is atomic and globs never see it.
  static std::atomic<std::uint64_t> counter{0};
  const std::string temp_name = "." + path.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                                std::to_string(counter.fetch_add(1));
  impl->temp_path = path.parent_path() / temp_name;
  impl->fd = ::open(impl->temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (impl->fd < 0) {
    const int err = errno;
    impl->temp_path.clear();
    return make_error(ErrorCode::kIo, "writing " + where + ": creating temporary file: " + errno_text(err));
  }
  std::array<unsigned char, 8> len{};
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((json.size() >> (8 * i)) & 0xff);
  impl->buffer.reserve(Impl::kBufferBytes);
  impl->buffer.insert(impl->buffer.end(), len.begin(), len.end());
  impl->buffer.insert(impl->buffer.end(), json.begin(), json.end());
  if (impl->buffer.size() >= Impl::kBufferBytes) ARLO_TRY(impl->flush());
  Writer w;
  w.impl_ = std::move(impl);
  return w;
}

Writer::Writer(Writer&&) noexcept = default;
Writer& Writer::operator=(Writer&& other) noexcept {
  if (this != &other) {
    if (impl_) impl_->discard();
    impl_ = std::move(other.impl_);
  }
  return *this;
}
Writer::~Writer() {
  if (impl_) impl_->discard();
}

Status Writer::write(std::span<const std::byte> bytes) {
  if (!impl_ || impl_->finished) return make_error(ErrorCode::kInvalidArgument, "safetensors writer already finished");
  Impl& w = *impl_;
  if (w.failed) return make_error(ErrorCode::kIo, "writing " + w.where() + ": an earlier write failed");
  if (bytes.size() > w.total - w.written) {
    return make_error(ErrorCode::kInvalidArgument, "writing " + w.where() + ": " + std::to_string(bytes.size()) +
                                                       " bytes would exceed the " + std::to_string(w.total) +
                                                       "-byte data section (" + std::to_string(w.written) +
                                                       " already written)");
  }
  if (w.buffer.size() + bytes.size() <= Impl::kBufferBytes) {
    const auto* p = reinterpret_cast<const char*>(bytes.data());
    w.buffer.insert(w.buffer.end(), p, p + bytes.size());
  } else {
    ARLO_TRY(w.flush());
    auto st = write_all(w.fd, bytes.data(), bytes.size(), w.temp_path.string());
    if (!st) {
      w.failed = true;
      return st;
    }
  }
  w.written += bytes.size();
  return ok();
}

Status Writer::write_tensor(std::string_view name, std::span<const std::byte> bytes) {
  if (!impl_ || impl_->finished) return make_error(ErrorCode::kInvalidArgument, "safetensors writer already finished");
  Impl& w = *impl_;
  const auto it = std::find_if(w.tensors.begin(), w.tensors.end(), [&](const TensorInfo& t) { return t.name == name; });
  if (it == w.tensors.end()) {
    return make_error(ErrorCode::kNotFound, "writing " + w.where() + ": tensor " + q_name(name) + " was not declared");
  }
  if (it->offset != w.written) {
    return make_error(ErrorCode::kInvalidArgument, "writing " + w.where() + ": tensor " + q_name(name) +
                                                       " starts at data byte " + std::to_string(it->offset) +
                                                       " but the writer is at byte " + std::to_string(w.written) +
                                                       " (write tensors in declaration order)");
  }
  if (bytes.size() != it->nbytes) {
    return make_error(ErrorCode::kInvalidArgument, "writing " + w.where() + ": tensor " + q_name(name) + " (" +
                                                       std::string(dtype_name(it->dtype)) + " " +
                                                       shape_text(it->shape) + ") needs " + std::to_string(it->nbytes) +
                                                       " bytes, got " + std::to_string(bytes.size()));
  }
  return write(bytes);
}

Status Writer::finish(bool fsync) {
  if (!impl_ || impl_->finished) return make_error(ErrorCode::kInvalidArgument, "safetensors writer already finished");
  Impl& w = *impl_;
  if (w.failed) return make_error(ErrorCode::kIo, "writing " + w.where() + ": an earlier write failed");
  if (w.written != w.total) {
    return make_error(ErrorCode::kInvalidArgument, "writing " + w.where() + ": only " + std::to_string(w.written) +
                                                       " of " + std::to_string(w.total) +
                                                       " data bytes were written before finish()");
  }
  ARLO_TRY(w.flush());
  if (fsync && ::fsync(w.fd) != 0) {
    return make_error(ErrorCode::kIo, "writing " + w.where() + ": fsync: " + errno_text(errno));
  }
  const int fd = std::exchange(w.fd, -1);
  if (::close(fd) != 0) {
    return make_error(ErrorCode::kIo, "writing " + w.where() + ": close: " + errno_text(errno));
  }
  if (::rename(w.temp_path.c_str(), w.path.c_str()) != 0) {
    return make_error(ErrorCode::kIo, "writing " + w.where() + ": renaming into place: " + errno_text(errno));
  }
  w.finished = true;
  if (fsync) {
    auto dir = w.path.parent_path();
    if (dir.empty()) dir = ".";
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return make_error(ErrorCode::kIo, "syncing directory of " + w.where() + ": " + errno_text(errno));
    const int rc = ::fsync(dfd);
    const int err = errno;
    ::close(dfd);
    if (rc != 0) return make_error(ErrorCode::kIo, "syncing directory of " + w.where() + ": " + errno_text(err));
  }
  return ok();
}

Status write_file(const std::filesystem::path& path, const std::vector<TensorData>& tensors,
                  const std::map<std::string, std::string>& metadata, bool fsync) {
  std::vector<TensorDecl> decls;
  decls.reserve(tensors.size());
  for (const auto& t : tensors) decls.push_back(t.decl);
  ARLO_ASSIGN_OR_RETURN(Writer writer, Writer::create(path, std::move(decls), metadata));
  for (const auto& t : tensors) ARLO_TRY(writer.write_tensor(t.decl.name, t.bytes));
  return writer.finish(fsync);
}

}  // namespace arlo::safetensors
