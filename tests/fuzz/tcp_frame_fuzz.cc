// libFuzzer target for the tcp weight transport's frames (weight_sync/transports/tcp/conn.cc and
// what tcp/receiver.cc makes of them): the fuzzer's bytes are a peer's side of one link, read by a real
// detail::Conn (on one end of a socketpair) frame after frame with Conn::recv_frame until the
// stream ends or is refused, as either side of a link reads them:
//   HELLO    -> detail::parse_hello    (a sender reading a receiver, on gather and on resume)
//   ANSWER   -> detail::parse_answer   (a sender reading a receiver's answer to its manifest)
//   MANIFEST -> Manifest::from_json    (a receiver reading its sender)
//   BUCKET   -> its wire bytes and trailing checksum, at most the manifest's largest bucket
//
// Properties checked: nothing crashes, throws or hangs, whatever the bytes; every refusal says why;
// a parsed HELLO or ANSWER holds what its fields said (an ANSWER's start within the manifest).
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/fuzz/check.h"
#include "weight_sync/manifest.h"
#include "weight_sync/transports/tcp/conn.h"

namespace {

namespace ws = arlo::weight_sync;
using arlo::fuzz::check;
using ws::detail::Frame;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  int fds[2];
  check(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0, "socketpair");
  // The whole input fits the socket buffer: write it, then close the peer's end (EOF after it).
  const int buffer = 1 << 20;
  ::setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
  ::setsockopt(fds[1], SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::send(fds[0], data + done, size - done, MSG_NOSIGNAL);
    check(n > 0, "fill the socketpair");
    done += static_cast<std::size_t>(n);
  }
  ::close(fds[0]);

  ws::detail::Conn conn;
  conn.peer = "fuzz peer";
  conn.sock.assign(boost::asio::ip::tcp::v4(), fds[1]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::optional<ws::Manifest> manifest;
  for (int frames = 0; frames < 64; ++frames) {
    nlohmann::json body;
    auto h = conn.recv_frame(&body, deadline);
    if (!h) {
      check(!h.error().what().empty(), "a refused frame says why");
      break;
    }
    const auto type = static_cast<Frame>(h->type);
    if (type == Frame::kHello) {
      auto hello = ws::detail::parse_hello(body);
      if (!hello) {
        check(!hello.error().what().empty(), "a refused HELLO says why");
        break;
      }
      check(hello->peer == (body.is_object() && body.contains("peer") ? body["peer"].get<std::string>() : ""),
            "HELLO peer");
      check(!hello->resume_version || hello->resume_bucket < (std::size_t{1} << 32), "HELLO resume bucket in range");
    } else if (type == Frame::kAnswer) {
      auto answer = ws::detail::parse_answer(body, manifest ? manifest->buckets.size() : 0);
      if (!answer) {
        check(!answer.error().what().empty(), "a refused ANSWER says why");
        break;
      }
      check(answer->state == "accepted" || answer->state == "refused" || answer->state == "need_full",
            "ANSWER state is one of the three");
      check(answer->start <= (manifest ? manifest->buckets.size() : 0), "ANSWER start within the manifest");
    } else if (type == Frame::kManifest) {
      auto m = ws::Manifest::from_json(body);
      if (!m) {
        check(!m.error().what().empty(), "a refused manifest says why");
        break;
      }
      manifest = std::move(*m);
    } else if (type == Frame::kBucket) {
      // What recv_bucket() does with a frame before a byte lands in a sink: a size check.
      const std::uint64_t limit = manifest ? std::min<std::uint64_t>(manifest->max_bucket_bytes(), 1 << 20) : 0;
      if (h->b > limit) break;
      std::vector<std::byte> bytes(h->b + sizeof(std::uint64_t));
      if (!conn.read(boost::asio::buffer(bytes.data(), bytes.size()), deadline)) break;
    }
  }
  conn.close();
  return 0;
}
