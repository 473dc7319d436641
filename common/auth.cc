#include "common/auth.h"

#include <sys/random.h>

#include <boost/asio/ip/address.hpp>
#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

namespace arlo::auth {

namespace {

// FIPS 180-4 section 4.2.2: the first 32 bits of the fractional parts of the cube roots of the
// first 64 primes.
constexpr std::array<std::uint32_t, 64> kRound = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

constexpr std::uint32_t rotr(std::uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

struct Sha256 {
  // Section 5.3.3: the initial hash value.
  std::array<std::uint32_t, 8> h = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                    0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::array<std::uint8_t, 64> block{};
  std::size_t used = 0;      // bytes in `block`
  std::uint64_t length = 0;  // message bytes so far

  void compress() {
    std::array<std::uint32_t, 64> w{};
    for (int t = 0; t < 16; ++t)
      w[t] = (std::uint32_t{block[4 * t]} << 24) | (std::uint32_t{block[4 * t + 1]} << 16) |
             (std::uint32_t{block[4 * t + 2]} << 8) | std::uint32_t{block[4 * t + 3]};
    for (int t = 16; t < 64; ++t) {
      const std::uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
      const std::uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    std::uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int t = 0; t < 64; ++t) {
      const std::uint32_t big1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
      const std::uint32_t ch = (e & f) ^ (~e & g);
      const std::uint32_t t1 = k + big1 + ch + kRound[t] + w[t];
      const std::uint32_t big0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
      const std::uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
      const std::uint32_t t2 = big0 + maj;
      k = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
  }

  void update(std::string_view data) {
    length += data.size();
    for (char ch : data) {
      block[used++] = static_cast<std::uint8_t>(ch);
      if (used == block.size()) {
        compress();
        used = 0;
      }
    }
  }

  Digest finish() {
    // Section 5.1.1: a 1 bit, zeros, then the message length in bits as a 64-bit big-endian number.
    const std::uint64_t bits = length * 8;
    block[used++] = 0x80;
    if (used > 56) {
      while (used < 64) block[used++] = 0;
      compress();
      used = 0;
    }
    while (used < 56) block[used++] = 0;
    for (int i = 7; i >= 0; --i) block[used++] = static_cast<std::uint8_t>(bits >> (8 * i));
    compress();
    Digest out{};
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 4; ++j) out[4 * i + j] = static_cast<std::uint8_t>(h[i] >> (24 - 8 * j));
    return out;
  }
};

std::string_view as_chars(const Digest& d) { return {reinterpret_cast<const char*>(d.data()), d.size()}; }

std::string trim(std::string s) {
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return {};
  const auto last = s.find_last_not_of(" \t\r\n");
  return s.substr(first, last - first + 1);
}

}  // namespace

Digest sha256(std::string_view data) {
  Sha256 s;
  s.update(data);
  return s.finish();
}

Digest hmac_sha256(std::string_view key, std::string_view message) {
  // RFC 2104: keys longer than the block are hashed first; then H((K ^ opad) || H((K ^ ipad) || m)).
  std::array<std::uint8_t, 64> k{};
  if (key.size() > k.size()) {
    const Digest hashed = sha256(key);
    std::memcpy(k.data(), hashed.data(), hashed.size());
  } else {
    std::memcpy(k.data(), key.data(), key.size());
  }
  std::string inner_pad(64, '\0'), outer_pad(64, '\0');
  for (std::size_t i = 0; i < 64; ++i) {
    inner_pad[i] = static_cast<char>(k[i] ^ 0x36);
    outer_pad[i] = static_cast<char>(k[i] ^ 0x5c);
  }
  Sha256 inner;
  inner.update(inner_pad);
  inner.update(message);
  const Digest inner_digest = inner.finish();
  Sha256 outer;
  outer.update(outer_pad);
  outer.update(as_chars(inner_digest));
  return outer.finish();
}

std::string to_hex(std::span<const std::uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (std::uint8_t b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 0xf]);
  }
  return out;
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  // The length is not secret (tokens and proofs have fixed lengths); the content is.
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

Result<std::string> random_hex(std::size_t bytes) {
  std::string raw(bytes, '\0');
  std::size_t got = 0;
  while (got < bytes) {
    const ssize_t n = ::getrandom(raw.data() + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return make_error(ErrorCode::kIo, fmt::format("getrandom: {}", std::strerror(errno)));
    }
    got += static_cast<std::size_t>(n);
  }
  return to_hex({reinterpret_cast<const std::uint8_t*>(raw.data()), raw.size()});
}

Result<std::string> generate_token() { return random_hex(32); }

Result<std::string> nonce() { return random_hex(16); }

Result<std::string> read_token_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::kNotFound, fmt::format("token file {}: cannot be opened", path.string()));
  std::string text(kMaxTokenBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > kMaxTokenBytes)
    return make_error(
        ErrorCode::kInvalidArgument,
        fmt::format("token file {}: larger than {} bytes; it holds something else", path.string(), kMaxTokenBytes));
  text = trim(std::move(text));
  if (text.empty())
    return make_error(ErrorCode::kInvalidArgument, fmt::format("token file {} is empty", path.string()));
  return text;
}

Result<std::string> process_token() {
  if (const char* t = std::getenv(std::string(kTokenEnv).c_str()); t && *t) return trim(t);
  if (const char* f = std::getenv(std::string(kTokenFileEnv).c_str()); f && *f) {
    auto token = read_token_file(f);
    if (!token) return std::unexpected(Error(token.error()).with_context(fmt::format("${}", kTokenFileEnv)));
    return token;
  }
  return std::string();
}

Result<std::string> resolve_token(const std::string& token, const std::string& token_file) {
  if (!token.empty()) return token;
  if (!token_file.empty()) return read_token_file(token_file);
  return process_token();
}

bool is_loopback(std::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host == "localhost") return true;
  boost::system::error_code ec;
  const auto address = boost::asio::ip::make_address(std::string(host), ec);
  return !ec && address.is_loopback();
}

std::string host_of(std::string_view address) {
  if (!address.empty() && address.front() == '[') {
    const auto close = address.find(']');
    if (close != std::string_view::npos) return std::string(address.substr(1, close - 1));
  }
  const auto colon = address.rfind(':');
  // One colon: host:port. More (a bare IPv6 address): no port to strip.
  if (colon == std::string_view::npos || address.find(':') != colon) return std::string(address);
  return std::string(address.substr(0, colon));
}

Status require_token_off_loopback(std::string_view plane, std::string_view bind, std::string_view token) {
  if (!token.empty() || is_loopback(bind)) return ok();
  return make_error(
      ErrorCode::kInvalidArgument,
      fmt::format("{} would listen on {}, which other hosts can reach, without a token: set "
                  "security.token or security.token_file (or ${} / ${} for a part started by hand), "
                  "or bind it to 127.0.0.1",
                  plane, bind.empty() ? std::string_view("all addresses") : bind, kTokenEnv, kTokenFileEnv));
}

std::string proof(std::string_view token, std::string_view context, std::string_view nonce_text) {
  std::string message;
  message.reserve(context.size() + 1 + nonce_text.size());
  message.append(context).push_back('\n');
  message.append(nonce_text);
  const Digest d = hmac_sha256(token, message);
  return to_hex(d);
}

bool verify_proof(std::string_view token, std::string_view context, std::string_view nonce_text,
                  std::string_view answer) {
  return constant_time_equal(proof(token, context, nonce_text), answer);
}

bool bearer_matches(std::string_view authorization, std::string_view token) {
  if (token.empty()) return false;
  constexpr std::string_view kScheme = "bearer ";
  if (authorization.size() < kScheme.size()) return false;
  for (std::size_t i = 0; i < kScheme.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(authorization[i])) != kScheme[i]) return false;
  std::string_view given = authorization.substr(kScheme.size());
  while (!given.empty() && (given.back() == ' ' || given.back() == '\t')) given.remove_suffix(1);
  return constant_time_equal(given, token);
}

Result<std::filesystem::path> confined_path(const std::filesystem::path& dir, std::string_view name,
                                            std::string_view what) {
  auto refuse = [&](std::string_view why) -> Result<std::filesystem::path> {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("{}: '{}' {}; a name must be a relative path inside {}",
                                                               what, name, why, dir.string()));
  };
  if (name.empty()) return refuse("is empty");
  if (name.find('\0') != std::string_view::npos) return refuse("contains a NUL byte");
  if (name.find('\\') != std::string_view::npos) return refuse("contains a backslash");
  if (name.front() == '/') return refuse("is an absolute path");
  std::size_t start = 0;
  while (start <= name.size()) {
    const auto slash = name.find('/', start);
    const std::string_view part =
        name.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (part.empty()) return refuse("has an empty path component");
    if (part == "..") return refuse("has a '..' component (it would leave the directory)");
    if (part == ".") return refuse("has a '.' component");
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return dir / std::filesystem::path(std::string(name));
}

}  // namespace arlo::auth
