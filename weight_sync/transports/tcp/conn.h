#pragma once
// Blocking-with-deadline operations on one Asio TCP socket, and the framing of the weight_sync
// wire protocol. Each Conn owns its io_context and is driven by one thread at a time. Connect runs
// as an Asio async operation under the deadline; reads and writes use the descriptor in blocking
// mode with kernel timeouts (see conn.cc). Nothing here throws.
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "weight_sync/types.h"

namespace arlo::weight_sync::detail {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

// kChallenge {nonce}: the serving side's first frame on every link; kRefused {error}: it refuses
// the receiver (authentication failed) and closes.
enum class Frame : std::uint32_t { kHello = 1, kManifest, kAnswer, kBucket, kDone, kChallenge, kRefused };

// Control (JSON) frames are at most this long; before a link is authenticated, kMaxHandshakeBytes.
inline constexpr std::uint64_t kMaxControlBytes = 64ull << 20;
inline constexpr std::uint64_t kMaxHandshakeBytes = 64ull << 10;

struct FrameHeader {
  std::uint32_t magic = 0x57534c41;  // "ALSW"
  std::uint32_t type = 0;
  std::uint64_t a = 0;  // json: length; bucket: index
  std::uint64_t b = 0;  // bucket: wire bytes
};

// Runs one asynchronous operation on `ctx` (`start` gets its completion handler) until the handler
// has run or `deadline` passes; then `cancel` stops the operation and the context runs until its
// handler has. The operation's error code, or nullopt when the deadline cut it off.
template <typename Start, typename Cancel>
std::optional<boost::system::error_code> run_with_deadline(asio::io_context& ctx, Start start, Cancel cancel,
                                                           Deadline deadline) {
  bool done = false;
  boost::system::error_code result;
  start([&](const boost::system::error_code& ec, auto&&...) {
    done = true;
    result = ec;
  });
  ctx.restart();
  ctx.run_until(deadline);
  if (!done) {
    cancel();
    ctx.restart();
    ctx.run();
    // It may have completed before the cancel reached it (an accepted connection, bytes read): that
    // result stands.
    if (result != asio::error::operation_aborted) return result;
    return std::nullopt;
  }
  return result;
}

class Conn {
 public:
  Conn() : sock(ctx) {}
  Conn(const Conn&) = delete;

  Status connect(const tcp::endpoint& ep, Deadline deadline);
  Status write(const std::vector<asio::const_buffer>& buffers, Deadline deadline);
  Status read(asio::mutable_buffer buffer, Deadline deadline);
  Status send_json(Frame type, const nlohmann::json& body, Deadline deadline);
  // Reads the next frame header; for json frames also the body (into `body`).
  // A json frame longer than `max_json` is refused (kResourceExhausted) before it is read.
  Result<FrameHeader> recv_frame(nlohmann::json* body, Deadline deadline, std::uint64_t max_json = kMaxControlBytes);
  void close();
  void tune();  // TCP_NODELAY

  asio::io_context ctx;
  tcp::socket sock;
  std::string peer;  // name for reports

 private:
  template <typename Start>
  Status run(Start start, Deadline deadline, const char* what);
  Status blocking();
  Status arm(int opt, Deadline deadline);  // SO_SNDTIMEO / SO_RCVTIMEO for `deadline`
  // Moves `size` bytes with `io` (one send or recv of (offset, bytes left), returning what the call
  // returns), re-arming the kernel timeout `opt` before each call. `what` names it in errors.
  template <typename Io>
  Status transfer(int opt, std::size_t size, Deadline deadline, const char* what, Io io);
  bool blocking_ = false;
  struct Armed {
    Deadline deadline{};
    Clock::time_point at{};
  };
  Armed snd_armed_, rcv_armed_;
};

// What a receiver tells its sender: HELLO {peer, version, resume: {version, bucket}} and, to a
// MANIFEST, ANSWER {state: accepted | refused | need_full, error, start}. The peer is not trusted:
// a field of the wrong type or out of range (an answer's start past the manifest's `buckets`) is a
// kParse error naming it, never an exception.
struct Hello {
  std::string peer;
  std::optional<Version> version;
  std::optional<Version> resume_version;
  std::size_t resume_bucket = 0;
  std::string proof;  // auth::proof of the sender's CHALLENGE nonce (empty: the receiver has no token)
};
Result<Hello> parse_hello(const nlohmann::json& j);

struct Answer {
  std::string state;  // accepted | refused | need_full
  std::string error;
  std::size_t start = 0;
};
Result<Answer> parse_answer(const nlohmann::json& j, std::size_t buckets);

// "host:port" -> endpoint (numeric host or a name resolved once).
Result<tcp::endpoint> resolve(const std::string& address);

}  // namespace arlo::weight_sync::detail
