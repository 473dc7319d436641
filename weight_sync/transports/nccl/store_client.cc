// The TCPStore's client (store.h): blocking calls under a deadline on one connection, in the
// current dialect; a WAIT that reaches its deadline is cancelled on the server.
#include "weight_sync/transports/nccl/store.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "common/log.h"
#include "weight_sync/transports/nccl/store_wire.h"

namespace arlo::weight_sync::nccl {

using namespace store_wire;

// ---------------------------------------------------------------------------------------------
// StoreClient

struct StoreClient::Impl {
  int fd = -1;
  std::string server;
  std::mutex mu;

  ~Impl() { close(); }
  void close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }

  Error error(ErrorCode code, const char* cmd, std::string_view what, std::string detail) const {
    return Error(code,
                 fmt::format("rendezvous store {}: {}{}{}: {}", server, cmd, what.empty() ? "" : " ", what, detail));
  }

  Error not_connected(const char* cmd, std::string_view what) const {
    return error(ErrorCode::kUnavailable, cmd, what, "not connected (an earlier call failed)");
  }

  // Waits for `events` on the socket until the deadline: true when ready.
  bool ready(short events, Deadline deadline) const {
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left < 0) return false;
      pollfd p{fd, events, 0};
      const int n = ::poll(&p, 1, static_cast<int>(std::min<long long>(left + 1, 60000)));
      if (n > 0) return true;
      if (n < 0 && errno != EINTR) return true;  // let the next syscall report it
    }
  }

  Status write(std::string_view bytes, Deadline deadline, const char* cmd, std::string_view what) {
    if (fd < 0) return std::unexpected(not_connected(cmd, what));
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n > 0) {
        done += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!ready(POLLOUT, deadline)) {
          close();
          return std::unexpected(error(ErrorCode::kTimeout, cmd, what, "deadline passed while sending"));
        }
        continue;
      }
      const int err = errno;
      close();
      return std::unexpected(error(ErrorCode::kUnavailable, cmd, what, "send failed: " + errno_text(err)));
    }
    return ok();
  }

  // Reads exactly n bytes. On a deadline the connection stays open when `keep_on_timeout` (WAIT).
  Result<std::string> read(std::size_t n, Deadline deadline, const char* cmd, std::string_view what,
                           bool keep_on_timeout = false) {
    if (fd < 0) return std::unexpected(not_connected(cmd, what));
    std::string out(n, '\0');
    std::size_t done = 0;
    while (done < n) {
      const ssize_t got = ::recv(fd, out.data() + done, n - done, 0);
      if (got > 0) {
        done += static_cast<std::size_t>(got);
        continue;
      }
      if (got == 0) {
        close();
        return std::unexpected(error(ErrorCode::kUnavailable, cmd, what,
                                     "the server closed the connection (it refused the request, or stopped)"));
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!ready(POLLIN, deadline)) {
          if (!(keep_on_timeout && done == 0)) close();
          return std::unexpected(error(ErrorCode::kTimeout, cmd, what, "deadline passed waiting for the answer"));
        }
        continue;
      }
      const int err = errno;
      close();
      return std::unexpected(error(ErrorCode::kUnavailable, cmd, what, "recv failed: " + errno_text(err)));
    }
    return out;
  }

  template <typename T>
  Result<T> read_value(Deadline deadline, const char* cmd, std::string_view what, bool keep = false) {
    ARLO_ASSIGN_OR_RETURN(auto bytes, read(sizeof(T), deadline, cmd, what, keep));
    T v;
    std::memcpy(&v, bytes.data(), sizeof(T));
    return v;
  }

  Result<std::string> read_bytes(Deadline deadline, const char* cmd, std::string_view what) {
    ARLO_ASSIGN_OR_RETURN(auto n, read_value<std::uint64_t>(deadline, cmd, what));
    if (n > kStoreMaxValueBytes) {
      close();
      return std::unexpected(error(ErrorCode::kResourceExhausted, cmd, what,
                                   fmt::format("answer of {} bytes is over the limit of {}", n, kStoreMaxValueBytes)));
    }
    return read(n, deadline, cmd, what);
  }

  Status wait(const std::vector<std::string>& keys, Deadline deadline) {
    const auto what = show_keys(keys);
    ARLO_TRY(write(request(Cmd::kWait, keys), deadline, "WAIT", what));
    auto answer = read_value<std::uint8_t>(deadline, "WAIT", what, true);
    if (answer) {
      if (*answer != kStopWaiting) {
        close();
        return std::unexpected(error(ErrorCode::kParse, "WAIT", what, fmt::format("unexpected answer {}", *answer)));
      }
      return ok();
    }
    if (answer.error().code() != ErrorCode::kTimeout || fd < 0) return std::unexpected(answer.error());
    // Deadline: cancel. A STOP_WAITING may have crossed the CANCEL_WAIT; then WAIT_CANCELED follows.
    const auto grace = Clock::now() + std::chrono::seconds(10);
    ARLO_TRY(write(request(Cmd::kCancelWait), grace, "CANCEL_WAIT", what));
    ARLO_ASSIGN_OR_RETURN(auto first, read_value<std::uint8_t>(grace, "CANCEL_WAIT", what));
    if (first == kStopWaiting) {
      ARLO_ASSIGN_OR_RETURN(first, read_value<std::uint8_t>(grace, "CANCEL_WAIT", what));
    }
    if (first != kWaitCanceled) {
      close();
      return std::unexpected(error(ErrorCode::kParse, "CANCEL_WAIT", what, fmt::format("unexpected answer {}", first)));
    }
    return std::unexpected(error(ErrorCode::kTimeout, "WAIT", what, "deadline passed before every key existed"));
  }
};

Result<std::unique_ptr<StoreClient>> StoreClient::connect(const std::string& host, std::uint16_t port,
                                                          Deadline deadline) {
  auto impl = std::make_unique<Impl>();
  impl->server = fmt::format("{}:{}", host, port);
  ARLO_ASSIGN_OR_RETURN(auto addrs, with_context(resolve(host, port, false), "rendezvous store " + impl->server));
  auto backoff = std::chrono::milliseconds(10);
  std::string last;
  for (std::size_t attempt = 0;; ++attempt) {
    const auto& a = addrs[attempt % addrs.size()];
    const int fd = ::socket(a.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
      return make_error(ErrorCode::kIo, "rendezvous store " + impl->server + ": socket: " + errno_text(errno));
    impl->fd = fd;
    int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&a), addr_len(a));
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      if (!impl->ready(POLLOUT, deadline)) {
        impl->close();
        // The deadline ran out during an attempt: after refusals, the refusal is the reason.
        if (!last.empty())
          return make_error(ErrorCode::kUnavailable,
                            "rendezvous store " + impl->server + ": connect: " + last + " until the deadline");
        return make_error(ErrorCode::kTimeout, "rendezvous store " + impl->server + ": connect: deadline passed");
      }
      socklen_t len = sizeof err;
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    }
    if (err == 0) break;
    impl->close();
    last = errno_text(err);
    if (err != ECONNREFUSED && err != ECONNRESET && err != ETIMEDOUT && err != EHOSTUNREACH && err != ENETUNREACH)
      return make_error(ErrorCode::kUnavailable, "rendezvous store " + impl->server + ": connect: " + last);
    // Refused: the server may not be listening yet. Retry with a growing pause until the deadline.
    if (Clock::now() + backoff >= deadline)
      return make_error(ErrorCode::kUnavailable,
                        "rendezvous store " + impl->server + ": connect: " + last + " until the deadline");
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
  set_nodelay(impl->fd);
  const auto nonce = static_cast<std::uint32_t>(::getpid());
  const std::string hello = request(Cmd::kValidate, kStoreValidateMagic) + request(Cmd::kPing, nonce);
  ARLO_TRY(impl->write(hello, deadline, "VALIDATE+PING", ""));
  ARLO_ASSIGN_OR_RETURN(auto echo, impl->read_value<std::uint32_t>(deadline, "PING", ""));
  if (echo != nonce)
    return make_error(ErrorCode::kMismatch,
                      fmt::format("rendezvous store {}: PING answered {} for nonce {}", impl->server, echo, nonce));
  return std::unique_ptr<StoreClient>(new StoreClient(std::move(impl)));
}

StoreClient::StoreClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StoreClient::~StoreClient() = default;

const std::string& StoreClient::server() const { return impl_->server; }

Status StoreClient::set(const std::string& key, std::string_view value, Deadline deadline) {
  std::lock_guard lock(impl_->mu);
  return impl_->write(request(Cmd::kSet, key, value), deadline, "SET", show(key));
}

Result<std::string> StoreClient::get(const std::string& key, Deadline deadline) {
  std::lock_guard lock(impl_->mu);
  ARLO_TRY(impl_->wait({key}, deadline));
  ARLO_TRY(impl_->write(request(Cmd::kGet, key), deadline, "GET", show(key)));
  return impl_->read_bytes(deadline, "GET", show(key));
}

Result<std::int64_t> StoreClient::add(const std::string& key, std::int64_t delta, Deadline deadline) {
  std::lock_guard lock(impl_->mu);
  ARLO_TRY(impl_->write(request(Cmd::kAdd, key, delta), deadline, "ADD", show(key)));
  return impl_->read_value<std::int64_t>(deadline, "ADD", show(key));
}

Result<bool> StoreClient::check(const std::vector<std::string>& keys, Deadline deadline) {
  std::lock_guard lock(impl_->mu);
  ARLO_TRY(impl_->write(request(Cmd::kCheck, keys), deadline, "CHECK", show_keys(keys)));
  ARLO_ASSIGN_OR_RETURN(auto answer, impl_->read_value<std::uint8_t>(deadline, "CHECK", show_keys(keys)));
  if (answer != kReady && answer != kNotReady) {
    impl_->close();
    return std::unexpected(
        impl_->error(ErrorCode::kParse, "CHECK", show_keys(keys), fmt::format("unexpected answer {}", answer)));
  }
  return answer == kReady;
}

Status StoreClient::wait(const std::vector<std::string>& keys, Deadline deadline) {
  std::lock_guard lock(impl_->mu);
  return impl_->wait(keys, deadline);
}

Result<std::string> StoreClient::compare_set(const std::string& key, std::string_view expected,
                                             std::string_view desired, Deadline deadline) {
  std::lock_guard lock(impl_->mu);
  ARLO_TRY(impl_->write(request(Cmd::kCompareSet, key, expected, desired), deadline, "COMPARE_SET", show(key)));
  return impl_->read_bytes(deadline, "COMPARE_SET", show(key));
}

Result<std::int64_t> StoreClient::num_keys(Deadline deadline) {
  std::lock_guard lock(impl_->mu);
  ARLO_TRY(impl_->write(request(Cmd::kGetNumKeys), deadline, "GETNUMKEYS", ""));
  return impl_->read_value<std::int64_t>(deadline, "GETNUMKEYS", "");
}

Result<bool> StoreClient::delete_key(const std::string& key, Deadline deadline) {
  std::lock_guard lock(impl_->mu);
  ARLO_TRY(impl_->write(request(Cmd::kDeleteKey, key), deadline, "DELETE_KEY", show(key)));
  ARLO_ASSIGN_OR_RETURN(auto n, impl_->read_value<std::int64_t>(deadline, "DELETE_KEY", show(key)));
  return n == 1;
}

Status StoreClient::append(const std::string& key, std::string_view value, Deadline deadline) {
  std::lock_guard lock(impl_->mu);
  return impl_->write(request(Cmd::kAppend, key, value), deadline, "APPEND", show(key));
}

Result<std::vector<std::string>> StoreClient::multi_get(const std::vector<std::string>& keys, Deadline deadline) {
  std::lock_guard lock(impl_->mu);
  ARLO_TRY(impl_->wait(keys, deadline));
  ARLO_TRY(impl_->write(request(Cmd::kMultiGet, keys), deadline, "MULTI_GET", show_keys(keys)));
  std::vector<std::string> out;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    ARLO_ASSIGN_OR_RETURN(auto v, impl_->read_bytes(deadline, "MULTI_GET", show(keys[i])));
    out.push_back(std::move(v));
  }
  return out;
}

Status StoreClient::multi_set(const std::vector<std::pair<std::string, std::string>>& items, Deadline deadline) {
  std::lock_guard lock(impl_->mu);
  std::string req = request(Cmd::kMultiSet, static_cast<std::int64_t>(items.size()));  // MULTI_SET: an i64 count
  std::vector<std::string> keys;
  for (const auto& [k, v] : items) {
    store_append(req, k, v);
    keys.push_back(k);
  }
  return impl_->write(req, deadline, "MULTI_SET", show_keys(keys));
}

Result<std::uint32_t> StoreClient::ping(std::uint32_t nonce, Deadline deadline) {
  std::lock_guard lock(impl_->mu);
  ARLO_TRY(impl_->write(request(Cmd::kPing, nonce), deadline, "PING", ""));
  return impl_->read_value<std::uint32_t>(deadline, "PING", "");
}

Status StoreClient::send_raw(std::string_view bytes, Deadline deadline) {
  std::lock_guard lock(impl_->mu);
  return impl_->write(bytes, deadline, "raw send", "");
}

Result<std::string> StoreClient::recv_raw(std::size_t n, Deadline deadline) {
  std::lock_guard lock(impl_->mu);
  return impl_->read(n, deadline, "raw recv", "");
}

}  // namespace arlo::weight_sync::nccl
