#pragma once
// Blocking-with-deadline operations on one Asio TCP socket, and the framing of the weight_sync
// wire protocol. Each Conn owns its io_context and is driven by one thread at a time. Connect runs
// as an Asio async operation under the deadline; reads and writes use the descriptor in blocking
// mode with kernel timeouts (see tcp_conn.cc). Nothing here throws.
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "weight_sync/types.h"

namespace arlo::weight_sync::detail {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

enum class Frame : std::uint32_t { kHello = 1, kManifest, kAnswer, kBucket, kDone };

struct FrameHeader {
  std::uint32_t magic = 0x57534c41;  // "ALSW"
  std::uint32_t type = 0;
  std::uint64_t a = 0;  // json: length; bucket: index
  std::uint64_t b = 0;  // bucket: wire bytes
};

class Conn {
 public:
  Conn() : sock(ctx) {}
  Conn(const Conn&) = delete;

  Status connect(const tcp::endpoint& ep, Deadline deadline);
  Status write(const std::vector<asio::const_buffer>& buffers, Deadline deadline);
  Status read(asio::mutable_buffer buffer, Deadline deadline);
  Status send_json(Frame type, const nlohmann::json& body, Deadline deadline);
  // Reads the next frame header; for json frames also the body (into `body`).
  Result<FrameHeader> recv_frame(nlohmann::json* body, Deadline deadline);
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
  bool blocking_ = false;
  struct Armed {
    Deadline deadline{};
    Clock::time_point at{};
  };
  Armed snd_armed_, rcv_armed_;
};

// "host:port" -> endpoint (numeric host or a name resolved once).
Result<tcp::endpoint> resolve(const std::string& address);

}  // namespace arlo::weight_sync::detail
