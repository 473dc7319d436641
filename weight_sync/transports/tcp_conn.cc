#include "weight_sync/transports/tcp_conn.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

namespace arlo::weight_sync::detail {

template <typename Start>
Status Conn::run(Start start, Deadline deadline, const char* what) {
  bool done = false;
  boost::system::error_code result;
  start([&](const boost::system::error_code& ec, auto&&...) {
    done = true;
    result = ec;
  });
  ctx.restart();
  ctx.run_until(deadline);
  if (!done) {
    boost::system::error_code ignored;
    sock.cancel(ignored);
    ctx.restart();
    ctx.run();
    return make_error(ErrorCode::kTimeout, std::string(what) + " timed out");
  }
  if (result) {
    const bool closed = result == asio::error::eof || result == asio::error::connection_reset ||
                        result == asio::error::broken_pipe;
    return make_error(closed ? ErrorCode::kUnavailable : ErrorCode::kIo,
                      std::string(what) + ": " + (closed ? "connection closed by peer" : result.message()));
  }
  return ok();
}

Status Conn::connect(const tcp::endpoint& ep, Deadline deadline) {
  boost::system::error_code ignored;
  sock.close(ignored);
  return run([&](auto h) { sock.async_connect(ep, std::move(h)); }, deadline, "connect");
}

Status Conn::write(const std::vector<asio::const_buffer>& buffers, Deadline deadline) {
  return run([&](auto h) { asio::async_write(sock, buffers, std::move(h)); }, deadline, "send");
}

Status Conn::read(asio::mutable_buffer buffer, Deadline deadline) {
  return run([&](auto h) { asio::async_read(sock, buffer, std::move(h)); }, deadline, "receive");
}

Status Conn::send_json(Frame type, const nlohmann::json& body, Deadline deadline) {
  const std::string text = body.dump();
  FrameHeader h;
  h.type = static_cast<std::uint32_t>(type);
  h.a = text.size();
  return write({asio::buffer(&h, sizeof h), asio::buffer(text)}, deadline);
}

Result<FrameHeader> Conn::recv_frame(nlohmann::json* body, Deadline deadline) {
  FrameHeader h;
  ARLO_TRY(read(asio::buffer(&h, sizeof h), deadline));
  if (h.magic != FrameHeader{}.magic) return make_error(ErrorCode::kParse, "bad frame magic from " + peer);
  if (static_cast<Frame>(h.type) != Frame::kBucket) {
    if (h.a > (64ull << 20)) return make_error(ErrorCode::kParse, "oversized control frame from " + peer);
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
  sock.set_option(tcp::no_delay(true), ignored);
  sock.set_option(asio::socket_base::send_buffer_size(4 << 20), ignored);
  sock.set_option(asio::socket_base::receive_buffer_size(4 << 20), ignored);
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
  if (ec || results.empty())
    return make_error(ErrorCode::kNotFound, "cannot resolve '" + host + "': " + ec.message());
  return results.begin()->endpoint();
}

}  // namespace arlo::weight_sync::detail
