// The `socket` transport (bridge.h has the contract). Frames: [u8 type][u64 LE length][payload].
//
//   trainer -> orchestrator: HELLO {rank, last_acked_step, version?, info?}, ACK {step},
//                            VERSION {version, info}, HEARTBEAT {time_ms, last_acked_step}
//   orchestrator -> trainer: CHALLENGE {nonce, token_required} (first, on every connection),
//                            WELCOME {num_ranks}, BATCH <safetensors image>, HEARTBEAT {time_ms},
//                            ERROR {message} (then closes)
//   HELLO carries proof = auth::proof(token, kAuthContext, nonce) when the trainer has a token.
//
// No batch is lost or duplicated across restarts because the orchestrator keeps every
// unacknowledged step in memory (at most max_pending_batches) and resends, on each HELLO, what
// that rank has not acked; the trainer drops a resent step it already has or already acked (and
// acks it again). A restarted orchestrator learns the trainer's progress from HELLO.
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <fcntl.h>
#include <fmt/format.h>

#include <array>
#include <condition_variable>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "common/auth.h"
#include "common/log.h"
#include "trainer_bridge/internal.h"
#include "trainer_bridge/transports.h"

namespace arlo::bridge::internal {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

enum FrameType : std::uint8_t {
  kHello = 1,
  kWelcome = 2,
  kBatch = 3,
  kAck = 4,
  kVersion = 5,
  kHeartbeat = 6,
  kError = 7,
  kChallenge = 8,
};

constexpr std::string_view kAuthContext = "arlo-bridge/1";
// Frames before the HELLO is verified: CHALLENGE and HELLO are small JSON objects.
constexpr std::size_t kMaxHandshakeBytes = 64u << 10;

struct Frame {
  std::array<char, 9> head{};
  std::shared_ptr<const std::string> payload;
};

Frame make_frame(std::uint8_t type, std::shared_ptr<const std::string> payload) {
  Frame f;
  f.head[0] = static_cast<char>(type);
  const std::uint64_t n = payload->size();
  for (int i = 0; i < 8; ++i) f.head[1 + i] = static_cast<char>((n >> (8 * i)) & 0xff);
  f.payload = std::move(payload);
  return f;
}
Frame make_frame(std::uint8_t type, const json& body) {
  return make_frame(type, std::make_shared<const std::string>(body.dump()));
}

// One connection's outgoing queue: frames are written in order by a single writer coroutine.
struct Outbox {
  std::deque<Frame> frames;
  bool writing = false;
};

// Reads one frame; kResourceExhausted when it is larger than `max_bytes`.
asio::awaitable<Result<std::pair<std::uint8_t, std::string>>> read_frame(tcp::socket& sock, std::size_t max_bytes) {
  std::array<unsigned char, 9> head{};
  boost::system::error_code ec;
  co_await asio::async_read(sock, asio::buffer(head), asio::redirect_error(asio::use_awaitable, ec));
  if (ec) co_return make_error(ErrorCode::kUnavailable, fmt::format("connection closed ({})", ec.message()));
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(head[1 + i]) << (8 * i);
  if (n > max_bytes) {
    co_return make_error(ErrorCode::kResourceExhausted,
                         fmt::format("frame of {} bytes exceeds the limit of {}", n, max_bytes));
  }
  std::string payload(n, '\0');
  co_await asio::async_read(sock, asio::buffer(payload), asio::redirect_error(asio::use_awaitable, ec));
  if (ec) co_return make_error(ErrorCode::kUnavailable, fmt::format("connection closed mid-frame ({})", ec.message()));
  co_return std::make_pair(head[0], std::move(payload));
}

// Starts the writer if idle. `sock` and `box` must outlive the writer (the shared_ptrs see to it).
void enqueue(std::shared_ptr<tcp::socket> sock, std::shared_ptr<Outbox> box, Frame frame) {
  box->frames.push_back(std::move(frame));
  if (box->writing) return;
  box->writing = true;
  auto executor = sock->get_executor();
  asio::co_spawn(
      executor,
      [sock, box]() -> asio::awaitable<void> {
        while (!box->frames.empty()) {
          Frame& f = box->frames.front();
          std::array<asio::const_buffer, 2> bufs{asio::buffer(f.head), asio::buffer(*f.payload)};
          boost::system::error_code ec;
          co_await asio::async_write(*sock, bufs, asio::redirect_error(asio::use_awaitable, ec));
          if (ec) {
            box->frames.clear();
            sock->close(ec);
            break;
          }
          box->frames.pop_front();
        }
        box->writing = false;
      },
      asio::detached);
}

// Sockets must not leak into processes the orchestrator or trainer spawns (a child holding the
// listening socket would keep the port bound after a restart).
template <typename Socket>
void set_cloexec(Socket& s) {
  const int fd = s.native_handle();
  if (fd >= 0) ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);
}

json parse_body(const std::string& payload) { return json::parse(payload, nullptr, /*allow_exceptions=*/false); }

std::int64_t get_int(const json& j, const char* key, std::int64_t fallback) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return fallback;
  return it->get<std::int64_t>();
}

// ----------------------------------------------------------------------------------------------
// Orchestrator side.

struct Session {
  Session(tcp::socket s, Clock::time_point now)
      : sock(std::make_shared<tcp::socket>(std::move(s))), box(std::make_shared<Outbox>()), last_rx(now) {}
  std::shared_ptr<tcp::socket> sock;
  std::shared_ptr<Outbox> box;
  int rank = -1;
  Clock::time_point last_rx;        // on the server's clock
  std::unique_ptr<Timer> watchdog;  // the next heartbeat tick; closing the session cancels it
  bool closed = false;

  void send(Frame f) {
    if (!closed) enqueue(sock, box, std::move(f));
  }
  void close() {
    closed = true;
    watchdog.reset();
    boost::system::error_code ec;
    sock->close(ec);
  }
};

struct SocketServerState : ServerCore {
  SocketServerState(asio::io_context& io, ServerOptions o)
      : ServerCore(io, std::move(o), "bridge socket"), acceptor(io) {}

  tcp::acceptor acceptor;
  std::uint16_t bound_port = 0;
  std::map<int, std::shared_ptr<Session>> sessions;  // by rank, after HELLO
  std::vector<std::weak_ptr<Session>> connections;   // every accepted connection: stop() closes them

  void close_io() {
    boost::system::error_code ec;
    acceptor.close(ec);
    for (auto& weak : connections)
      if (auto s = weak.lock()) s->close();
    connections.clear();
    sessions.clear();
  }

  void handle_ack(int rank, std::int64_t step) {
    rank_acked[rank] = std::max(rank_acked[rank], step);
    const std::int64_t all = *std::min_element(rank_acked.begin(), rank_acked.end());
    if (all <= last_acked) return;
    last_acked = all;
    while (!pending.empty() && pending.begin()->first <= all) {
      const std::int64_t s = pending.begin()->first;
      pending.erase(pending.begin());
      if (ack_cb) ack_cb(s);
    }
    changed.notify();
  }

  void handle_version(std::int64_t version, json info) {
    if (version <= latest_version) return;
    latest_version = version;
    if (version_cb) version_cb(VersionEvent{version, info.is_object() ? std::move(info) : json::object()});
  }

  // Encodes every rank's part, streams each to its rank when connected, and keeps them until acked
  // (a rank that connects later, or again, gets them on its HELLO).
  Status deliver(const StepBatch& batch) {
    std::vector<std::shared_ptr<const std::string>> images;
    for (const RankBatch& rb : batch.ranks) {
      auto image = encode(rb);
      if (!image) return std::unexpected(std::move(image.error()));
      images.push_back(std::make_shared<const std::string>(std::move(*image)));
    }
    for (auto& [rank, session] : sessions) {
      if (batch.step > rank_acked[rank]) send_batch(*session, batch.step, images[rank]);
    }
    pending.emplace(batch.step, std::move(images));
    return ok();
  }

  void send_batch(Session& s, std::int64_t step, const std::shared_ptr<const std::string>& image) {
    s.send(make_frame(kBatch, image));
    (void)step;
  }

  // Schedules the session's next heartbeat tick, heartbeat_interval from now on the clock. The tick
  // keeps the session alive (a refused trainer's connection stays open until its ERROR went out and
  // the timeout passed); closing the session cancels it, and stop() closes every session.
  static void arm_watchdog(const std::shared_ptr<SocketServerState>& st, const std::shared_ptr<Session>& s) {
    s->watchdog = st->clock->schedule(st->clock->now() + st->opt.heartbeat_interval, [weak_st = std::weak_ptr(st), s] {
      if (auto st = weak_st.lock()) watchdog_tick(st, s);
    });
  }

  // One tick: drops a trainer silent for longer than heartbeat_timeout, else sends it a heartbeat
  // and schedules the next tick.
  static void watchdog_tick(const std::shared_ptr<SocketServerState>& st, const std::shared_ptr<Session>& s) {
    if (s->closed || st->stopped) return;
    if (st->clock->now() - s->last_rx > st->opt.heartbeat_timeout) {
      ARLO_WARN("bridge socket: trainer rank {} silent for longer than the heartbeat timeout; dropping it", s->rank);
      s->close();
      return;
    }
    s->send(make_frame(kHeartbeat, json{{"time_ms", wall_ms()}}));
    arm_watchdog(st, s);
  }

  static asio::awaitable<void> serve(std::shared_ptr<SocketServerState> st, std::shared_ptr<Session> s) {
    arm_watchdog(st, s);
    auto challenge = auth::nonce();
    if (!challenge) {
      ARLO_WARN("bridge socket: {}; closing a new connection", challenge.error().what());
      s->close();
      co_return;
    }
    s->send(make_frame(kChallenge, json{{"nonce", *challenge}, {"token_required", !st->opt.token.empty()}}));
    auto hello = co_await read_frame(*s->sock, std::min(st->opt.max_frame_bytes, kMaxHandshakeBytes));
    if (!hello || hello->first != kHello) {
      if (hello)
        ARLO_WARN("bridge socket: first frame was type {}, expected HELLO; closing", hello->first);
      else if (hello.error().code() == ErrorCode::kResourceExhausted)
        ARLO_WARN("bridge socket: refusing a connection: its first frame: {}", hello.error().message());
      s->close();
      co_return;
    }
    s->last_rx = st->clock->now();
    const json h = parse_body(hello->second);
    if (!st->opt.token.empty()) {
      const auto it = h.is_object() ? h.find("proof") : h.end();
      if (it == h.end() || !it->is_string() ||
          !auth::verify_proof(st->opt.token, kAuthContext, *challenge, it->get<std::string>())) {
        const std::string why =
            it == h.end() || !it->is_string()
                ? "authentication failed: this orchestrator requires a token and the trainer sent none "
                  "(set $ARLO_TOKEN or $ARLO_TOKEN_FILE, or the bridge client's token)"
                : "authentication failed: the trainer's token is not this run's";
        ARLO_WARN("bridge socket: refusing a trainer: {}", why);
        s->send(make_frame(kError, json{{"message", why}}));
        co_return;  // the watchdog closes it after the error went out or the timeout passed
      }
    }
    const std::int64_t rank = h.is_object() ? get_int(h, "rank", -1) : -1;
    if (rank < 0 || rank >= st->opt.num_ranks) {
      const std::string why =
          fmt::format("rank {} is outside [0, {}) (num_ranks of the orchestrator)", rank, st->opt.num_ranks);
      ARLO_WARN("bridge socket: refusing a trainer: {}", why);
      s->send(make_frame(kError, json{{"message", why}}));
      co_return;  // the watchdog closes it after the error went out or the timeout passed
    }
    s->rank = static_cast<int>(rank);
    if (auto old = st->sessions.find(s->rank); old != st->sessions.end()) old->second->close();
    st->sessions[s->rank] = s;
    ARLO_INFO("bridge socket: trainer rank {} connected (last acked step {})", rank, get_int(h, "last_acked_step", 0));
    s->send(make_frame(kWelcome, json{{"num_ranks", st->opt.num_ranks}}));
    st->handle_ack(s->rank, get_int(h, "last_acked_step", 0));
    if (h.contains("version")) st->handle_version(get_int(h, "version", -1), h.value("info", json::object()));
    for (const auto& [step, images] : st->pending) {
      if (step > st->rank_acked[s->rank]) st->send_batch(*s, step, images[s->rank]);
    }

    for (;;) {
      auto frame = co_await read_frame(*s->sock, st->opt.max_frame_bytes);
      if (!frame) {
        if (!s->closed && !st->stopped)
          ARLO_INFO("bridge socket: trainer rank {} disconnected: {}", s->rank, frame.error().what());
        break;
      }
      s->last_rx = st->clock->now();
      const json body = parse_body(frame->second);
      if (!body.is_object()) {
        ARLO_WARN("bridge socket: trainer rank {} sent a malformed frame of type {}; closing", s->rank, frame->first);
        break;
      }
      switch (frame->first) {
        case kAck: st->handle_ack(s->rank, get_int(body, "step", 0)); break;
        case kVersion: st->handle_version(get_int(body, "version", -1), body.value("info", json::object())); break;
        case kHeartbeat:
          if (st->heartbeat_cb) {
            st->heartbeat_cb(HeartbeatEvent{s->rank, get_int(body, "last_acked_step", 0), get_int(body, "time_ms", 0)});
          }
          break;
        default: ARLO_WARN("bridge socket: trainer rank {} sent unknown frame type {}; ignored", s->rank, frame->first);
      }
    }
    s->close();
    if (auto it = st->sessions.find(s->rank); it != st->sessions.end() && it->second == s) st->sessions.erase(it);
  }

  static asio::awaitable<void> accept_loop(std::shared_ptr<SocketServerState> st) {
    for (;;) {
      boost::system::error_code ec;
      tcp::socket sock = co_await st->acceptor.async_accept(asio::redirect_error(asio::use_awaitable, ec));
      if (st->stopped) co_return;
      if (ec) {
        ARLO_WARN_EVERY(5.0, "bridge socket: accept failed: {}", ec.message());
        continue;
      }
      set_cloexec(sock);
      sock.set_option(tcp::no_delay(true), ec);
      auto session = std::make_shared<Session>(std::move(sock), st->clock->now());
      std::erase_if(st->connections, [](const std::weak_ptr<Session>& c) { return c.expired(); });
      st->connections.push_back(session);
      asio::co_spawn(st->io, serve(st, std::move(session)), asio::detached);
    }
  }
  // BridgeServer::start(); `self` is this state, for the coroutines it starts.
  static Status start(const std::shared_ptr<SocketServerState>& self) {
    auto& st = *self;
    boost::system::error_code ec;
    auto address = asio::ip::make_address(st.opt.bind, ec);
    if (ec) {
      // A host name (this host's own, "localhost"): listen on the first address it resolves to.
      // Resolved once, here: the address a server listens on does not move under it.
      tcp::resolver resolver(st.io);
      tcp::resolver::results_type results;
      if (!st.opt.bind.empty()) results = resolver.resolve(st.opt.bind, "0", ec);
      if (ec || results.empty())
        return make_error(
            ErrorCode::kInvalidArgument,
            fmt::format("bridge socket: the bind host '{}' is neither an IP address nor a name that resolves "
                        "({}): give an address of this host (0.0.0.0 for all)",
                        st.opt.bind, ec ? ec.message() : std::string("no addresses")));
      address = results.begin()->endpoint().address();
      ARLO_INFO("bridge socket: bind host '{}' resolves to {}", st.opt.bind, address.to_string());
    }
    ARLO_TRY(auth::require_token_off_loopback("the trainer bridge (socket)", address.to_string(), st.opt.token));
    const tcp::endpoint endpoint(address, st.opt.port);
    st.acceptor.open(endpoint.protocol(), ec);
    if (!ec) set_cloexec(st.acceptor);
    if (!ec) st.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) st.acceptor.bind(endpoint, ec);
    if (!ec) st.acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return make_error(ErrorCode::kIo,
                        fmt::format("bridge socket: listening on {}:{}: {}", st.opt.bind, st.opt.port, ec.message()));
    }
    st.bound_port = st.acceptor.local_endpoint().port();
    st.rank_acked.assign(static_cast<std::size_t>(st.opt.num_ranks), 0);
    st.started = true;
    asio::co_spawn(st.io, SocketServerState::accept_loop(self), asio::detached);
    ARLO_INFO("bridge socket: listening on {}:{} for {} rank(s)", st.opt.bind, st.bound_port, st.opt.num_ranks);
    return ok();
  }

  std::uint16_t port() const { return bound_port; }
};

// ----------------------------------------------------------------------------------------------
// Trainer side: a background thread runs the connection; the trainer's calls exchange data with it
// under a mutex.

class SocketClient final : public BridgeClient {
 public:
  explicit SocketClient(ClientOptions o)
      : opt_(std::move(o)),
        work_(asio::make_work_guard(io_)),
        backoff_timer_(io_),
        clock_(pick_clock(opt_.clock, io_.get_executor(), own_clock_)) {
    last_acked_ = std::max<std::int64_t>(0, opt_.start_after_step);
  }
  ~SocketClient() override { close(); }

  void start(std::string token) {
    token_ = std::move(token);
    asio::co_spawn(io_, run(), asio::detached);
    thread_ = std::thread([this] { io_.run(); });
  }

  Result<BatchView> next_batch(Duration timeout) override {
    std::unique_lock lock(mu_);
    const auto deadline = SteadyClock::now() + timeout;  // the caller's wait for the peer: real time
    cv_.wait_until(lock, deadline, [&] { return closed_ || fatal_ || batch_error_ || !ready_.empty(); });
    if (closed_) return make_error(ErrorCode::kCancelled, "bridge socket client: closed");
    if (fatal_) return std::unexpected(*fatal_);
    if (batch_error_) {
      Error e = std::move(*batch_error_);
      batch_error_.reset();
      return std::unexpected(std::move(e));
    }
    if (ready_.empty()) {
      return make_error(ErrorCode::kTimeout,
                        fmt::format("bridge socket client: no batch for rank {} after step {} within the timeout ({})",
                                    opt_.rank, last_acked_,
                                    connected_              ? std::string("connected")
                                    : last_failure_.empty() ? std::string("not connected")
                                                            : "not connected: " + last_failure_));
    }
    return ready_.begin()->second;
  }

  Status ack(std::int64_t step) override {
    {
      std::lock_guard lock(mu_);
      if (closed_) return make_error(ErrorCode::kCancelled, "bridge socket client: closed");
      if (step <= last_acked_) return ok();
      last_acked_ = step;
      while (!ready_.empty() && ready_.begin()->first <= step) ready_.erase(ready_.begin());
    }
    asio::post(io_, [this, step] { send_now(make_frame(kAck, json{{"step", step}})); });
    return ok();
  }

  Status published(std::int64_t version, const json& info) override {
    if (version < 0) return make_error(ErrorCode::kInvalidArgument, fmt::format("published: version {} < 0", version));
    json body{{"version", version}, {"info", info.is_object() ? info : json::object()}};
    {
      std::lock_guard lock(mu_);
      if (closed_) return make_error(ErrorCode::kCancelled, "bridge socket client: closed");
      if (version > latest_version_) {
        latest_version_ = version;
        latest_info_ = body["info"];
      }
    }
    // Sent now when connected; otherwise the next HELLO carries the latest version.
    asio::post(io_, [this, body = std::move(body)] { send_now(make_frame(kVersion, body)); });
    return ok();
  }

  Status heartbeat() override {
    asio::post(io_, [this] { send_heartbeat(); });
    return ok();
  }

  std::int64_t last_acked_step() const override {
    std::lock_guard lock(mu_);
    return last_acked_;
  }

  void close() override {
    {
      std::lock_guard lock(mu_);
      if (closed_) return;
      closed_ = true;
    }
    cv_.notify_all();
    // Let acks and version notices already queued reach the orchestrator (bounded), then stop.
    if (thread_.joinable()) {
      std::promise<void> flushed;
      auto done = flushed.get_future();
      asio::co_spawn(io_, flush_and_shutdown(), [&flushed](std::exception_ptr) { flushed.set_value(); });
      done.wait_for(std::chrono::seconds(3));
    }
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }

 private:
  // io thread only from here on.
  void send_now(Frame f) {
    if (sock_ && sock_->is_open()) enqueue(sock_, box_, std::move(f));
  }
  void send_heartbeat() {
    if (hello_sent_)
      send_now(make_frame(kHeartbeat, json{{"time_ms", wall_ms()}, {"last_acked_step", last_acked_step()}}));
  }

  asio::awaitable<void> flush_and_shutdown() {
    boost::system::error_code ec;
    backoff_timer_.cancel();
    asio::steady_timer timer(io_);
    const auto deadline = SteadyClock::now() + std::chrono::seconds(2);  // socket writes draining: real time
    while (sock_ && sock_->is_open() && box_ && (box_->writing || !box_->frames.empty()) &&
           SteadyClock::now() < deadline) {
      timer.expires_after(std::chrono::milliseconds(2));
      co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    if (sock_) {
      sock_->shutdown(tcp::socket::shutdown_both, ec);
      sock_->close(ec);
    }
  }

  // Schedules the connection's next heartbeat tick, heartbeat_interval from now on the clock. The
  // clock's callback only posts the tick to the io thread (the clock may fire it on another thread).
  void arm_heartbeat(const std::shared_ptr<tcp::socket>& sock) {
    heartbeat_due_ = clock_->schedule(clock_->now() + opt_.heartbeat_interval,
                                      [this, sock] { asio::post(io_, [this, sock] { heartbeat_tick(sock); }); });
  }

  // One tick on connection `sock`: closes it when the orchestrator was silent for longer than
  // heartbeat_timeout (run() then reconnects), else sends a heartbeat and schedules the next tick.
  void heartbeat_tick(const std::shared_ptr<tcp::socket>& sock) {
    if (!sock->is_open() || sock != sock_) return;
    if (clock_->now() - last_rx_ > opt_.heartbeat_timeout) {
      ARLO_WARN("bridge socket client: orchestrator silent for longer than the heartbeat timeout; reconnecting");
      boost::system::error_code ec;
      sock->close(ec);
      return;
    }
    send_heartbeat();
    arm_heartbeat(sock);
  }

  // Waits `d` on the clock before the next connection attempt; close() cuts it short by cancelling
  // backoff_timer_. A wake-up posted for an earlier wait (its generation) is ignored.
  asio::awaitable<void> wait_backoff(Duration d) {
    const std::uint64_t generation = ++backoff_generation_;
    backoff_timer_.expires_at(asio::steady_timer::time_point::max());
    backoff_due_ = clock_->schedule(clock_->now() + d, [this, generation] {
      asio::post(io_, [this, generation] {
        if (generation == backoff_generation_) backoff_timer_.cancel();
      });
    });
    boost::system::error_code ec;
    co_await backoff_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    backoff_due_.reset();
  }

  // The connection `sock` ended (EOF, error, no challenge): no more heartbeat ticks for it.
  void end_connection(const std::shared_ptr<tcp::socket>& sock) {
    boost::system::error_code ec;
    sock->close(ec);
    heartbeat_due_.reset();
    std::lock_guard lock(mu_);
    connected_ = false;
  }

  // One connection attempt: resolves opt_.host (an IP address resolves to itself) and tries every
  // address it resolves to, in order. Null with `why` set when none connected.
  asio::awaitable<std::shared_ptr<tcp::socket>> connect_once(std::string& why) {
    boost::system::error_code ec;
    tcp::resolver resolver(io_);
    const auto results = co_await resolver.async_resolve(opt_.host, std::to_string(opt_.port),
                                                         asio::redirect_error(asio::use_awaitable, ec));
    if (ec || results.empty()) {
      why = fmt::format("the orchestrator's host '{}' (from {}) does not resolve ({}); retrying until it does",
                        opt_.host, opt_.host_source, ec ? ec.message() : std::string("no addresses"));
      co_return nullptr;
    }
    std::vector<std::string> tried;
    for (const auto& entry : results) {
      const tcp::endpoint endpoint = entry.endpoint();
      auto sock = std::make_shared<tcp::socket>(io_);
      sock->open(endpoint.protocol(), ec);
      if (!ec) {
        set_cloexec(*sock);
        co_await sock->async_connect(endpoint, asio::redirect_error(asio::use_awaitable, ec));
      }
      if (!ec) co_return sock;
      tried.push_back(fmt::format("{} ({})", endpoint.address().to_string(), ec.message()));
      if (is_closed()) break;
    }
    std::string list;
    for (const auto& t : tried) list += (list.empty() ? "" : ", ") + t;
    why = fmt::format("cannot reach the orchestrator at {}:{} (from {}){}; retrying", opt_.host, opt_.port,
                      opt_.host_source, list.empty() ? std::string() : ": " + list);
    co_return nullptr;
  }

  asio::awaitable<void> run() {
    auto backoff = std::chrono::milliseconds(20);
    const auto max_backoff = std::chrono::duration_cast<std::chrono::milliseconds>(opt_.reconnect_backoff_max);
    std::string warned;  // the last reason logged: each new reason is logged once
    for (;;) {
      if (is_closed()) co_return;
      boost::system::error_code ec;
      std::string why;
      auto sock = co_await connect_once(why);
      if (!sock) {
        if (is_closed()) co_return;
        if (why != warned) ARLO_INFO("bridge socket client: {}", why);
        warned = why;
        {
          std::lock_guard lock(mu_);
          last_failure_ = why;
        }
        co_await wait_backoff(backoff);
        backoff = std::min(backoff * 2, max_backoff);
        continue;
      }
      {
        std::lock_guard lock(mu_);
        last_failure_.clear();
      }
      warned.clear();
      backoff = std::chrono::milliseconds(20);
      sock->set_option(tcp::no_delay(true), ec);
      sock_ = sock;
      box_ = std::make_shared<Outbox>();
      last_rx_ = clock_->now();
      hello_sent_ = false;
      // The orchestrator speaks first: CHALLENGE (or ERROR). The heartbeat watchdog bounds the wait.
      arm_heartbeat(sock);
      auto challenge = co_await read_frame(*sock, std::min(opt_.max_frame_bytes, kMaxHandshakeBytes));
      if (!challenge || challenge->first != kChallenge) {
        if (challenge && challenge->first == kError) {
          refused(challenge->second, *sock);
          co_return;
        }
        if (!is_closed())
          ARLO_WARN("bridge socket client: no challenge from {}:{} ({}); reconnecting", opt_.host, opt_.port,
                    challenge ? fmt::format("frame type {}", challenge->first) : challenge.error().what());
        end_connection(sock);
        co_await wait_backoff(backoff);
        continue;
      }
      last_rx_ = clock_->now();
      const json c = parse_body(challenge->second);
      json hello{{"rank", opt_.rank}, {"protocol", 1}};
      if (!token_.empty() && c.is_object() && c.contains("nonce") && c["nonce"].is_string())
        hello["proof"] = auth::proof(token_, kAuthContext, c["nonce"].get<std::string>());
      {
        std::lock_guard lock(mu_);
        hello["last_acked_step"] = last_acked_;
        if (latest_version_ >= 0) {
          hello["version"] = latest_version_;
          hello["info"] = latest_info_;
        }
      }
      {
        std::lock_guard lock(mu_);
        connected_ = true;
      }
      send_now(make_frame(kHello, hello));
      hello_sent_ = true;
      for (;;) {
        auto frame = co_await read_frame(*sock, opt_.max_frame_bytes);
        if (!frame) {
          if (!is_closed()) ARLO_WARN("bridge socket client: {}; reconnecting", frame.error().what());
          break;
        }
        last_rx_ = clock_->now();
        if (frame->first == kBatch) {
          on_batch(std::move(frame->second));
        } else if (frame->first == kError) {
          refused(frame->second, *sock);
          co_return;
        }
        // WELCOME and HEARTBEAT only refresh last_rx_.
      }
      end_connection(sock);
      co_await wait_backoff(backoff);
    }
  }

  // The orchestrator's ERROR frame (`payload`): it refused this trainer, and that is final: every
  // call fails from now on with its message. Closes `sock`.
  void refused(const std::string& payload, tcp::socket& sock) {
    const json body = parse_body(payload);
    set_fatal(Error(ErrorCode::kInvalidArgument,
                    fmt::format("bridge socket client: orchestrator refused rank {}: {}", opt_.rank,
                                body.is_object() ? body.value("message", std::string("?")) : std::string("?"))));
    boost::system::error_code ec;
    sock.close(ec);
  }

  void on_batch(std::string image) {
    auto view = BatchView::from_bytes(std::move(image));
    std::int64_t reack = -1;
    {
      std::lock_guard lock(mu_);
      if (!view) {
        batch_error_ = std::move(view.error()).with_context("bridge socket client: received batch refused");
      } else if (view->rank() != opt_.rank) {
        batch_error_ = Error(ErrorCode::kMismatch,
                             fmt::format("bridge socket client: received a batch for rank {}, this is rank {}",
                                         view->rank(), opt_.rank));
      } else if (view->step() <= last_acked_) {
        reack = last_acked_;  // resent after a reconnect; it is done, say so again
      } else {
        ready_.emplace(view->step(), std::move(*view));
      }
    }
    cv_.notify_all();
    if (reack >= 0) send_now(make_frame(kAck, json{{"step", reack}}));
  }

  bool is_closed() {
    std::lock_guard lock(mu_);
    return closed_;
  }
  void set_fatal(Error e) {
    {
      std::lock_guard lock(mu_);
      fatal_ = std::move(e);
    }
    cv_.notify_all();
  }

  ClientOptions opt_;
  asio::io_context io_;  // first: destroyed last, after everything that uses it
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  asio::steady_timer backoff_timer_;  // never expires by itself: the clock's backoff_due_ or close() wakes it
  std::unique_ptr<Clock> own_clock_;  // the real clock on io_, when opt_.clock is null
  Clock* clock_;                      // heartbeats, the heartbeat timeout, the reconnect backoff
  std::thread thread_;

  // io thread only (the timers are destroyed before the clock and io_)
  std::unique_ptr<Timer> heartbeat_due_;  // the current connection's next heartbeat tick
  std::unique_ptr<Timer> backoff_due_;    // the end of the current backoff wait
  std::uint64_t backoff_generation_ = 0;
  std::shared_ptr<tcp::socket> sock_;
  std::shared_ptr<Outbox> box_;
  Clock::time_point last_rx_;  // on clock_
  bool hello_sent_ = false;    // on this connection: heartbeats only after HELLO
  std::string token_;          // set before start()

  // shared, under mu_
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::int64_t, BatchView> ready_;
  std::int64_t last_acked_ = 0;
  std::int64_t latest_version_ = -1;
  json latest_info_ = json::object();
  std::optional<Error> batch_error_;
  std::optional<Error> fatal_;
  bool closed_ = false;
  bool connected_ = false;
  std::string last_failure_;  // why the last connection attempt failed; empty once one connects
};

}  // namespace

Result<std::unique_ptr<BridgeServer>> make_socket_server(asio::io_context& io, ServerOptions options) {
  if (options.num_ranks < 1) return make_error(ErrorCode::kInvalidArgument, "bridge socket: num_ranks must be >= 1");
  if (options.max_pending_batches < 1)
    return make_error(ErrorCode::kInvalidArgument, "bridge socket: max_pending_batches must be >= 1");
  return std::unique_ptr<BridgeServer>(new Server<SocketServerState>(io, std::move(options)));
}

Result<std::unique_ptr<BridgeClient>> make_socket_client(const ClientOptions& options) {
  if (options.port == 0)
    return make_error(ErrorCode::kInvalidArgument, "bridge socket client: port is 0 (give the orchestrator's port)");
  if (options.rank < 0) return make_error(ErrorCode::kInvalidArgument, "bridge socket client: rank must be >= 0");
  if (options.host.empty())
    return make_error(
        ErrorCode::kInvalidArgument,
        fmt::format(
            "bridge socket client: the orchestrator's host (from {}) is empty: give its IP address or host name",
            options.host_source));
  auto token = auth::resolve_token(options.token, "");
  if (!token) return std::unexpected(Error(token.error()).with_context("bridge socket client: its token"));
  auto client = std::make_unique<SocketClient>(options);
  client->start(std::move(*token));
  return std::unique_ptr<BridgeClient>(std::move(client));
}

}  // namespace arlo::bridge::internal
