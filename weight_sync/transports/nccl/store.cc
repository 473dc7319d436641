#include "weight_sync/transports/nccl/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "common/log.h"

namespace arlo::weight_sync::nccl {

namespace {

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

enum class Dialect { kUnknown, kCurrent, kLegacy };

// torch >= 2.2 numbering (TCPStoreBackend.hpp QueryType; LIST_KEYS and BARRIER appended after the
// queue commands by later releases).
Cmd current_cmd(std::uint8_t b) {
  static constexpr Cmd kTable[] = {Cmd::kValidate, Cmd::kSet,      Cmd::kCompareSet, Cmd::kGet,       Cmd::kAdd,
                                   Cmd::kCheck,    Cmd::kWait,     Cmd::kGetNumKeys, Cmd::kDeleteKey, Cmd::kAppend,
                                   Cmd::kMultiGet, Cmd::kMultiSet, Cmd::kCancelWait, Cmd::kPing,      Cmd::kQueuePush,
                                   Cmd::kQueuePop, Cmd::kQueueLen, Cmd::kListKeys,   Cmd::kBarrier};
  return b < std::size(kTable) ? kTable[b] : Cmd::kUnknown;
}

// torch < 2.2 numbering: no VALIDATE/PING, WATCH_KEY at 7.
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

// A client request in the current dialect: the command's byte, then `fields` (store_append).
template <typename... Fields>
std::string request(Cmd c, const Fields&... fields) {
  return store_encode(current_byte(c), fields...);
}

constexpr std::uint8_t kStopWaiting = 0;
constexpr std::uint8_t kWaitCanceled = 1;
constexpr std::uint8_t kReady = 0;
constexpr std::uint8_t kNotReady = 1;

// A key or value for a message: printable, at most 80 characters.
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

// Parses a decimal integer the way torch's server does (std::stoll: leading spaces, sign, digits,
// trailing characters ignored). nullopt when there are no digits.
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

// Drops the consumed front of a connection's buffer: all of it once everything was consumed, else
// once over 1 MiB was (so a busy connection's buffer neither grows without bound nor moves bytes often).
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

// Resolves host:port to socket addresses (numeric hosts or names).
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
constexpr std::size_t kMaxPendingOutput = std::size_t{64} << 20;

}  // namespace

// ---------------------------------------------------------------------------------------------
// StoreServer

struct StoreServer::Impl {
  struct Conn {
    int fd = -1;
    std::string peer;
    Dialect dialect = Dialect::kUnknown;
    std::string in;
    std::size_t in_pos = 0;
    std::string out;
    std::size_t out_pos = 0;
    // Pending WAITs, oldest first: the keys each still waits for.
    std::vector<std::unordered_set<std::string>> waits;
    std::string closing;  // reason; non-empty: close after this round
  };

  int listen_fd = -1;
  int wake_fd = -1;  // eventfd: in-process changes and stop
  std::uint16_t port = 0;
  std::string address;
  std::thread thread;

  // Shared with in-process callers.
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  std::unordered_map<std::string, std::string> data;
  std::vector<std::string> pending_changes;  // from in-process calls, for the server thread
  bool stopping = false;
  std::size_t in_process_waits = 0;  // wait() calls inside; the destructor lets them leave first
  std::shared_ptr<std::function<void(const std::string&)>> callback;
  std::atomic<std::size_t> open{0};

  // Server thread only.
  std::map<std::uint64_t, Conn> conns;
  std::uint64_t next_id = 1;
  std::unordered_map<std::string, std::vector<std::uint64_t>> waiters;  // key -> connections waiting

  ~Impl() {
    if (listen_fd >= 0) ::close(listen_fd);
    if (wake_fd >= 0) ::close(wake_fd);
  }

  void wake() {
    const std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd, &one, sizeof one);
  }

  void run();
  void accept_all();
  void read_conn(std::uint64_t id, Conn& c);
  void process(std::uint64_t id, Conn& c);
  // Handles one request at the start of `r`; returns false when it is incomplete or refused
  // (c.closing set then).
  bool handle(std::uint64_t id, Conn& c, Reader& r, std::vector<std::string>& changed);
  // A connection's first request tells its dialect (torch >= 2.2 or older). Returns what handle()
  // returns when the request was settled here (VALIDATE, incomplete, bad magic), or nullopt when
  // `byte` is a command of the dialect found, to be handled as such.
  std::optional<bool> settle_dialect(Conn& c, Reader& r, std::uint8_t byte);
  // One request being handled: connection `id`, its parser and command; collects changed keys.
  struct Request {
    std::uint64_t id;
    Conn& c;
    Reader& r;
    std::vector<std::string>& changed;
    Cmd cmd;
  };
  // Refuses the request: logged, the connection closes after this round. Returns false.
  bool fail(const Request& q, std::string why);
  // The request's fields are not all there yet (false), or one is over a limit (refused, false).
  bool incomplete_or_bad(const Request& q);
  // The commands whose handling takes more than a few lines; each returns what handle() returns.
  bool compare_set(Request& q);
  bool add(Request& q);
  bool keys_request(Request& q);  // CHECK, WAIT, MULTI_GET
  bool append(Request& q);
  bool multi_set(Request& q);
  bool barrier(Request& q);
  // CANCEL_WAIT: drops every WAIT pending on connection `id`.
  void cancel_waits(std::uint64_t id, Conn& c);
  void flush(Conn& c);
  void close_conn(std::uint64_t id, Conn& c);
  void changed_keys(const std::vector<std::string>& keys);
  void refuse(Conn& c, std::string reason) {
    if (c.closing.empty()) c.closing = std::move(reason);
  }
};

Result<std::unique_ptr<StoreServer>> StoreServer::start(const std::string& host, std::uint16_t port) {
  auto impl = std::make_unique<Impl>();
  ARLO_ASSIGN_OR_RETURN(auto addrs, resolve(host, port, true));
  std::string last_error;
  for (const auto& a : addrs) {
    const int fd = ::socket(a.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      last_error = errno_text(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&a), addr_len(a)) != 0 || ::listen(fd, 1024) != 0) {
      last_error = errno_text(errno);
      ::close(fd);
      continue;
    }
    impl->listen_fd = fd;
    break;
  }
  if (impl->listen_fd < 0)
    return make_error(ErrorCode::kIo,
                      fmt::format("rendezvous store: cannot listen on {}:{}: {}", host, port, last_error));
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(impl->listen_fd, reinterpret_cast<sockaddr*>(&bound), &len);
  impl->port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                           : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  impl->address = fmt::format("{}:{}", host, impl->port);
  impl->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl->wake_fd < 0) return make_error(ErrorCode::kIo, "rendezvous store: eventfd: " + errno_text(errno));
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->run(); });
  ARLO_DEBUG("rendezvous store listening on {}", impl->address);
  return std::unique_ptr<StoreServer>(new StoreServer(std::move(impl)));
}

StoreServer::StoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StoreServer::~StoreServer() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  impl_->wake();
  if (impl_->thread.joinable()) impl_->thread.join();
  std::unique_lock lock(impl_->mu);
  impl_->cv.wait(lock, [&] { return impl_->in_process_waits == 0; });
}

std::uint16_t StoreServer::port() const { return impl_->port; }

void StoreServer::set(const std::string& key, std::string value) {
  {
    std::lock_guard lock(impl_->mu);
    impl_->data[key] = std::move(value);
    impl_->pending_changes.push_back(key);
  }
  impl_->cv.notify_all();
  impl_->wake();
}

std::optional<std::string> StoreServer::get(const std::string& key) const {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->data.find(key);
  if (it == impl_->data.end()) return std::nullopt;
  return it->second;
}

std::int64_t StoreServer::add(const std::string& key, std::int64_t delta) {
  std::int64_t sum = delta;
  {
    std::lock_guard lock(impl_->mu);
    auto it = impl_->data.find(key);
    if (it != impl_->data.end()) {
      auto old = parse_int(it->second);
      if (!old)
        ARLO_WARN("rendezvous store {}: add({}) found {}, not an integer; counting from 0", impl_->address, show(key),
                  show(it->second));
      sum = wrapping_add(old.value_or(0), delta);
    }
    impl_->data[key] = std::to_string(sum);
    impl_->pending_changes.push_back(key);
  }
  impl_->cv.notify_all();
  impl_->wake();
  return sum;
}

bool StoreServer::wait(const std::vector<std::string>& keys, std::chrono::steady_clock::time_point deadline) const {
  std::unique_lock lock(impl_->mu);
  auto all = [&] {
    return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return impl_->data.contains(k); });
  };
  ++impl_->in_process_waits;
  impl_->cv.notify_all();
  impl_->cv.wait_until(lock, deadline, [&] { return impl_->stopping || all(); });
  const bool done = all();
  --impl_->in_process_waits;
  impl_->cv.notify_all();
  return done;
}

std::size_t StoreServer::waiting() const {
  std::lock_guard lock(impl_->mu);
  return impl_->in_process_waits;
}

void StoreServer::on_change(std::function<void(const std::string& key)> callback) {
  std::lock_guard lock(impl_->mu);
  impl_->callback = callback ? std::make_shared<std::function<void(const std::string&)>>(std::move(callback)) : nullptr;
}

std::size_t StoreServer::connections() const { return impl_->open.load(); }

void StoreServer::Impl::run() {
  std::vector<pollfd> fds;
  std::vector<std::uint64_t> ids;
  for (;;) {
    fds.clear();
    ids.clear();
    fds.push_back({wake_fd, POLLIN, 0});
    fds.push_back({listen_fd, POLLIN, 0});
    for (auto& [id, c] : conns) {
      short events = 0;
      if (c.out.size() - c.out_pos < kMaxPendingOutput) events |= POLLIN;
      if (c.out_pos < c.out.size()) events |= POLLOUT;
      fds.push_back({c.fd, events, 0});
      ids.push_back(id);
    }
    const int n = ::poll(fds.data(), fds.size(), -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      ARLO_ERROR("rendezvous store {}: poll failed: {}; the store stops", address, errno_text(errno));
      break;
    }
    if (fds[0].revents) {
      std::uint64_t count;
      [[maybe_unused]] auto r = ::read(wake_fd, &count, sizeof count);
      std::vector<std::string> keys;
      {
        std::lock_guard lock(mu);
        if (stopping) break;
        keys.swap(pending_changes);
      }
      changed_keys(keys);
    }
    if (fds[1].revents) accept_all();
    for (std::size_t i = 2; i < fds.size(); ++i) {
      const auto id = ids[i - 2];
      auto it = conns.find(id);
      if (it == conns.end()) continue;
      Conn& c = it->second;
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_conn(id, c);
      if (c.out_pos < c.out.size()) flush(c);
      if (!c.closing.empty())
        close_conn(id, c);
      else if (c.out.size() - c.out_pos < kMaxPendingOutput && c.in_pos < c.in.size())
        process(id, c);
    }
    // Requests may have closed or satisfied other connections; close what is marked.
    for (auto it = conns.begin(); it != conns.end();) {
      auto next = std::next(it);
      if (!it->second.closing.empty()) close_conn(it->first, it->second);
      it = next;
    }
  }
  for (auto it = conns.begin(); it != conns.end();) {
    auto next = std::next(it);
    ::close(it->second.fd);
    open.fetch_sub(1);
    conns.erase(it);
    it = next;
  }
  waiters.clear();
}

void StoreServer::Impl::accept_all() {
  for (;;) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      if (errno == ECONNABORTED) continue;
      ARLO_WARN_EVERY(5.0, "rendezvous store {}: accept failed: {}", address, errno_text(errno));
      return;
    }
    set_nodelay(fd);
    Conn c;
    c.fd = fd;
    c.peer = peer_name(ss);
    conns.emplace(next_id++, std::move(c));
    open.fetch_add(1);
  }
}

void StoreServer::Impl::read_conn(std::uint64_t id, Conn& c) {
  char buf[64 * 1024];
  std::size_t got = 0;
  while (got < (std::size_t{4} << 20)) {  // at most 4 MiB per round, so one client cannot starve others
    const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
    if (n > 0) {
      c.in.append(buf, static_cast<std::size_t>(n));
      got += static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) {
      // The peer is gone; answer nothing more. Requests it sent before closing are still handled
      // (a SET then close is a complete exchange).
      if (c.in_pos < c.in.size()) process(id, c);
      if (c.in_pos < c.in.size() && c.closing.empty()) {
        const auto b = static_cast<std::uint8_t>(c.in[c.in_pos]);
        const Cmd cmd = c.dialect == Dialect::kLegacy ? legacy_cmd(b) : current_cmd(b);
        ARLO_WARN("rendezvous store {}: truncated {} request from {} ({} bytes, then the connection closed)", address,
                  cmd_name(cmd), c.peer, c.in.size() - c.in_pos);
      }
      refuse(c, "closed by the peer");
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    refuse(c, "recv: " + errno_text(errno));
    return;
  }
}

void StoreServer::Impl::process(std::uint64_t id, Conn& c) {
  std::vector<std::string> changed;
  while (c.closing.empty() && c.in_pos < c.in.size() && c.out.size() - c.out_pos < kMaxPendingOutput) {
    Reader r;
    r.buf = std::string_view(c.in).substr(c.in_pos);
    if (!handle(id, c, r, changed)) break;
    c.in_pos += r.pos;
  }
  drop_consumed(c.in, c.in_pos);
  if (!changed.empty()) changed_keys(changed);
  flush(c);
}

std::optional<bool> StoreServer::Impl::settle_dialect(Conn& c, Reader& r, std::uint8_t byte) {
  // torch >= 2.2 opens with VALIDATE (0) and the magic; older clients with any request, SET
  // included (0 too), whose key length then follows. A length whose low 32 bits are over the
  // key limit cannot be a SET, so it is a wrong magic.
  if (byte != 0) {
    c.dialect = Dialect::kLegacy;
    return std::nullopt;
  }
  const auto magic = r.value<std::uint32_t>();
  if (!r.ok()) return false;
  if (magic == kStoreValidateMagic) {
    c.dialect = Dialect::kCurrent;
    return true;
  }
  if (magic > kStoreMaxKeyBytes) {
    ARLO_WARN(
        "rendezvous store {}: VALIDATE from {} with wrong magic 0x{:08x} (expected 0x{:08x}); "
        "closing the connection (not a torch TCPStore client, or an incompatible one)",
        address, c.peer, magic, kStoreValidateMagic);
    refuse(c, "bad magic");
    return false;
  }
  c.dialect = Dialect::kLegacy;
  r.pos = 1;
  ARLO_DEBUG("rendezvous store {}: {} speaks the torch < 2.2 dialect", address, c.peer);
  return std::nullopt;
}

bool StoreServer::Impl::handle(std::uint64_t id, Conn& c, Reader& r, std::vector<std::string>& changed) {
  const auto byte = r.value<std::uint8_t>();
  if (!r.ok()) return false;
  if (c.dialect == Dialect::kUnknown) {
    if (const auto decided = settle_dialect(c, r, byte)) return *decided;
  }
  Request q{id, c, r, changed, c.dialect == Dialect::kCurrent ? current_cmd(byte) : legacy_cmd(byte)};
  switch (q.cmd) {
    case Cmd::kValidate: {
      const auto magic = r.value<std::uint32_t>();
      if (!r.ok()) return incomplete_or_bad(q);
      if (magic != kStoreValidateMagic) return fail(q, fmt::format("wrong magic 0x{:08x}", magic));
      return true;
    }
    case Cmd::kPing: {
      const auto nonce = r.value<std::uint32_t>();
      if (!r.ok()) return incomplete_or_bad(q);
      store_append(c.out, nonce);
      return true;
    }
    case Cmd::kSet: {
      const auto key = r.key();
      const auto value = r.val();
      if (!r.ok()) return incomplete_or_bad(q);
      std::lock_guard lock(mu);
      data[std::string(key)] = std::string(value);
      changed.emplace_back(key);
      return true;
    }
    case Cmd::kCompareSet: return compare_set(q);
    case Cmd::kGet: {
      const auto key = r.key();
      if (!r.ok()) return incomplete_or_bad(q);
      std::lock_guard lock(mu);
      auto it = data.find(std::string(key));
      if (it == data.end())
        return fail(q, fmt::format("key {} does not exist (torch's server drops the connection too; its "
                                   "clients WAIT before GET)",
                                   show(key)));
      store_append(c.out, it->second);
      return true;
    }
    case Cmd::kAdd: return add(q);
    case Cmd::kCheck:
    case Cmd::kWait:
    case Cmd::kMultiGet: return keys_request(q);
    case Cmd::kGetNumKeys: {
      std::lock_guard lock(mu);
      store_append(c.out, static_cast<std::int64_t>(data.size()));
      return true;
    }
    case Cmd::kDeleteKey: {
      const auto key = r.key();
      if (!r.ok()) return incomplete_or_bad(q);
      std::lock_guard lock(mu);
      store_append(c.out, static_cast<std::int64_t>(data.erase(std::string(key))));
      return true;
    }
    case Cmd::kAppend: return append(q);
    case Cmd::kMultiSet: return multi_set(q);
    case Cmd::kCancelWait:
      cancel_waits(id, c);
      store_append(c.out, kWaitCanceled);
      return true;
    case Cmd::kWatchKey: return fail(q, "WATCH_KEY (torch < 2.2 key callbacks) is not supported by this store");
    case Cmd::kQueuePush:
    case Cmd::kQueuePop:
    case Cmd::kQueueLen: return fail(q, "queue commands (torch's libuv server only) are not supported by this store");
    case Cmd::kListKeys: {  // every key, as torch's server answers: a count, then the keys
      std::vector<std::string> keys;
      std::lock_guard lock(mu);
      keys.reserve(data.size());
      for (const auto& [k, v] : data) keys.push_back(k);
      store_append(c.out, keys);
      return true;
    }
    case Cmd::kBarrier: return barrier(q);
    case Cmd::kUnknown:
      ARLO_WARN("rendezvous store {}: unknown command byte {} from {} ({} dialect); closing that connection", address,
                byte, c.peer, c.dialect == Dialect::kCurrent ? "torch >= 2.2" : "torch < 2.2");
      refuse(c, "unknown command");
      return false;
  }
  return false;
}

bool StoreServer::Impl::fail(const Request& q, std::string why) {
  ARLO_WARN("rendezvous store {}: {} request from {}: {}; closing that connection", address, cmd_name(q.cmd), q.c.peer,
            why);
  refuse(q.c, std::move(why));
  return false;
}

bool StoreServer::Impl::incomplete_or_bad(const Request& q) {
  if (!q.r.bad.empty()) return fail(q, q.r.bad);
  return false;  // wait for more bytes
}

bool StoreServer::Impl::compare_set(Request& q) {
  const auto key = q.r.key();
  const auto expected = q.r.val();
  const auto desired = q.r.val();
  if (!q.r.ok()) return incomplete_or_bad(q);
  std::lock_guard lock(mu);
  auto it = data.find(std::string(key));
  if (it == data.end()) {
    if (expected.empty()) {
      data.emplace(std::string(key), std::string(desired));
      q.changed.emplace_back(key);
      store_append(q.c.out, desired);
    } else {
      store_append(q.c.out, expected);  // what torch answers for a missing key
    }
  } else {
    if (it->second == expected) {
      it->second = std::string(desired);
      q.changed.emplace_back(key);
    }
    store_append(q.c.out, it->second);
  }
  return true;
}

bool StoreServer::Impl::add(Request& q) {
  const auto key = q.r.key();
  const auto delta = q.r.value<std::int64_t>();
  if (!q.r.ok()) return incomplete_or_bad(q);
  std::lock_guard lock(mu);
  auto it = data.find(std::string(key));
  std::int64_t sum = delta;
  if (it != data.end()) {
    auto old = parse_int(it->second);
    if (!old) return fail(q, fmt::format("key {} holds {}, not an integer", show(key), show(it->second)));
    sum = wrapping_add(*old, delta);
  }
  data[std::string(key)] = std::to_string(sum);
  q.changed.emplace_back(key);
  store_append(q.c.out, sum);
  return true;
}

bool StoreServer::Impl::keys_request(Request& q) {
  const auto n = q.r.count();
  std::vector<std::string_view> keys;
  for (std::uint64_t i = 0; i < n && q.r.ok(); ++i) keys.push_back(q.r.key());
  if (!q.r.ok()) return incomplete_or_bad(q);
  std::lock_guard lock(mu);
  if (q.cmd == Cmd::kCheck) {
    const bool all =
        std::all_of(keys.begin(), keys.end(), [&](std::string_view k) { return data.contains(std::string(k)); });
    store_append(q.c.out, all ? kReady : kNotReady);
  } else if (q.cmd == Cmd::kWait) {
    std::unordered_set<std::string> missing;
    for (auto k : keys)
      if (!data.contains(std::string(k))) missing.emplace(k);
    if (missing.empty()) {
      store_append(q.c.out, kStopWaiting);
    } else {
      for (const auto& k : missing) waiters[k].push_back(q.id);
      q.c.waits.push_back(std::move(missing));
    }
  } else {
    std::string out;
    for (auto k : keys) {
      auto it = data.find(std::string(k));
      if (it == data.end())
        return fail(q, fmt::format("key {} does not exist (torch's server drops the connection too)", show(k)));
      store_append(out, it->second);
    }
    q.c.out += out;
  }
  return true;
}

bool StoreServer::Impl::append(Request& q) {
  const auto key = q.r.key();
  const auto value = q.r.val();
  if (!q.r.ok()) return incomplete_or_bad(q);
  std::lock_guard lock(mu);
  auto& slot = data[std::string(key)];
  if (slot.size() + value.size() > kStoreMaxValueBytes)
    return fail(q, fmt::format("key {} would grow to {} bytes, over the limit of {}", show(key),
                               slot.size() + value.size(), kStoreMaxValueBytes));
  slot.append(value);
  q.changed.emplace_back(key);
  return true;
}

bool StoreServer::Impl::multi_set(Request& q) {
  const auto n = q.r.count();
  std::vector<std::pair<std::string_view, std::string_view>> items;
  std::uint64_t total = 0;
  for (std::uint64_t i = 0; i < n && q.r.ok(); ++i) {
    const auto k = q.r.key();
    const auto v = q.r.val();
    total += v.size();
    if (q.r.ok() && total > kStoreMaxValueBytes)
      q.r.bad = fmt::format("values of {}+ bytes in one request are over the limit of {}", total, kStoreMaxValueBytes);
    items.emplace_back(k, v);
  }
  if (!q.r.ok()) return incomplete_or_bad(q);
  std::lock_guard lock(mu);
  for (auto [k, v] : items) {
    data[std::string(k)] = std::string(v);
    q.changed.emplace_back(k);
  }
  return true;
}

// BARRIER key world_size: counts the arrival under `key` (a decimal counter, as torch's server
// keeps it). The arrival that brings the count to world_size gets STOP_WAITING, and so does every
// earlier one, which waits like a WAIT on `key` until then (CANCEL_WAIT ends that wait alike).
bool StoreServer::Impl::barrier(Request& q) {
  const auto key = q.r.key();
  const auto world_size = q.r.value<std::int64_t>();
  if (!q.r.ok()) return incomplete_or_bad(q);
  std::lock_guard lock(mu);
  auto it = data.find(std::string(key));
  std::int64_t count = 1;
  if (it != data.end()) {
    auto old = parse_int(it->second);
    if (!old) return fail(q, fmt::format("barrier key {} holds {}, not a count", show(key), show(it->second)));
    count = wrapping_add(*old, 1);
  }
  data[std::string(key)] = std::to_string(count);
  if (count >= world_size) {
    store_append(q.c.out, kStopWaiting);
    q.changed.emplace_back(key);  // wakes the arrivals waiting on it
  } else {
    waiters[std::string(key)].push_back(q.id);
    q.c.waits.push_back({std::string(key)});
  }
  return true;
}

void StoreServer::Impl::cancel_waits(std::uint64_t id, Conn& c) {
  for (const auto& w : c.waits)
    for (const auto& k : w) {
      auto it = waiters.find(k);
      if (it == waiters.end()) continue;
      std::erase(it->second, id);
      if (it->second.empty()) waiters.erase(it);
    }
  c.waits.clear();
}

void StoreServer::Impl::changed_keys(const std::vector<std::string>& keys) {
  if (keys.empty()) return;
  std::shared_ptr<std::function<void(const std::string&)>> cb;
  {
    std::lock_guard lock(mu);
    cb = callback;
    for (const auto& k : keys) {
      auto it = waiters.find(k);
      if (it == waiters.end() || !data.contains(k)) continue;
      for (const auto id : it->second) {
        auto ci = conns.find(id);
        if (ci == conns.end()) continue;
        Conn& c = ci->second;
        for (auto w = c.waits.begin(); w != c.waits.end();) {
          w->erase(k);
          if (w->empty()) {
            store_append(c.out, kStopWaiting);
            w = c.waits.erase(w);
          } else {
            ++w;
          }
        }
      }
      waiters.erase(it);
    }
  }
  cv.notify_all();
  for (auto& [id, c] : conns)
    if (c.out_pos < c.out.size()) flush(c);
  if (cb)
    for (const auto& k : keys) (*cb)(k);
}

void StoreServer::Impl::flush(Conn& c) {
  while (c.out_pos < c.out.size()) {
    const ssize_t n = ::send(c.fd, c.out.data() + c.out_pos, c.out.size() - c.out_pos, MSG_NOSIGNAL);
    if (n > 0) {
      c.out_pos += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    refuse(c, "send: " + errno_text(errno));
    c.out.clear();
    c.out_pos = 0;
    return;
  }
  drop_consumed(c.out, c.out_pos);
}

void StoreServer::Impl::close_conn(std::uint64_t id, Conn& c) {
  ARLO_DEBUG("rendezvous store {}: connection from {} closed ({})", address, c.peer, c.closing);
  cancel_waits(id, c);
  ::close(c.fd);
  open.fetch_sub(1);
  conns.erase(id);
}

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
