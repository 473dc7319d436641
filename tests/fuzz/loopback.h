#pragma once
// What the network fuzz targets share: they play the peer of a real server on loopback. One
// connection per exchange: connect, send the fuzzer's bytes, close the sending half, and read what
// the server answers until it closes. `pump` runs between reads (a target whose server lives on the
// calling thread's io_context polls it there); a server that keeps the connection open past the
// deadline is a hang, which aborts.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace arlo::fuzz {

[[noreturn]] inline void die(const char* target, const char* what) {
  std::fprintf(stderr, "%s: %s (errno %d: %s)\n", target, what, errno, std::strerror(errno));
  std::abort();
}

// Sends `bytes` to 127.0.0.1:port, then shuts the sending half and returns everything read until
// the server closes, or until `done(answer)` says the server's answer is final. A server that
// neither reads nor closes within `deadline` aborts the run.
inline std::string exchange(const char* target, std::uint16_t port, std::string_view bytes,
                            const std::function<void()>& pump = {},
                            const std::function<bool(const std::string&)>& done = {},
                            std::chrono::milliseconds deadline = std::chrono::seconds(20)) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) die(target, "socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    // A signal (libFuzzer's timers) interrupted it: the connect goes on; wait for its outcome.
    if (errno != EINTR) die(target, "connect");
    pollfd w{fd, POLLOUT, 0};
    while (::poll(&w, 1, 5000) < 0 && errno == EINTR) {
    }
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      errno = err;
      die(target, "connect");
    }
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  const auto until = std::chrono::steady_clock::now() + deadline;
  std::size_t sent = 0;
  bool shut = false;
  std::string answer;
  char buf[16384];
  for (;;) {
    if (!shut && sent == bytes.size()) {
      ::shutdown(fd, SHUT_WR);
      shut = true;
    }
    if (pump) pump();
    pollfd p{fd, static_cast<short>(POLLIN | (shut ? 0 : POLLOUT)), 0};
    ::poll(&p, 1, pump ? 0 : 5);
    if (!shut && (p.revents & POLLOUT)) {
      const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<std::size_t>(n);
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        shut = true;  // the server closed on us (EPIPE, ECONNRESET): read what it said
        sent = bytes.size();
      }
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n > 0) {
        answer.append(buf, static_cast<std::size_t>(n));
        if (done && done(answer)) break;
        continue;
      }
      if (n == 0 || (errno != EAGAIN && errno != EINTR)) break;  // closed (or reset) by the server
    }
    if (std::chrono::steady_clock::now() > until)
      die(target, "the server neither closed nor read the connection in time");
  }
  ::close(fd);
  return answer;
}

// Splits a fuzz input into the exchanges of several connections at each "\n--next--\n".
inline std::vector<std::string_view> connections(std::string_view input, std::size_t max) {
  static constexpr std::string_view kSep = "\n--next--\n";
  std::vector<std::string_view> out;
  while (out.size() + 1 < max) {
    const std::size_t at = input.find(kSep);
    if (at == std::string_view::npos) break;
    out.push_back(input.substr(0, at));
    input.remove_prefix(at + kSep.size());
  }
  out.push_back(input);
  return out;
}

}  // namespace arlo::fuzz
