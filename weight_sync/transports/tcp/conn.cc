#include "weight_sync/transports/tcp/conn.h"
#include "weight_sync/wire.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>
#include <cstring>

namespace arlo::weight_sync::detail {

template <typename Start>
Status Conn::run(Start start, Deadline deadline, const char* what) {
  const auto cancel = [&] {
    boost::system::error_code ignored;
    sock.cancel(ignored);
  };
  const auto result = run_with_deadline(ctx, std::move(start), cancel, deadline);
  if (!result) return make_error(ErrorCode::kTimeout, std::string(what) + " timed out");
  if (*result) {
    const bool closed =
        *result == asio::error::eof || *result == asio::error::connection_reset || *result == asio::error::broken_pipe;
    return make_error(closed ? ErrorCode::kUnavailable : ErrorCode::kIo,
                      std::string(what) + ": " + (closed ? "connection closed by peer" : result->message()));
  }
  return ok();
}

Status Conn::connect(const tcp::endpoint& ep, Deadline deadline) {
  boost::system::error_code ignored;
  sock.close(ignored);
  blocking_ = false;
  snd_armed_ = rcv_armed_ = {};
  return run([&](auto h) { sock.async_connect(ep, std::move(h)); }, deadline, "connect");
}

// Bulk I/O uses the socket's descriptor in blocking mode with SO_SNDTIMEO/SO_RCVTIMEO set to the
// time left: one syscall per chunk and a direct wake-up by the kernel, which measured about twice
// as fast on loopback as reactor-driven async operations per chunk. Asio still owns the socket,
// connects, accepts and resolves.
namespace {
Status set_timeout(int fd, int opt, Deadline deadline) {
  const auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return make_error(ErrorCode::kTimeout, "deadline passed");
  const auto us = std::max<long long>(1000, std::chrono::duration_cast<std::chrono::microseconds>(left).count());
  timeval tv{static_cast<time_t>(us / 1000000), static_cast<suseconds_t>(us % 1000000)};
  if (::setsockopt(fd, SOL_SOCKET, opt, &tv, sizeof tv) != 0)
    return make_error(ErrorCode::kIo, std::string("setsockopt timeout: ") + std::strerror(errno));
  return ok();
}

Status io_error(const char* what, int err) {
  if (err == EAGAIN || err == EWOULDBLOCK) return make_error(ErrorCode::kTimeout, std::string(what) + " timed out");
  const bool closed = err == ECONNRESET || err == EPIPE || err == 0;
  return make_error(closed ? ErrorCode::kUnavailable : ErrorCode::kIo,
                    std::string(what) + ": " + (closed ? "connection closed by peer" : std::strerror(err)));
}
}  // namespace

Status Conn::blocking() {
  if (blocking_) return ok();
  boost::system::error_code ec;
  sock.native_non_blocking(false, ec);
  if (ec) return make_error(ErrorCode::kIo, "socket mode: " + ec.message());
  blocking_ = true;
  return ok();
}

// The kernel timeout is the time left when it was set; it is set again when the deadline changes
// or 10 ms have passed, so a call overshoots its deadline by at most that (one setsockopt per bulk
// call was measurable with 256 KiB receives).
Status Conn::arm(int opt, Deadline deadline) {
  Armed& a = opt == SO_SNDTIMEO ? snd_armed_ : rcv_armed_;
  const auto now = Clock::now();
  if (a.deadline == deadline && now - a.at < std::chrono::milliseconds(10) && now < deadline) return ok();
  ARLO_TRY(set_timeout(sock.native_handle(), opt, deadline));
  a = {deadline, now};
  return ok();
}

// A partial send or receive restarts the kernel's timer: each call re-arms it with what is left.
// A call that moves nothing is the peer's close.
template <typename Io>
Status Conn::transfer(int opt, std::size_t size, Deadline deadline, const char* what, Io io) {
  std::size_t done = 0;
  while (done < size) {
    ARLO_TRY(arm(opt, deadline));
    const ssize_t n = io(done, size - done);
    if (n == 0) return io_error(what, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return io_error(what, errno);
    }
    done += static_cast<std::size_t>(n);
  }
  return ok();
}

Status Conn::write(const std::vector<asio::const_buffer>& buffers, Deadline deadline) {
  ARLO_TRY(blocking());
  const int fd = sock.native_handle();
  for (const auto& b : buffers) {
    const char* p = static_cast<const char*>(b.data());
    ARLO_TRY(transfer(SO_SNDTIMEO, b.size(), deadline, "send",
                      [&](std::size_t off, std::size_t left) { return ::send(fd, p + off, left, MSG_NOSIGNAL); }));
  }
  return ok();
}

Status Conn::read(asio::mutable_buffer buffer, Deadline deadline) {
  ARLO_TRY(blocking());
  const int fd = sock.native_handle();
  char* p = static_cast<char*>(buffer.data());
  return transfer(SO_RCVTIMEO, buffer.size(), deadline, "receive",
                  [&](std::size_t off, std::size_t left) { return ::recv(fd, p + off, left, MSG_WAITALL); });
}

Status Conn::send_json(Frame type, const nlohmann::json& body, Deadline deadline) {
  const std::string text = body.dump();
  FrameHeader h;
  h.type = static_cast<std::uint32_t>(type);
  h.a = text.size();
  return write({asio::buffer(&h, sizeof h), asio::buffer(text)}, deadline);
}

Result<FrameHeader> Conn::recv_frame(nlohmann::json* body, Deadline deadline, std::uint64_t max_json) {
  FrameHeader h;
  ARLO_TRY(read(asio::buffer(&h, sizeof h), deadline));
  if (h.magic != FrameHeader{}.magic) return make_error(ErrorCode::kParse, "bad frame magic from " + peer);
  if (static_cast<Frame>(h.type) != Frame::kBucket) {
    if (h.a > max_json)
      return make_error(ErrorCode::kResourceExhausted, "control frame of " + std::to_string(h.a) + " bytes from " +
                                                           peer + " exceeds the limit of " + std::to_string(max_json));
    std::string text(h.a, '\0');
    ARLO_TRY(read(asio::buffer(text), deadline));
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded()) return make_error(ErrorCode::kParse, "malformed control frame from " + peer);
    if (body) *body = std::move(j);
  }
  return h;
}

void Conn::close() {
  boost::system::error_code ignored;
  sock.shutdown(tcp::socket::shutdown_both, ignored);
  sock.close(ignored);
}

void Conn::tune() {
  boost::system::error_code ignored;
  // Buffer sizes are left to the kernel's autotuning: fixing SO_SNDBUF/SO_RCVBUF disables it and
  // measured slower on loopback.
  sock.set_option(tcp::no_delay(true), ignored);
}

namespace {
// The field `key` of `j` as a T when present (nullopt when absent or null), kParse when it holds
// another type.
template <typename T>
Result<std::optional<T>> field(const nlohmann::json& j, const char* key, const char* frame) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<T>();
  const bool fits = std::is_same_v<T, std::string> ? it->is_string() : it->is_number_unsigned();
  if (!fits) {
    return make_error(ErrorCode::kParse, std::string(frame) + " field '" + key + "' must be " +
                                             (std::is_same_v<T, std::string> ? "a string" : "a non-negative integer"));
  }
  return std::optional<T>(it->get<T>());
}
// The version field `key` of `j` (nullopt when absent or null), kParse unless it is in [0, 2^63).
Result<std::optional<Version>> version_field(const nlohmann::json& j, const char* key, const char* frame) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<Version>();
  ARLO_ASSIGN_OR_RETURN(auto v, version_from_json(*it, std::string(frame) + " field '" + key + "'"));
  return std::optional<Version>(v);
}
}  // namespace

Result<Hello> parse_hello(const nlohmann::json& j) {
  if (!j.is_object()) return make_error(ErrorCode::kParse, "HELLO must be a JSON object");
  Hello h;
  ARLO_ASSIGN_OR_RETURN(auto peer, field<std::string>(j, "peer", "HELLO"));
  h.peer = peer.value_or("");
  ARLO_ASSIGN_OR_RETURN(auto proof, field<std::string>(j, "proof", "HELLO"));
  h.proof = proof.value_or("");
  ARLO_ASSIGN_OR_RETURN(h.version, version_field(j, "version", "HELLO"));
  if (j.contains("resume") && !j["resume"].is_null()) {
    const auto& r = j["resume"];
    if (!r.is_object()) return make_error(ErrorCode::kParse, "HELLO field 'resume' must be an object");
    ARLO_ASSIGN_OR_RETURN(h.resume_version, version_field(r, "version", "HELLO resume"));
    ARLO_ASSIGN_OR_RETURN(auto bucket, field<std::uint64_t>(r, "bucket", "HELLO resume"));
    if (!h.resume_version || !bucket || *bucket >= (std::uint64_t{1} << 32))
      return make_error(ErrorCode::kParse, "HELLO field 'resume' needs a version and a bucket below 2^32");
    h.resume_bucket = static_cast<std::size_t>(*bucket);
  }
  return h;
}

Result<Answer> parse_answer(const nlohmann::json& j, std::size_t buckets) {
  if (!j.is_object()) return make_error(ErrorCode::kParse, "ANSWER must be a JSON object");
  Answer a;
  ARLO_ASSIGN_OR_RETURN(auto state, field<std::string>(j, "state", "ANSWER"));
  ARLO_ASSIGN_OR_RETURN(auto error, field<std::string>(j, "error", "ANSWER"));
  ARLO_ASSIGN_OR_RETURN(auto start, field<std::uint64_t>(j, "start", "ANSWER"));
  a.state = state.value_or("refused");
  if (a.state != "accepted" && a.state != "refused" && a.state != "need_full")
    return make_error(ErrorCode::kParse, "ANSWER state '" + a.state + "': expected accepted, refused or need_full");
  a.error = error.value_or("");
  if (start.value_or(0) > buckets)
    return make_error(ErrorCode::kParse, "ANSWER start " + std::to_string(*start) + " is past the manifest's " +
                                             std::to_string(buckets) + " buckets");
  a.start = static_cast<std::size_t>(start.value_or(0));
  return a;
}

Result<tcp::endpoint> resolve(const std::string& address) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size())
    return make_error(ErrorCode::kInvalidArgument, "address '" + address + "': expected host:port");
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  boost::system::error_code ec;
  auto ip = asio::ip::make_address(host.empty() ? "0.0.0.0" : host, ec);
  unsigned long p = 0;
  try {
    p = std::stoul(port);
  } catch (...) {
    return make_error(ErrorCode::kInvalidArgument, "address '" + address + "': bad port");
  }
  if (p > 65535) return make_error(ErrorCode::kInvalidArgument, "address '" + address + "': bad port");
  if (!ec) return tcp::endpoint(ip, static_cast<unsigned short>(p));
  asio::io_context ctx;
  tcp::resolver resolver(ctx);
  auto results = resolver.resolve(host, port, ec);
  if (ec || results.empty()) return make_error(ErrorCode::kNotFound, "cannot resolve '" + host + "': " + ec.message());
  return results.begin()->endpoint();
}

}  // namespace arlo::weight_sync::detail
