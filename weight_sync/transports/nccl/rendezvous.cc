#include "weight_sync/transports/nccl/rendezvous.h"

#include <cstring>

#include <fmt/format.h>

namespace arlo::weight_sync::nccl {

std::string vllm_unique_id_pickle(const UniqueId& id) {
  static_assert(sizeof(id.bytes) == 128, "SHORT_BINBYTES carries at most 255 bytes");
  std::string p;
  p += "\x80\x03";               // PROTO 3
  p += "c_ctypes\n_unpickle\n";  // GLOBAL: the callable
  p += 'c';                      // GLOBAL: the class
  p += kVllmUniqueIdModule;
  p += '\n';
  p += kVllmUniqueIdClass;
  p += '\n';
  p += '}';  // EMPTY_DICT: the instance __dict__
  p += 'C';  // SHORT_BINBYTES: the 128 id bytes
  p += static_cast<char>(sizeof(id.bytes));
  p.append(reinterpret_cast<const char*>(id.bytes.data()), id.bytes.size());
  p += '\x86';  // TUPLE2: (dict, bytes)
  p += '\x86';  // TUPLE2: (cls, state)
  p += 'R';     // REDUCE: _unpickle(cls, state)
  p += '.';     // STOP
  return p;
}

std::string sglang_unique_id_key(std::string_view group_name, int counter) {
  // TCPStore "/" + PrefixStore(G) + PrefixStore(G + "/") + PrefixStore("cuda/") + str(counter),
  // each PrefixStore joining with "/".
  return fmt::format("/{0}/{0}//cuda//{1}", group_name, counter);
}

namespace {
constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int decode_char(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}
}  // namespace

std::string base64(const UniqueId& id) {
  std::string out;
  const auto* b = reinterpret_cast<const unsigned char*>(id.bytes.data());
  const std::size_t n = id.bytes.size();
  for (std::size_t i = 0; i < n; i += 3) {
    const unsigned v = (b[i] << 16) | (i + 1 < n ? b[i + 1] << 8 : 0) | (i + 2 < n ? b[i + 2] : 0);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < n ? kAlphabet[(v >> 6) & 63] : '=';
    out += i + 2 < n ? kAlphabet[v & 63] : '=';
  }
  return out;
}

Result<UniqueId> unique_id_from_base64(std::string_view text) {
  constexpr std::size_t kChars = (sizeof(UniqueId::bytes) + 2) / 3 * 4;  // 172, one '=' of padding
  if (text.size() != kChars)
    return make_error(ErrorCode::kParse,
                      fmt::format("NCCL unique id in base64: expected {} characters (128 bytes, padded), got {}",
                                  kChars, text.size()));
  std::string bytes;
  unsigned acc = 0;
  int bits = 0;
  std::size_t padding = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '=') {
      ++padding;
      continue;
    }
    const int v = decode_char(c);
    if (v < 0 || padding > 0)
      return make_error(ErrorCode::kParse,
                        fmt::format("NCCL unique id in base64: {} at offset {} (standard alphabet A-Z a-z 0-9 + /, "
                                    "'=' only at the end)",
                                    v < 0 ? fmt::format("invalid character 0x{:02x}", static_cast<unsigned char>(c))
                                          : std::string("data after '='"),
                                    i));
    acc = (acc << 6) | static_cast<unsigned>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  if (padding != 1 || bytes.size() != sizeof(UniqueId::bytes) || (acc & ((1u << bits) - 1)) != 0)
    return make_error(ErrorCode::kParse,
                      fmt::format("NCCL unique id in base64: decodes to {} bytes with {} '=' (expected exactly 128 "
                                  "bytes, one '=', no stray bits)",
                                  bytes.size(), padding));
  UniqueId id;
  std::memcpy(id.bytes.data(), bytes.data(), bytes.size());
  return id;
}

}  // namespace arlo::weight_sync::nccl
