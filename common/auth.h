#pragma once
// The token that locks arlo's listening planes, and the checks every plane shares
// (docs/reliability.md, "Security model").
//
// - One secret per run: `arlo run` takes security.token / security.token_file, or generates one
//   from getrandom(), and hands it to its children in the environment (ARLO_TOKEN), never in argv.
//   A part started by hand reads ARLO_TOKEN or the file named by ARLO_TOKEN_FILE (process_token()).
// - HTTP planes want "Authorization: Bearer <token>"; the tcp weight publisher and the trainer
//   bridge send a random nonce and want proof(token, context, nonce) back (HMAC-SHA256), so the
//   token never crosses the wire.
// - A plane bound to a non-loopback address refuses to start without a token
//   (require_token_off_loopback).
// - Names that become paths (manifest shard names, ...) are checked with confined_path().
//
// SHA-256 (FIPS 180-4) and HMAC (RFC 2104) are implemented here, checked against the published
// test vectors (tests/unit/common/auth_test.cc). Thread-safe: every function is.
#include <array>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

#include "common/result.h"

namespace arlo::auth {

inline constexpr std::string_view kTokenEnv = "ARLO_TOKEN";
inline constexpr std::string_view kTokenFileEnv = "ARLO_TOKEN_FILE";
// Upper bound for a token (a file holding more is not a token file).
inline constexpr std::size_t kMaxTokenBytes = 4096;

using Digest = std::array<std::uint8_t, 32>;
Digest sha256(std::string_view data);
Digest hmac_sha256(std::string_view key, std::string_view message);
std::string to_hex(std::span<const std::uint8_t> bytes);

// Compares without an early exit, so the time taken does not tell how many leading bytes matched.
bool constant_time_equal(std::string_view a, std::string_view b);

// `bytes` random bytes from getrandom(2), as 2*bytes hex digits.
Result<std::string> random_hex(std::size_t bytes);
// A fresh token: 32 random bytes as 64 hex digits.
Result<std::string> generate_token();

// A token file's content without surrounding whitespace; an empty, unreadable or oversized file is
// an error naming the file.
Result<std::string> read_token_file(const std::filesystem::path& path);
// This process's token: $ARLO_TOKEN, else the content of $ARLO_TOKEN_FILE, else "" (no token).
Result<std::string> process_token();
// `token` if set, else the content of `token_file` if set, else process_token().
Result<std::string> resolve_token(const std::string& token, const std::string& token_file);

// 127.0.0.0/8, ::1 and "localhost" (brackets around an IPv6 address are allowed).
bool is_loopback(std::string_view host);
// The host part of "host:port" ("[::1]:80" -> "::1"; no colon: the whole string).
std::string host_of(std::string_view address);
// An error when `bind` is not a loopback address and `token` is empty: a plane reachable from other
// hosts must be locked. `plane` names it in the message ("worker admin server").
Status require_token_off_loopback(std::string_view plane, std::string_view bind, std::string_view token);

// Challenge-response: hex HMAC-SHA256 keyed with the token over "<context>\n<nonce>". `context`
// names the plane ("arlo-bridge/1"), so a proof for one plane is worth nothing on another.
std::string proof(std::string_view token, std::string_view context, std::string_view nonce);
bool verify_proof(std::string_view token, std::string_view context, std::string_view nonce, std::string_view answer);
// A nonce for one handshake (16 random bytes, hex). Falls back to nothing: an error is returned.
Result<std::string> nonce();

// HTTP: whether an Authorization header value is "Bearer <token>" (scheme case-insensitive).
bool bearer_matches(std::string_view authorization, std::string_view token);

// `dir / name` when `name` is a relative path that stays inside `dir`: not empty, not absolute, no
// "." / ".." / empty components, no NUL or backslash. Otherwise kInvalidArgument naming `what`
// (e.g. "shard name in /run/weights/v3/manifest.json") and the offending name.
Result<std::filesystem::path> confined_path(const std::filesystem::path& dir, std::string_view name,
                                            std::string_view what);

}  // namespace arlo::auth
