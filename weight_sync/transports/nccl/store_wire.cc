#include "weight_sync/transports/nccl/store_wire.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include <cerrno>
#include <charconv>
#include <cstring>

namespace arlo::weight_sync::nccl::store_wire {

const char* cmd_name(Cmd c) {
  switch (c) {
    case Cmd::kValidate: return "VALIDATE";
    case Cmd::kSet: return "SET";
    case Cmd::kCompareSet: return "COMPARE_SET";
    case Cmd::kGet: return "GET";
    case Cmd::kAdd: return "ADD";
    case Cmd::kCheck: return "CHECK";
    case Cmd::kWait: return "WAIT";
    case Cmd::kGetNumKeys: return "GETNUMKEYS";
    case Cmd::kDeleteKey: return "DELETE_KEY";
    case Cmd::kAppend: return "APPEND";
    case Cmd::kMultiGet: return "MULTI_GET";
    case Cmd::kMultiSet: return "MULTI_SET";
    case Cmd::kCancelWait: return "CANCEL_WAIT";
    case Cmd::kPing: return "PING";
    case Cmd::kWatchKey: return "WATCH_KEY";
    case Cmd::kQueuePush: return "QUEUE_PUSH";
    case Cmd::kQueuePop: return "QUEUE_POP";
    case Cmd::kQueueLen: return "QUEUE_LEN";
    case Cmd::kListKeys: return "LIST_KEYS";
    case Cmd::kBarrier: return "BARRIER";
    case Cmd::kUnknown: break;
  }
  return "unknown";
}

Cmd current_cmd(std::uint8_t b) {
  static constexpr Cmd kTable[] = {Cmd::kValidate, Cmd::kSet,      Cmd::kCompareSet, Cmd::kGet,       Cmd::kAdd,
                                   Cmd::kCheck,    Cmd::kWait,     Cmd::kGetNumKeys, Cmd::kDeleteKey, Cmd::kAppend,
                                   Cmd::kMultiGet, Cmd::kMultiSet, Cmd::kCancelWait, Cmd::kPing,      Cmd::kQueuePush,
                                   Cmd::kQueuePop, Cmd::kQueueLen, Cmd::kListKeys,   Cmd::kBarrier};
  return b < std::size(kTable) ? kTable[b] : Cmd::kUnknown;
}

Cmd legacy_cmd(std::uint8_t b) {
  static constexpr Cmd kTable[] = {Cmd::kSet,      Cmd::kCompareSet, Cmd::kGet,       Cmd::kAdd,       Cmd::kCheck,
                                   Cmd::kWait,     Cmd::kGetNumKeys, Cmd::kWatchKey,  Cmd::kDeleteKey, Cmd::kAppend,
                                   Cmd::kMultiGet, Cmd::kMultiSet,   Cmd::kCancelWait};
  return b < std::size(kTable) ? kTable[b] : Cmd::kUnknown;
}

std::uint8_t current_byte(Cmd c) {
  for (std::uint8_t b = 0; b < 19; ++b)
    if (current_cmd(b) == c) return b;
  return 0xff;
}

std::string show(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 80)) {
    if (c >= 0x20 && c < 0x7f && c != '\'')
      out += c;
    else
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
  }
  if (s.size() > 80) out += fmt::format("...({} bytes)", s.size());
  return "'" + out + "'";
}

std::string show_keys(const std::vector<std::string>& keys) {
  std::string out = "[";
  for (std::size_t i = 0; i < keys.size() && i < 8; ++i) out += (i ? ", " : "") + show(keys[i]);
  if (keys.size() > 8) out += fmt::format(", ... {} keys", keys.size());
  return out + "]";
}

std::optional<std::int64_t> parse_int(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n')) ++i;
  if (i < s.size() && s[i] == '+') ++i;
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data() + i, s.data() + s.size(), v);
  if (ec != std::errc()) return std::nullopt;
  return v;
}

std::int64_t wrapping_add(std::int64_t a, std::int64_t b) {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
}

std::string errno_text(int err) { return std::strerror(err); }

void drop_consumed(std::string& buf, std::size_t& pos) {
  if (pos == buf.size()) {
    buf.clear();
    pos = 0;
  } else if (pos > (std::size_t{1} << 20)) {
    buf.erase(0, pos);
    pos = 0;
  }
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string peer_name(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  std::uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
    return fmt::format("{}:{}", host, port);
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
    return fmt::format("[{}]:{}", host, port);
  }
  return "?";
}

Result<std::vector<sockaddr_storage>> resolve(const std::string& host, std::uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("cannot resolve host '{}': {}", host, ::gai_strerror(rc)));
  std::vector<sockaddr_storage> out;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    sockaddr_storage ss{};
    std::memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    out.push_back(ss);
  }
  ::freeaddrinfo(res);
  if (out.empty()) return make_error(ErrorCode::kInvalidArgument, fmt::format("host '{}' has no address", host));
  return out;
}

socklen_t addr_len(const sockaddr_storage& ss) {
  return ss.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

}  // namespace arlo::weight_sync::nccl::store_wire
