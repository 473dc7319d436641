#pragma once
// The TCPStore's wire (store.h describes the protocol): the commands of both dialects, the
// request encoding of the client, the incremental parser of the server, and the socket helpers
// both sides share. store_server.cc and store_client.cc are the two sides.
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "common/result.h"
#include "weight_sync/transports/nccl/store.h"

namespace arlo::weight_sync::nccl::store_wire {

// One name per command, independent of the dialect's numbering.
enum class Cmd {
  kValidate,
  kSet,
  kCompareSet,
  kGet,
  kAdd,
  kCheck,
  kWait,
  kGetNumKeys,
  kDeleteKey,
  kAppend,
  kMultiGet,
  kMultiSet,
  kCancelWait,
  kPing,
  kWatchKey,
  kQueuePush,
  kQueuePop,
  kQueueLen,
  kListKeys,
  kBarrier,
  kUnknown,
};

// The command's name, for messages.
const char* cmd_name(Cmd c);

enum class Dialect { kUnknown, kCurrent, kLegacy };

// torch >= 2.2 numbering (TCPStoreBackend.hpp QueryType; LIST_KEYS and BARRIER appended after the
// queue commands by later releases).
Cmd current_cmd(std::uint8_t b);

// torch < 2.2 numbering: no VALIDATE/PING, WATCH_KEY at 7.
Cmd legacy_cmd(std::uint8_t b);

// The command's byte in the current dialect (0xff: none).
std::uint8_t current_byte(Cmd c);

// A client request in the current dialect: the command's byte, then `fields` (store_append).
template <typename... Fields>
std::string request(Cmd c, const Fields&... fields) {
  return store_encode(current_byte(c), fields...);
}

inline constexpr std::uint8_t kStopWaiting = 0;
inline constexpr std::uint8_t kWaitCanceled = 1;
inline constexpr std::uint8_t kReady = 0;
inline constexpr std::uint8_t kNotReady = 1;

// A key or value for a message: printable, at most 80 characters.
std::string show(std::string_view s);

// At most the first 8 keys, shown.
std::string show_keys(const std::vector<std::string>& keys);

// Parses a decimal integer the way torch's server does (std::stoll: leading spaces, sign, digits,
// trailing characters ignored). nullopt when there are no digits.
std::optional<std::int64_t> parse_int(std::string_view s);

// a + b, wrapping around as torch's server does.
std::int64_t wrapping_add(std::int64_t a, std::int64_t b);

// strerror(err).
std::string errno_text(int err);

// Drops the consumed front of a connection's buffer: all of it once everything was consumed, else
// once over 1 MiB was (so a busy connection's buffer neither grows without bound nor moves bytes often).
void drop_consumed(std::string& buf, std::size_t& pos);

// TCP_NODELAY on.
void set_nodelay(int fd);

// host:port of a peer's address.
std::string peer_name(const sockaddr_storage& ss);

// Resolves host:port to socket addresses (numeric hosts or names).
Result<std::vector<sockaddr_storage>> resolve(const std::string& host, std::uint16_t port, bool passive);

// The length of the address `ss` holds.
socklen_t addr_len(const sockaddr_storage& ss);

// Incremental parser over a connection's input. Fields are views into the buffer; nothing is
// copied until a whole request is present. `need_more` means the request is incomplete; `bad`
// carries the reason a request is refused.
struct Reader {
  std::string_view buf;
  std::size_t pos = 0;
  bool need_more = false;
  std::string bad;

  bool ok() const { return !need_more && bad.empty(); }
  template <typename T>
  T value() {
    if (!ok()) return T{};
    if (buf.size() - pos < sizeof(T)) {
      need_more = true;
      return T{};
    }
    T v;
    std::memcpy(&v, buf.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string_view bytes(std::size_t limit, const char* what) {
    const auto n = value<std::uint64_t>();
    if (!ok()) return {};
    if (n > limit) {
      bad = fmt::format("{} of {} bytes is over the limit of {} bytes", what, n, limit);
      return {};
    }
    if (buf.size() - pos < n) {
      need_more = true;
      return {};
    }
    std::string_view v = buf.substr(pos, n);
    pos += n;
    return v;
  }
  std::string_view key() { return bytes(kStoreMaxKeyBytes, "a key"); }
  std::string_view val() { return bytes(kStoreMaxValueBytes, "a value"); }
  std::uint64_t count() {
    const auto n = value<std::uint64_t>();
    if (ok() && n > kStoreMaxKeysPerRequest)
      bad = fmt::format("{} keys in one request is over the limit of {}", n, kStoreMaxKeysPerRequest);
    return n;
  }
};

// Stop reading a connection's requests while this much of its output is unsent.
inline constexpr std::size_t kMaxPendingOutput = std::size_t{64} << 20;

}  // namespace arlo::weight_sync::nccl::store_wire
