// The TCPStore-compatible rendezvous store (weight_sync/transports/nccl/store.h) over loopback:
// StoreClient and raw sockets against StoreServer, in both dialects, and the id forms of
// rendezvous.h. Ordering on a connection is used instead of sleeps: a PING sent after a WAIT is
// answered only after the server has registered that WAIT.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "tests/log_capture.h"
#include "weight_sync/transports/nccl/rendezvous.h"
#include "weight_sync/transports/nccl/store.h"

namespace arlo::weight_sync::nccl {
namespace {

using namespace std::chrono_literals;

Deadline soon() { return deadline_in(30s); }  // generous: the machine is loaded

using arlo::test_log::log_capture;

// Raw requests: a command byte as the dialect under test numbers it, then the fields in the
// store's wire encoding (store_encode).
template <typename... Fields>
std::string raw_request(std::uint8_t cmd, const Fields&... fields) {
  return store_encode(cmd, fields...);
}
std::string validate(std::uint32_t magic = kStoreValidateMagic) { return raw_request(0, magic); }
std::string ping(std::uint32_t nonce) { return raw_request(13, nonce); }
std::string keys_request(std::uint8_t cmd, const std::vector<std::string>& keys) { return raw_request(cmd, keys); }
std::string as_bytes(std::uint32_t v) { return store_encode(v); }

// A plain blocking socket with a 30 s receive timeout: for requests StoreClient would never send.
class Raw {
 public:
  explicit Raw(std::uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << std::strerror(errno);
    timeval tv{30, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~Raw() { close(); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  void send(std::string_view b) {
    ASSERT_EQ(::send(fd_, b.data(), b.size(), MSG_NOSIGNAL), static_cast<ssize_t>(b.size()));
  }
  void shutdown_write() { ::shutdown(fd_, SHUT_WR); }
  // Exactly n bytes, or what arrived before EOF/timeout.
  std::string recv(std::size_t n) {
    std::string out(n, '\0');
    std::size_t done = 0;
    while (done < n) {
      const ssize_t got = ::recv(fd_, out.data() + done, n - done, 0);
      if (got <= 0) break;
      done += static_cast<std::size_t>(got);
    }
    out.resize(done);
    return out;
  }
  // True when the server closed the connection (EOF) with nothing more to read.
  bool eof() {
    char c;
    return ::recv(fd_, &c, 1, 0) == 0;
  }

 private:
  int fd_ = -1;
};

// Polls `cond` until true or 30 s pass.
template <typename F>
bool eventually(F cond) {
  const auto end = deadline_in(30s);
  while (!cond()) {
    if (Clock::now() > end) return false;
    std::this_thread::yield();
  }
  return true;
}

class NcclStore : public ::testing::Test {
 protected:
  void SetUp() override {
    log_capture();
    auto s = StoreServer::start("127.0.0.1", 0);
    ASSERT_TRUE(s) << s.error().what();
    server = std::move(*s);
    ASSERT_NE(server->port(), 0);
  }
  std::unique_ptr<StoreClient> client() {
    auto c = StoreClient::connect("127.0.0.1", server->port(), soon());
    EXPECT_TRUE(c) << c.error().what();
    return c ? std::move(*c) : nullptr;
  }
  // A raw connection that has validated and is known to be registered by the server.
  std::unique_ptr<Raw> raw_current() {
    auto r = std::make_unique<Raw>(server->port());
    r->send(validate() + ping(7));
    EXPECT_EQ(r->recv(4), as_bytes(7));
    return r;
  }
  std::unique_ptr<StoreServer> server;
};

TEST_F(NcclStore, EveryCommand) {
  auto c = client();
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->set("/a", "alpha", soon()));
  auto a = c->get("/a", soon());
  ASSERT_TRUE(a) << a.error().what();
  EXPECT_EQ(*a, "alpha");
  EXPECT_EQ(server->get("/a"), "alpha");

  // Binary values, empty values.
  std::string bin("\0\x01\xff\n", 4);
  ASSERT_TRUE(c->set("/bin", bin, soon()));
  EXPECT_EQ(*c->get("/bin", soon()), bin);
  ASSERT_TRUE(c->set("/empty", "", soon()));
  EXPECT_EQ(*c->get("/empty", soon()), "");

  EXPECT_EQ(*c->add("init/", 1, soon()), 1);
  EXPECT_EQ(*c->add("init/", 41, soon()), 42);
  EXPECT_EQ(*c->add("init/", -50, soon()), -8);
  EXPECT_EQ(server->get("init/"), "-8");  // decimal ASCII, as torch stores it
  EXPECT_EQ(server->add("init/", 10), 2);
  EXPECT_EQ(*c->get("init/", soon()), "2");

  EXPECT_EQ(*c->check({"/a", "/bin"}, soon()), true);
  EXPECT_EQ(*c->check({"/a", "/missing"}, soon()), false);
  EXPECT_EQ(*c->check({}, soon()), true);

  // COMPARE_SET, torch's four cases.
  EXPECT_EQ(*c->compare_set("/cs", "", "first", soon()), "first");  // missing + empty expected: set
  EXPECT_EQ(*c->compare_set("/cs2", "x", "never", soon()), "x");    // missing + other: expected back
  EXPECT_FALSE(server->get("/cs2"));
  EXPECT_EQ(*c->compare_set("/cs", "first", "second", soon()), "second");  // match: replaced
  EXPECT_EQ(*c->compare_set("/cs", "nope", "third", soon()), "second");    // mismatch: current value

  const auto before = *c->num_keys(soon());
  EXPECT_EQ(before, 5);  // /a /bin /empty init/ /cs
  EXPECT_EQ(*c->delete_key("/cs", soon()), true);
  EXPECT_EQ(*c->delete_key("/cs", soon()), false);
  EXPECT_EQ(*c->num_keys(soon()), before - 1);

  ASSERT_TRUE(c->append("/log", "ab", soon()));
  ASSERT_TRUE(c->append("/log", "cd", soon()));
  EXPECT_EQ(*c->get("/log", soon()), "abcd");

  ASSERT_TRUE(c->multi_set({{"/m1", "one"}, {"/m2", ""}, {"/m3", "three"}}, soon()));
  auto m = c->multi_get({"/m3", "/m1", "/m2"}, soon());
  ASSERT_TRUE(m) << m.error().what();
  EXPECT_EQ(*m, (std::vector<std::string>{"three", "one", ""}));

  EXPECT_EQ(*c->ping(0xabcdef01, soon()), 0xabcdef01u);
  ASSERT_TRUE(c->wait({"/a", "/m2"}, soon()));
}

TEST_F(NcclStore, LargeValueRoundTrip) {
  auto c = client();
  std::string big(8 << 20, '\0');
  std::mt19937 rng(14);
  for (auto& ch : big) ch = static_cast<char>(rng());
  ASSERT_TRUE(c->set("/big", big, soon()));
  auto got = c->get("/big", soon());
  ASSERT_TRUE(got) << got.error().what();
  EXPECT_TRUE(*got == big);
}

TEST_F(NcclStore, WaitCompletesLaterFromAnotherClient) {
  auto waiter = raw_current();
  waiter->send(keys_request(6, {"/late", "/later"}) + ping(11));
  EXPECT_EQ(waiter->recv(4), as_bytes(11));  // the WAIT is registered and not answered
  auto other = client();
  ASSERT_TRUE(other->set("/late", "1", soon()));
  EXPECT_EQ(*other->ping(1, soon()), 1u);  // the SET is processed; the WAIT still lacks /later
  waiter->send(ping(12));
  EXPECT_EQ(waiter->recv(4), as_bytes(12));  // nothing (no STOP_WAITING) before the echo
  ASSERT_TRUE(other->add("/later", 5, soon()));
  EXPECT_EQ(waiter->recv(1), std::string(1, '\0'));  // STOP_WAITING

  // The StoreClient form: get() waits, another client sets.
  std::string value;
  std::thread t([&] {
    auto c = client();
    auto v = c->get("/from-thread", soon());
    EXPECT_TRUE(v) << v.error().what();
    if (v) value = *v;
  });
  ASSERT_TRUE(other->set("/from-thread", "hello", soon()));
  t.join();
  EXPECT_EQ(value, "hello");
}

TEST_F(NcclStore, WaitCompletesFromInProcessSetAndAppendAndMultiSet) {
  auto w = raw_current();
  w->send(keys_request(6, {"/ip"}) + ping(1));
  EXPECT_EQ(w->recv(4), as_bytes(1));
  server->set("/ip", "x");
  EXPECT_EQ(w->recv(1), std::string(1, '\0'));

  auto other = client();
  w->send(keys_request(6, {"/ap", "/ms"}) + ping(2));
  EXPECT_EQ(w->recv(4), as_bytes(2));
  ASSERT_TRUE(other->append("/ap", "z", soon()));
  ASSERT_TRUE(other->multi_set({{"/ms", "y"}}, soon()));
  EXPECT_EQ(w->recv(1), std::string(1, '\0'));

  w->send(keys_request(6, {"/cas"}) + ping(3));
  EXPECT_EQ(w->recv(4), as_bytes(3));
  EXPECT_EQ(*other->compare_set("/cas", "", "v", soon()), "v");
  EXPECT_EQ(w->recv(1), std::string(1, '\0'));
}

TEST_F(NcclStore, InProcessWait) {
  // Wire SET wakes an in-process wait.
  std::atomic<int> result{-1};
  std::thread t([&] { result = server->wait({"/w1", "/w2"}, Clock::now() + 30s) ? 1 : 0; });
  auto c = client();
  ASSERT_TRUE(c->set("/w1", "a", soon()));
  server->set("/w2", "b");
  t.join();
  EXPECT_EQ(result, 1);
  // Deadline.
  const auto start = Clock::now();
  EXPECT_FALSE(server->wait({"/never"}, start + 50ms));
  EXPECT_GE(Clock::now() - start, 50ms);
  // Stop: a waiter returns false when the server goes away.
  StoreServer* raw = server.get();
  std::thread t2([&] { result = raw->wait({"/never"}, Clock::now() + 60s) ? 1 : 0; });
  ASSERT_TRUE(eventually([&] { return raw->waiting() == 1; }));
  server.reset();
  t2.join();
  EXPECT_EQ(result, 0);
}

TEST_F(NcclStore, WaitDeadlineSendsCancelAndConnectionStaysUsable) {
  auto c = client();
  const auto start = Clock::now();
  auto st = c->wait({"/never"}, Clock::now() + 100ms);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), ErrorCode::kTimeout);
  EXPECT_NE(st.error().what().find("WAIT"), std::string::npos) << st.error().what();
  EXPECT_NE(st.error().what().find("/never"), std::string::npos) << st.error().what();
  EXPECT_NE(st.error().what().find(c->server()), std::string::npos) << st.error().what();
  EXPECT_GE(Clock::now() - start, 100ms);
  // The wait was cancelled: setting the key later sends nothing stray to this client.
  auto other = client();
  ASSERT_TRUE(other->set("/never", "now", soon()));
  EXPECT_EQ(*c->ping(99, soon()), 99u);
  EXPECT_EQ(*c->get("/never", soon()), "now");

  auto g = c->get("/missing-forever", Clock::now() + 50ms);
  ASSERT_FALSE(g);
  EXPECT_EQ(g.error().code(), ErrorCode::kTimeout);
  EXPECT_EQ(*c->add("/after", 3, soon()), 3);
}

TEST_F(NcclStore, CancelWaitRaw) {
  auto w = raw_current();
  std::string cancel(1, '\x0c');
  // Cancel a pending wait: WAIT_CANCELED, and no STOP_WAITING after a later SET.
  w->send(keys_request(6, {"/k1"}) + cancel);
  EXPECT_EQ(w->recv(1), std::string(1, '\x01'));
  server->set("/k1", "v");
  auto other = client();
  ASSERT_TRUE(other->set("/k1", "v2", soon()));
  w->send(ping(5));
  EXPECT_EQ(w->recv(4), as_bytes(5));
  // A STOP_WAITING that crossed the cancel: both answers, in order.
  w->send(keys_request(6, {"/k2"}) + ping(6));
  EXPECT_EQ(w->recv(4), as_bytes(6));
  server->set("/k2", "v");
  w->send(cancel);
  EXPECT_EQ(w->recv(2), std::string("\x00\x01", 2));
}

// LIST_KEYS (17): a u64 count, then every key as a string; the connection stays usable.
TEST_F(NcclStore, ListKeysAnswersEveryKey) {
  server->set("/a", "1");
  server->set("/broadcast_from/0/0", "id");
  auto r = raw_current();
  r->send(raw_request(17));
  const std::string count = r->recv(8);
  ASSERT_EQ(count, store_encode(std::uint64_t{2}));
  std::set<std::string> keys;
  for (int i = 0; i < 2; ++i) {
    std::uint64_t n = 0;
    const std::string len = r->recv(8);
    ASSERT_EQ(len.size(), 8u);
    std::memcpy(&n, len.data(), 8);
    keys.insert(r->recv(n));
  }
  EXPECT_EQ(keys, (std::set<std::string>{"/a", "/broadcast_from/0/0"}));
  r->send(ping(3));
  EXPECT_EQ(r->recv(4), as_bytes(3));
}

// BARRIER (18) key world_size: every arrival gets STOP_WAITING once world_size arrived; the count
// is kept under the key; an early arrival can cancel its wait like a WAIT's.
TEST_F(NcclStore, BarrierReleasesEveryArrivalOnceAllArrived) {
  auto first = raw_current(), second = raw_current(), third = raw_current();
  const std::string stop_waiting(1, '\x00');
  first->send(raw_request(18, "/store_barrier", std::int64_t{3}) + ping(1));
  EXPECT_EQ(first->recv(4), as_bytes(1));  // the barrier is registered, not answered
  second->send(raw_request(18, "/store_barrier", std::int64_t{3}) + ping(2));
  EXPECT_EQ(second->recv(4), as_bytes(2));
  EXPECT_EQ(server->get("/store_barrier"), "2");
  third->send(raw_request(18, "/store_barrier", std::int64_t{3}));
  EXPECT_EQ(third->recv(1), stop_waiting);
  EXPECT_EQ(first->recv(1), stop_waiting);
  EXPECT_EQ(second->recv(1), stop_waiting);
  EXPECT_EQ(server->get("/store_barrier"), "3");
  // A barrier of one passes at once; a waiting arrival that gives up gets WAIT_CANCELED.
  first->send(raw_request(18, "/solo", std::int64_t{1}));
  EXPECT_EQ(first->recv(1), stop_waiting);
  second->send(raw_request(18, "/pair", std::int64_t{2}) + std::string(1, '\x0c'));
  EXPECT_EQ(second->recv(1), std::string(1, '\x01'));
  second->send(ping(4));
  EXPECT_EQ(second->recv(4), as_bytes(4));
}

TEST_F(NcclStore, GetOfMissingKeyClosesOnlyThatConnection) {
  auto bad = raw_current();
  bad->send(raw_request(3, "/nope"));
  EXPECT_TRUE(bad->eof());
  EXPECT_TRUE(log_capture().contains("GET", "/nope"));
  auto bad2 = raw_current();
  bad2->send(keys_request(10, {"/nope2"}));  // MULTI_GET
  EXPECT_TRUE(bad2->eof());
  EXPECT_TRUE(log_capture().contains("MULTI_GET", "/nope2"));
  auto good = client();
  EXPECT_EQ(*good->add("/fine", 1, soon()), 1);
}

TEST_F(NcclStore, BadMagicClosesWithLog) {
  Raw r(server->port());
  r.send(validate(0xdeadbeef));
  EXPECT_TRUE(r.eof());
  EXPECT_TRUE(log_capture().contains("wrong magic", "0xdeadbeef"));
  // A second VALIDATE with a wrong magic on a validated connection too.
  auto v = raw_current();
  v->send(validate(0x12345678));
  EXPECT_TRUE(v->eof());
  EXPECT_TRUE(log_capture().contains("VALIDATE", "0x12345678"));
  EXPECT_TRUE(client());
}

TEST_F(NcclStore, MalformedAndTruncatedRequestsCloseOnlyThatConnection) {
  auto keep = client();
  ASSERT_TRUE(keep->set("/kept", "yes", soon()));
  {  // Truncated: a SET whose key is cut short, then the peer closes.
    auto r = raw_current();
    r->send(raw_request(1, std::uint64_t{10}) + "abc");
    r->shutdown_write();
    EXPECT_TRUE(r->eof());
    EXPECT_TRUE(log_capture().contains("truncated SET"));
  }
  {  // A key over the limit: refused from its length, before the bytes come.
    auto r = raw_current();
    r->send(raw_request(1, std::uint64_t{kStoreMaxKeyBytes + 1}));
    EXPECT_TRUE(r->eof());
    EXPECT_TRUE(log_capture().contains("SET request", "over the limit"));
  }
  {  // A value over the limit.
    auto r = raw_current();
    r->send(raw_request(1, "/k", std::uint64_t{kStoreMaxValueBytes + 1}));
    EXPECT_TRUE(r->eof());
    EXPECT_TRUE(log_capture().contains("a value of", "over the limit"));
  }
  {  // Too many keys in a WAIT.
    auto r = raw_current();
    r->send(raw_request(6, std::uint64_t{1} << 40));
    EXPECT_TRUE(r->eof());
    EXPECT_TRUE(log_capture().contains("WAIT request", "keys in one request"));
  }
  {  // Unknown command.
    auto r = raw_current();
    r->send(std::string(1, '\x63'));
    EXPECT_TRUE(r->eof());
    EXPECT_TRUE(log_capture().contains("unknown command byte 99"));
  }
  {  // Queue commands are refused with their name.
    auto r = raw_current();
    r->send(raw_request(14, "/q", "v"));
    EXPECT_TRUE(r->eof());
    EXPECT_TRUE(log_capture().contains("QUEUE_PUSH", "not supported"));
  }
  {  // ADD onto a value that is not an integer (torch's server drops that connection too).
    ASSERT_TRUE(keep->set("/text", "abc", soon()));
    auto r = raw_current();
    r->send(raw_request(4, "/text", std::int64_t{1}));
    EXPECT_TRUE(r->eof());
    EXPECT_TRUE(log_capture().contains("ADD request", "not an integer"));
  }
  EXPECT_EQ(*keep->get("/kept", soon()), "yes");
  EXPECT_TRUE(eventually([&] { return server->connections() == 1; }));
}

TEST_F(NcclStore, LegacyDialect) {
  // torch < 2.2 (Debian's 1.13): no VALIDATE, SET 0, COMPARE_SET 1, GET 2, ADD 3, CHECK 4, WAIT 5,
  // GETNUMKEYS 6, DELETE_KEY 8, APPEND 9, MULTI_GET 10, MULTI_SET 11, CANCEL_WAIT 12.
  Raw r(server->port());
  r.send(raw_request(3, "init/", std::int64_t{1}));
  EXPECT_EQ(r.recv(8), store_encode(std::int64_t{1}));
  const std::string set = raw_request(0, "/k", "v");
  r.send(set + keys_request(5, {"/k"}));
  EXPECT_EQ(r.recv(1), std::string(1, '\0'));
  const std::string get = raw_request(2, "/k");
  r.send(get);
  EXPECT_EQ(r.recv(9), std::string("\x01\0\0\0\0\0\0\0v", 9));
  r.send(keys_request(4, {"/k", "/x"}));
  EXPECT_EQ(r.recv(1), std::string(1, '\x01'));  // NOT_READY
  r.send(std::string(1, '\x06'));                // GETNUMKEYS
  EXPECT_EQ(r.recv(8), store_encode(std::int64_t{2}));
  // WATCH_KEY is refused.
  r.send(raw_request(7, "/k"));
  EXPECT_TRUE(r.eof());
  EXPECT_TRUE(log_capture().contains("WATCH_KEY"));

  // A legacy client whose first request is a SET (0 then a small key length).
  Raw s(server->port());
  s.send(set + get);
  EXPECT_EQ(s.recv(9), std::string("\x01\0\0\0\0\0\0\0v", 9));
  // And both dialects see the same data.
  auto c = client();
  EXPECT_EQ(*c->get("/k", soon()), "v");
  EXPECT_EQ(*c->get("init/", soon()), "1");
}

TEST_F(NcclStore, ClientThatLeavesMidWaitIsCleanedUp) {
  {
    auto w = raw_current();
    w->send(keys_request(6, {"/gone"}) + ping(3));
    EXPECT_EQ(w->recv(4), as_bytes(3));
    EXPECT_EQ(server->connections(), 1u);
  }
  EXPECT_TRUE(eventually([&] { return server->connections() == 0; }));
  server->set("/gone", "v");  // no one to wake; must not touch the closed socket
  auto c = client();
  EXPECT_EQ(*c->get("/gone", soon()), "v");
}

TEST_F(NcclStore, ServerStopGivesWaitersEof) {
  auto w = raw_current();
  w->send(keys_request(6, {"/forever"}) + ping(4));
  EXPECT_EQ(w->recv(4), as_bytes(4));
  auto c = client();
  std::atomic<int> code{-1};
  std::thread t([&] {
    auto r = c->get("/forever2", Clock::now() + 60s);
    code = r ? 0 : static_cast<int>(r.error().code());
  });
  // The thread's WAIT may or may not have reached the server yet; either way it ends now.
  server.reset();
  EXPECT_TRUE(w->eof());
  t.join();
  EXPECT_EQ(code, static_cast<int>(ErrorCode::kUnavailable));
}

TEST_F(NcclStore, ManyConcurrentClients) {
  constexpr int kClients = 32;
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<StoreClient>> clients(kClients);
  std::atomic<int> failures{0};
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] {
      auto c = StoreClient::connect("127.0.0.1", server->port(), soon());
      if (!c) {
        ++failures;
        return;
      }
      if (!(*c)->add("init/", 1, soon())) ++failures;
      if (!(*c)->set("/rank/" + std::to_string(i), std::to_string(i), soon())) ++failures;
      // Everyone waits for everyone: completes only when the last client has set its key.
      std::vector<std::string> all;
      for (int j = 0; j < kClients; ++j) all.push_back("/rank/" + std::to_string(j));
      auto got = (*c)->multi_get(all, soon());
      if (!got || got->size() != kClients || (*got)[kClients - 1] != std::to_string(kClients - 1)) ++failures;
      clients[i] = std::move(*c);
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(server->get("init/"), std::to_string(kClients));
  EXPECT_EQ(server->connections(), static_cast<std::size_t>(kClients));
  clients.clear();
  EXPECT_TRUE(eventually([&] { return server->connections() == 0; }));
}

TEST_F(NcclStore, ConnectRetriesUntilTheServerListens) {
  const auto port = server->port();
  server.reset();
  // Nothing listens: refused until the deadline.
  const auto start = Clock::now();
  auto c = StoreClient::connect("127.0.0.1", port, Clock::now() + 200ms);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code(), ErrorCode::kUnavailable);
  EXPECT_NE(c.error().what().find(std::to_string(port)), std::string::npos) << c.error().what();
  EXPECT_GE(Clock::now() - start, 100ms);
  // A server that comes up while the client retries.
  std::atomic<bool> connected{false};
  std::thread t([&] {
    auto r = StoreClient::connect("127.0.0.1", port, Clock::now() + 60s);
    connected = r.has_value();
  });
  auto s = StoreServer::start("127.0.0.1", port);
  ASSERT_TRUE(s) << s.error().what();
  t.join();
  EXPECT_TRUE(connected);
}

TEST_F(NcclStore, OnChangeCallback) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> seen;
  std::thread::id cb_thread;
  server->on_change([&](const std::string& key) {
    std::lock_guard lock(mu);
    seen.push_back(key);
    cb_thread = std::this_thread::get_id();
    cv.notify_all();
  });
  auto c = client();
  ASSERT_TRUE(c->set("/s", "1", soon()));
  ASSERT_TRUE(c->add("/a", 1, soon()));
  ASSERT_TRUE(c->append("/ap", "x", soon()));
  ASSERT_TRUE(c->multi_set({{"/m1", "1"}, {"/m2", "2"}}, soon()));
  ASSERT_TRUE(c->compare_set("/cs", "", "v", soon()));
  ASSERT_TRUE(c->compare_set("/cs", "wrong", "w", soon()));  // no change: no callback
  ASSERT_TRUE(c->get("/s", soon()));                         // reads: no callback
  ASSERT_TRUE(c->delete_key("/s", soon()));
  server->set("/ip", "v");
  server->add("/ipa", 2);
  const std::vector<std::string> expected{"/s", "/a", "/ap", "/m1", "/m2", "/cs", "/ip", "/ipa"};
  std::unique_lock lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, 30s, [&] { return seen.size() >= expected.size(); }));
  EXPECT_EQ(seen, expected);
  EXPECT_NE(cb_thread, std::this_thread::get_id());
  // A callback may write to the store (the reaction to a peer's request).
  lock.unlock();
  server->on_change([&](const std::string& key) {
    if (key == "/request") server->set("/reply", "done");
  });
  ASSERT_TRUE(c->set("/request", "x", soon()));
  EXPECT_EQ(*c->get("/reply", soon()), "done");
}

TEST_F(NcclStore, ConnectToNothingAndBadHost) {
  auto c = StoreClient::connect("no such host name.invalid", 1, Clock::now() + 1s);
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().what().find("no such host name.invalid"), std::string::npos) << c.error().what();
  auto s = StoreServer::start("127.0.0.1", server->port());  // port taken
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().what().find(std::to_string(server->port())), std::string::npos) << s.error().what();
}

// --- rendezvous.h ----------------------------------------------------------------------------

UniqueId seeded_id(std::uint32_t seed) {
  UniqueId id;
  std::mt19937 rng(seed);
  for (auto& b : id.bytes) b = static_cast<std::byte>(rng());
  return id;
}

TEST(NcclRendezvous, Base64) {
  UniqueId counting;
  for (std::size_t i = 0; i < 128; ++i) counting.bytes[i] = static_cast<std::byte>(i);
  // Python: base64.b64encode(bytes(range(128)))
  EXPECT_EQ(base64(counting),
            "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+P0BBQkNERUZH"
            "SElKS0xNTk9QUVJTVFVWV1hZWltcXV5fYGFiY2RlZmdoaWprbG1ub3BxcnN0dXZ3eHl6e3x9fn8=");
  for (std::uint32_t seed = 1; seed <= 50; ++seed) {
    const auto id = seeded_id(seed);
    auto back = unique_id_from_base64(base64(id));
    ASSERT_TRUE(back) << back.error().what();
    EXPECT_EQ(*back, id);
  }
  const std::string good = base64(seeded_id(3));
  for (const auto& bad : {std::string(), good.substr(0, 171), good + "=",
                          good.substr(0, 169) + "!A=", good.substr(0, 100) + "=" + good.substr(101),
                          good.substr(0, 171) + "A", std::string(171, 'A') + "B" /* no padding */}) {
    auto r = unique_id_from_base64(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code(), ErrorCode::kParse);
    EXPECT_NE(r.error().what().find("base64"), std::string::npos) << r.error().what();
  }
  auto r = unique_id_from_base64(good.substr(0, 169) + "!A=");
  EXPECT_NE(r.error().what().find("invalid character 0x21 at offset 169"), std::string::npos) << r.error().what();
  // Stray bits in the last character (Python would ignore them; an id with them is corrupt).
  const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string stray = good;
  stray[170] = alphabet[alphabet.find(stray[170]) ^ 1];
  EXPECT_FALSE(unique_id_from_base64(stray));
}

TEST(NcclRendezvous, VllmPickleBytes) {
  const auto id = seeded_id(7);
  const std::string p = vllm_unique_id_pickle(id);
  const std::string module = "vllm.distributed.device_communicators.pynccl_wrapper";
  const std::string head = std::string("\x80\x03", 2) + "c_ctypes\n_unpickle\n" + "c" + module + "\nncclUniqueId\n" +
                           "}" + "C" + std::string(1, '\x80');
  ASSERT_EQ(p.size(), 223u);
  EXPECT_EQ(p.substr(0, head.size()), head);
  EXPECT_EQ(std::memcmp(p.data() + head.size(), id.bytes.data(), 128), 0);
  EXPECT_EQ(p.substr(head.size() + 128), "\x86\x86R.");
  EXPECT_EQ(module, kVllmUniqueIdModule);
  EXPECT_EQ(kVllmUniqueIdKey, "/broadcast_from/0/0");
}

TEST(NcclRendezvous, SglangKey) {
  EXPECT_EQ(sglang_unique_id_key("weight_update_group"), "/weight_update_group/weight_update_group//cuda//0");
  EXPECT_EQ(sglang_unique_id_key("g", 3), "/g/g//cuda//3");
}

}  // namespace
}  // namespace arlo::weight_sync::nccl
