// The TCPStore's server (store.h): one thread polls every connection, settles each one's dialect
// from its first request, answers requests and wakes the WAITs whose keys came; in-process callers
// share its data under a lock.
#include "weight_sync/transports/nccl/store.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
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
#include "weight_sync/transports/nccl/store_wire.h"

namespace arlo::weight_sync::nccl {

using namespace store_wire;

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
  bool counter_request(Request& q);  // ADD, BARRIER
  bool keys_request(Request& q);     // CHECK, WAIT, MULTI_GET
  bool append(Request& q);
  bool multi_set(Request& q);
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
    case Cmd::kAdd:
    case Cmd::kBarrier: return counter_request(q);
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

// ADD key delta and BARRIER key world_size count under `key`, in a decimal counter as torch's
// server keeps it (absent: 0; the sum wraps). ADD adds delta and answers the sum. BARRIER counts one
// arrival: the arrival that brings the count to world_size gets STOP_WAITING, and so does every
// earlier one, which waits like a WAIT on `key` until then (CANCEL_WAIT ends that wait alike).
bool StoreServer::Impl::counter_request(Request& q) {
  const auto key = q.r.key();
  const auto n = q.r.value<std::int64_t>();  // ADD: the delta; BARRIER: world_size
  if (!q.r.ok()) return incomplete_or_bad(q);
  const bool barrier = q.cmd == Cmd::kBarrier;
  const std::int64_t delta = barrier ? 1 : n;
  std::lock_guard lock(mu);
  auto it = data.find(std::string(key));
  std::int64_t count = delta;
  if (it != data.end()) {
    auto old = parse_int(it->second);
    if (!old)
      return fail(q, fmt::format("{} {} holds {}, not {}", barrier ? "barrier key" : "key", show(key), show(it->second),
                                 barrier ? "a count" : "an integer"));
    count = wrapping_add(*old, delta);
  }
  data[std::string(key)] = std::to_string(count);
  if (!barrier) {
    q.changed.emplace_back(key);
    store_append(q.c.out, count);
  } else if (count >= n) {
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

}  // namespace arlo::weight_sync::nccl
