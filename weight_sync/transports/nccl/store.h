#pragma once
// A rendezvous store that speaks torch's c10d TCPStore wire protocol, so that vLLM's and SGLang's
// workers (torch's own TCPStore client) can read the NCCL unique id from a C++ rank 0, and a small
// client of the same protocol for arlo's own peers and tests.
//
// Wire format (little-endian): a request is one u8 command and its fields; a string or a byte
// value is a u64 length and the bytes; key counts are u64 (MULTI_SET: i64). Two dialects exist:
//   - torch >= 2.2 ("current"): VALIDATE 0 (u32 magic 0x3C85F7CE, no reply), SET 1, COMPARE_SET 2,
//     GET 3, ADD 4, CHECK 5, WAIT 6, GETNUMKEYS 7, DELETE_KEY 8, APPEND 9, MULTI_GET 10,
//     MULTI_SET 11, CANCEL_WAIT 12, PING 13 (u32 nonce, echoed), QUEUE_PUSH/POP/LEN 14-16
//     (libuv server only: refused), LIST_KEYS 17 (no fields; a u64 count and every key), BARRIER
//     18 (key, i64 world size; STOP_WAITING to every arrival once world size arrived, counted
//     under the key). Every connection starts with VALIDATE.
//   - torch < 2.2 ("legacy", e.g. Debian's torch 1.13): no VALIDATE, no PING, SET 0, COMPARE_SET 1,
//     GET 2, ADD 3, CHECK 4, WAIT 5, GETNUMKEYS 6, WATCH_KEY 7 (refused); 8-12 as above.
// The server picks the dialect per connection from its first request (VALIDATE with the magic:
// current; anything else: legacy), so both kinds of peers can share one store. The client always
// speaks the current dialect.
//
// Keys are wire keys: torch's client prefixes "/" to user keys ("broadcast_from/0/0" is
// "/broadcast_from/0/0" on the wire), except its own "init/" counter. Callers here pass what is on
// the wire.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "common/result.h"
#include "weight_sync/types.h"

namespace arlo::weight_sync::nccl {

// Limits on one request; a request over them closes its connection with a log line.
inline constexpr std::size_t kStoreMaxKeyBytes = std::size_t{1} << 20;    // 1 MiB
inline constexpr std::size_t kStoreMaxValueBytes = std::size_t{1} << 30;  // 1 GiB
inline constexpr std::size_t kStoreMaxKeysPerRequest = std::size_t{1} << 16;
inline constexpr std::uint32_t kStoreValidateMagic = 0x3C85F7CE;

// The wire encoding above, for everything that writes requests or answers (client, server, and the
// tests and fuzzers that craft raw bytes): store_append(out, fields...) appends each field in turn,
// an arithmetic value as its bytes (host order: every supported machine is little-endian), a string
// as a u64 length and the bytes, a key list as a u64 count and each key as a string.
namespace store_wire {
template <typename T>
requires std::is_arithmetic_v<T>
void append_field(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
inline void append_field(std::string& out, std::string_view s) {
  append_field<std::uint64_t>(out, s.size());
  out.append(s);
}
inline void append_field(std::string& out, const std::vector<std::string>& keys) {
  append_field<std::uint64_t>(out, keys.size());
  for (const auto& k : keys) append_field(out, std::string_view(k));
}
}  // namespace store_wire

template <typename... Fields>
void store_append(std::string& out, const Fields&... fields) {
  (store_wire::append_field(out, fields), ...);
}
template <typename... Fields>
std::string store_encode(const Fields&... fields) {
  std::string out;
  store_append(out, fields...);
  return out;
}

// Serves the store on its own thread (one thread, poll() over every socket). GET or MULTI_GET of a
// missing key, and ADD onto a value that is not an integer, close that connection, as torch's
// server does (its clients always WAIT before GET). Torch's client ADDs 1 to "init/" at connect when
// given a world size; that counter is an ordinary key here (watch it with on_change).
// Queue commands (libuv server only) and the legacy WATCH_KEY are refused: the connection is closed
// with a log line naming the command. Thread-safety: every public member may be called from any
// thread.
class StoreServer {
 public:
  // Listens on host:port (port 0: an ephemeral one) and serves on its own thread until destroyed.
  static Result<std::unique_ptr<StoreServer>> start(const std::string& host, std::uint16_t port);
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  ~StoreServer();  // stops the thread, closes every connection (waiting clients see EOF)

  std::uint16_t port() const;

  // In-process access, same semantics as the wire commands.
  void set(const std::string& key, std::string value);  // wakes waiters (wire and in-process)
  std::optional<std::string> get(const std::string& key) const;
  // Adds to the decimal ASCII integer under `key` (missing: 0) and stores the sum the same way, as
  // torch does. A value that is not an integer is treated as 0 and replaced (logged).
  std::int64_t add(const std::string& key, std::int64_t delta);
  // Blocks until every key exists (true), `deadline` passes or the server stops (false). The
  // destructor returns only after every wait() in progress has returned.
  bool wait(const std::vector<std::string>& keys, std::chrono::steady_clock::time_point deadline) const;
  std::size_t waiting() const;  // wait() calls blocked now (diagnostics, tests)

  // Called on the server thread after every SET/ADD/APPEND/MULTI_SET/COMPARE_SET from any source
  // (wire or in-process) with the key changed; lets the owner react to a peer's request without
  // polling. Must not block for long (it holds up every client). Set it before clients come.
  void on_change(std::function<void(const std::string& key)> callback);

  std::size_t connections() const;  // open client connections now

  struct Impl;

 private:
  explicit StoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The same protocol's client (current dialect), for arlo's own peers and tests. One connection;
// calls are serialized (thread-safe, one at a time). Every call has a deadline; errors say which
// command, which key and which server. After an I/O error or a deadline the connection is closed
// (the stream position is unknown) and later calls fail with kUnavailable.
class StoreClient {
 public:
  // Connects (retrying refused connections until deadline), sends VALIDATE and PING like torch's
  // client.
  static Result<std::unique_ptr<StoreClient>> connect(const std::string& host, std::uint16_t port, Deadline deadline);
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;
  ~StoreClient();

  Status set(const std::string& key, std::string_view value, Deadline deadline);
  // WAITs for the key first, then GETs it (as torch does).
  Result<std::string> get(const std::string& key, Deadline deadline);
  Result<std::int64_t> add(const std::string& key, std::int64_t delta, Deadline deadline);
  Result<bool> check(const std::vector<std::string>& keys, Deadline deadline);
  // On expiry sends CANCEL_WAIT (reading a late STOP_WAITING if one crossed it) and returns
  // kTimeout; the connection stays usable.
  Status wait(const std::vector<std::string>& keys, Deadline deadline);

  // The rest of the protocol.
  // COMPARE_SET: sets `desired` when the value equals `expected` (a missing key matches an empty
  // `expected`); returns the value now stored (or `expected` for a missing key, as torch answers).
  Result<std::string> compare_set(const std::string& key, std::string_view expected, std::string_view desired,
                                  Deadline deadline);
  Result<std::int64_t> num_keys(Deadline deadline);
  Result<bool> delete_key(const std::string& key, Deadline deadline);  // true if it existed
  Status append(const std::string& key, std::string_view value, Deadline deadline);
  // WAITs for every key, then MULTI_GET.
  Result<std::vector<std::string>> multi_get(const std::vector<std::string>& keys, Deadline deadline);
  Status multi_set(const std::vector<std::pair<std::string, std::string>>& items, Deadline deadline);
  Result<std::uint32_t> ping(std::uint32_t nonce, Deadline deadline);

  // Sends raw bytes as they are (tests of the server's handling of malformed requests), and reads
  // exactly `n` raw bytes.
  Status send_raw(std::string_view bytes, Deadline deadline);
  Result<std::string> recv_raw(std::size_t n, Deadline deadline);

  const std::string& server() const;  // "host:port", for messages

  struct Impl;

 private:
  explicit StoreClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace arlo::weight_sync::nccl
