// Both transports through the same contract, in one process: the orchestrator side on an
// io_context thread, trainer clients on the test thread. Synchronisation is on events (futures,
// condition variables), never on sleeps. Heartbeats, their timeouts and the reconnect backoff run
// on fake clocks the tests advance: no test waits for an interval to pass.
#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_future.hpp>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "common/async/fake_clock.h"
#include "tests/temp_dir.h"
#include "trainer_bridge/bridge.h"
#include "trainer_bridge/server_thread.h"

namespace arlo::bridge {
namespace {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

StepBatch make_step(std::int64_t step, int ranks) {
  std::mt19937 rng(static_cast<unsigned>(step * 7 + 1));
  std::vector<Sample> samples;
  for (int i = 0; i < 6 * ranks; ++i) {
    Sample s;
    s.prompt_tokens.assign(static_cast<std::size_t>(3 + rng() % 5), static_cast<std::int32_t>(step));
    const std::size_t c = 1 + rng() % 9;
    s.completion_tokens.assign(c, static_cast<std::int32_t>(100 + step));
    s.completion_logprobs.assign(c, -0.25f);
    s.token_versions.assign(c, static_cast<std::int32_t>(step - 1));
    s.advantage = 0.5f;
    samples.push_back(std::move(s));
  }
  auto packed = pack(step, samples, {.seq_len = 32, .num_ranks = ranks});
  EXPECT_TRUE(packed);
  return std::move(*packed);
}

// A FakeClock behind a lock, for socket clients: a client calls its clock from its own connection
// thread and the test advances it from the test thread (the client's timer callbacks only post back
// to its thread, so firing them here is safe). It also counts what the client schedules, so a test
// waits for "the client is backing off" instead of for time to pass.
class SharedFakeClock final : public Clock {
 public:
  time_point now() const override {
    std::lock_guard lock(mu_);
    return clock_.now();
  }
  std::unique_ptr<Timer> schedule(time_point at, std::function<void()> fn) override {
    auto handle = std::make_unique<Handle>(this);
    {
      std::lock_guard lock(mu_);
      handle->inner = clock_.schedule(at, std::move(fn));
      ++scheduled_;
    }
    cv_.notify_all();
    return handle;
  }
  void advance(duration d) {
    std::lock_guard lock(mu_);
    clock_.advance(d);
  }
  std::size_t scheduled() const {
    std::lock_guard lock(mu_);
    return scheduled_;
  }
  // Waits (bounded, generously: a name lookup may take DNS timeouts) until `n` timers were scheduled.
  bool wait_scheduled(std::size_t n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, 90s, [&] { return scheduled_ >= n; });
  }

 private:
  struct Handle final : Timer {
    explicit Handle(SharedFakeClock* owner) : owner(owner) {}
    ~Handle() override { cancel(); }
    void cancel() override {
      std::lock_guard lock(owner->mu_);
      inner.reset();
    }
    SharedFakeClock* owner;
    std::unique_ptr<Timer> inner;
  };
  mutable std::mutex mu_;
  std::condition_variable cv_;
  FakeClock clock_;
  std::size_t scheduled_ = 0;
};

// Everything the orchestrator side reports, observable from the test thread.
struct Events {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::int64_t> versions, acks;
  std::vector<HeartbeatEvent> heartbeats;
  std::size_t max_pending_seen = 0;

  template <typename Pred>
  bool wait(Pred pred) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, 20s, pred);
  }
};

class Transport : public ::testing::TestWithParam<std::string> {
 protected:
  void start_server(int ranks, std::size_t max_pending, std::uint16_t port = 0) {
    ServerOptions o;
    o.transport = GetParam();
    o.run_dir = run_dir_.path();
    o.bind = bind_;
    o.port = port;
    o.num_ranks = ranks;
    o.max_pending_batches = max_pending;
    o.heartbeat_interval = 100ms;
    o.heartbeat_timeout = 60s;  // a peer is dropped only when it dies (EOF) or the test moves time
    o.clock = &server_clock_;
    auto started = loop_.start(o, [this](BridgeServer& server) {
      server.on_version([this](VersionEvent v) {
        std::lock_guard lock(events_.mu);
        events_.versions.push_back(v.version);
        events_.cv.notify_all();
      });
      server.on_ack([this, &server](std::int64_t step) {
        std::lock_guard lock(events_.mu);
        events_.acks.push_back(step);
        events_.max_pending_seen = std::max(events_.max_pending_seen, server.pending());
        events_.cv.notify_all();
      });
      server.on_heartbeat([this](HeartbeatEvent h) {
        std::lock_guard lock(events_.mu);
        events_.heartbeats.push_back(h);
        events_.cv.notify_all();
      });
    });
    ASSERT_TRUE(started) << started.error().what();
    port_ = loop_.port();
  }
  std::future<Status> send_async(StepBatch b) { return loop_.send_async(std::move(b)); }
  Status send(std::int64_t step, int ranks) { return loop_.send(make_step(step, ranks)); }

  // The client receives `step`, acks it, and the orchestrator side reports the ack.
  void receive_and_ack(BridgeClient& c, std::int64_t step) {
    auto b = c.next_batch(20s);
    ASSERT_TRUE(b) << b.error().what();
    EXPECT_EQ(b->step(), step);
    ASSERT_TRUE(c.ack(step));
    ASSERT_TRUE(events_.wait([&] { return !events_.acks.empty() && events_.acks.back() == step; }));
  }

  std::unique_ptr<BridgeClient> client(int rank, std::int64_t start_after = 0) {
    ClientOptions o;
    o.transport = GetParam();
    o.run_dir = run_dir_.path();
    o.host = host_;
    o.host_source = "the test's host";
    o.port = port_;
    o.rank = rank;
    o.start_after_step = start_after;
    o.heartbeat_interval = 100ms;
    o.heartbeat_timeout = 60s;  // as the server's
    o.reconnect_backoff_max = 100ms;
    o.clock = &client_clock_;
    auto c = connect(o);
    EXPECT_TRUE(c) << c.error().what();
    return std::move(*c);
  }

  // Declared before the server and clients, which hold its timers: destroyed after them.
  FakeClock server_clock_;        // the server's: used on the loop's thread (loop_.run)
  SharedFakeClock client_clock_;  // every socket client's: advanced from the test thread
  test_files::TempDir run_dir_{"arlo_bridge_transport"};
  std::uint16_t port_ = 0;
  std::string bind_ = "127.0.0.1", host_ = "127.0.0.1";  // socket: where the server listens, the client connects
  Events events_;
  ServerThread loop_;  // last: destroyed first, its server with it, before what the callbacks use
};

TEST_P(Transport, DeliversEveryRankInOrderAndCountsAcks) {
  start_server(2, 3);
  std::vector<StepBatch> sent;
  for (int s = 1; s <= 3; ++s) {
    sent.push_back(make_step(s, 2));
    ASSERT_TRUE(send_async(sent.back()).get());
  }
  auto c0 = client(0), c1 = client(1);
  for (int s = 1; s <= 3; ++s) {
    for (auto* c : {c0.get(), c1.get()}) {
      auto b = c->next_batch(20s);
      ASSERT_TRUE(b) << b.error().what();
      EXPECT_EQ(b->step(), s);
      // Same step until acked.
      auto again = c->next_batch(20s);
      ASSERT_TRUE(again);
      EXPECT_EQ(again->step(), s);
      const RankBatch got = b->to_rank_batch();
      const RankBatch& want = sent[static_cast<std::size_t>(s - 1)].ranks[static_cast<std::size_t>(b->rank())];
      EXPECT_EQ(got.input_ids, want.input_ids);
      EXPECT_EQ(got.loss_mask, want.loss_mask);
      ASSERT_TRUE(c->ack(s));
    }
  }
  ASSERT_TRUE(events_.wait([&] { return events_.acks.size() == 3; }));
  EXPECT_EQ(events_.acks, (std::vector<std::int64_t>{1, 2, 3}));
  EXPECT_EQ(loop_.run([&] { return loop_.server()->pending(); }), 0u);
  EXPECT_TRUE(asio::co_spawn(loop_.io(), loop_.server()->wait_all_acked(20s), asio::use_future).get());
  auto none = c0->next_batch(10ms);  // every step is acked and no more are sent: stays empty
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code(), ErrorCode::kTimeout);
  if (GetParam() == "dir") {
    // Consumed batches are gone once every rank acked.
    EXPECT_FALSE(fs::exists(dir_layout::step_dir(run_dir_.path(), 1)));
  }
}

TEST_P(Transport, BackPressureHoldsAtMaxPending) {
  start_server(1, 2);
  ASSERT_TRUE(send(1, 1));
  ASSERT_TRUE(send(2, 1));
  auto third = send_async(make_step(3, 1));
  // Two steps are unacknowledged, so the third cannot have been sent (it waits on an ack).
  EXPECT_EQ(loop_.run([&] { return loop_.server()->pending(); }), 2u);
  EXPECT_EQ(third.wait_for(0s), std::future_status::timeout);
  auto c = client(0);
  auto b = c->next_batch(20s);
  ASSERT_TRUE(b);
  ASSERT_EQ(b->step(), 1);
  ASSERT_TRUE(c->ack(1));
  ASSERT_TRUE(third.get());
  EXPECT_LE(loop_.run([&] { return loop_.server()->pending(); }), 2u);
  for (int s = 2; s <= 3; ++s) {
    auto next = c->next_batch(20s);
    ASSERT_TRUE(next);
    EXPECT_EQ(next->step(), s);
    ASSERT_TRUE(c->ack(s));
  }
  ASSERT_TRUE(events_.wait([&] { return events_.acks.size() == 3; }));
  EXPECT_LE(events_.max_pending_seen, 2u);
}

// wait_all_acked gives up at its timeout on the server's clock, naming what is unacknowledged; a
// later wait ends when the ack comes.
TEST_P(Transport, WaitAllAckedTimesOutOnTheClockAndEndsOnTheAck) {
  start_server(1, 2);
  ASSERT_TRUE(send(1, 1));
  auto first = asio::co_spawn(loop_.io(), loop_.server()->wait_all_acked(30s), asio::use_future);
  loop_.run([&] { server_clock_.advance(29s); });  // within the timeout
  loop_.run([] {});                                // what the advance posted has run
  EXPECT_EQ(first.wait_for(0s), std::future_status::timeout);
  loop_.run([&] { server_clock_.advance(2s); });
  auto r = first.get();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kTimeout);
  EXPECT_NE(r.error().message().find("bridge " + GetParam() + ": 1 step(s) still unacknowledged (oldest 1)"),
            std::string::npos)
      << r.error().message();
  auto second = asio::co_spawn(loop_.io(), loop_.server()->wait_all_acked(30s), asio::use_future);
  auto c = client(0);
  ASSERT_NO_FATAL_FAILURE(receive_and_ack(*c, 1));
  EXPECT_TRUE(second.get());
}

TEST_P(Transport, VersionsOnceInOrderAndHeartbeats) {
  start_server(1, 2);
  auto c = client(0);
  ASSERT_TRUE(c->published(0, {{"where", "v0"}}));
  ASSERT_TRUE(c->published(2));
  ASSERT_TRUE(events_.wait([&] { return !events_.versions.empty() && events_.versions.back() == 2; }));
  ASSERT_TRUE(c->published(1));  // older than what was reported: ignored
  ASSERT_TRUE(c->published(3));
  ASSERT_TRUE(events_.wait([&] { return events_.versions.back() == 3; }));
  EXPECT_TRUE(std::is_sorted(events_.versions.begin(), events_.versions.end()));
  EXPECT_EQ(std::count(events_.versions.begin(), events_.versions.end(), 1), 0);
  EXPECT_EQ(loop_.run([&] { return loop_.server()->latest_version(); }), 3);
  ASSERT_TRUE(c->heartbeat());
  ASSERT_TRUE(events_.wait([&] { return !events_.heartbeats.empty(); }));
  EXPECT_EQ(events_.heartbeats.front().rank, 0);
}

TEST_P(Transport, UnackedBatchIsDeliveredAgainAfterTrainerRestart) {
  start_server(1, 2);
  ASSERT_TRUE(send(1, 1));
  ASSERT_TRUE(send(2, 1));
  {
    auto c = client(0);
    auto b = c->next_batch(20s);
    ASSERT_TRUE(b);
    EXPECT_EQ(b->step(), 1);
    // The trainer dies mid-step: no ack.
  }
  auto c = client(0);
  auto b = c->next_batch(20s);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->step(), 1);
  ASSERT_TRUE(c->ack(1));
  auto b2 = c->next_batch(20s);
  ASSERT_TRUE(b2);
  EXPECT_EQ(b2->step(), 2);
  ASSERT_TRUE(c->ack(2));
  ASSERT_TRUE(events_.wait([&] { return events_.acks.size() == 2; }));
  EXPECT_EQ(events_.acks, (std::vector<std::int64_t>{1, 2}));
}

TEST_P(Transport, StartAfterStepSkipsWhatTheCheckpointHolds) {
  start_server(1, 3);
  ASSERT_TRUE(send(1, 1));
  ASSERT_TRUE(send(2, 1));
  // Trained step 1 and checkpointed, then crashed before acking it.
  auto c = client(0, /*start_after=*/1);
  auto b = c->next_batch(20s);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->step(), 2);
  ASSERT_TRUE(events_.wait([&] { return events_.acks.size() == 1; }));
  EXPECT_EQ(events_.acks.front(), 1);
}

TEST_P(Transport, TrainerContinuesAfterOrchestratorRestart) {
  start_server(1, 2);
  auto c = client(0);
  ASSERT_TRUE(c->published(0));
  ASSERT_TRUE(events_.wait([&] { return events_.versions.size() == 1; }));
  ASSERT_TRUE(send(1, 1));
  auto b = c->next_batch(20s);
  ASSERT_TRUE(b);
  ASSERT_TRUE(c->ack(1));
  ASSERT_TRUE(c->published(1));
  ASSERT_TRUE(events_.wait([&] { return events_.acks.size() == 1 && events_.versions.size() == 2; }));
  const std::uint16_t port = port_;
  const std::size_t scheduled = client_clock_.scheduled();
  loop_.stop();
  {
    std::lock_guard lock(events_.mu);
    events_.versions.clear();
    events_.acks.clear();
  }
  start_server(1, 2, port);
  if (GetParam() == "socket") {
    // The trainer saw the connection end and backs off; its backoff passing, it reconnects.
    ASSERT_TRUE(client_clock_.wait_scheduled(scheduled + 1));
    client_clock_.advance(1s);
  }
  // The restarted orchestrator learns the latest version again...
  ASSERT_TRUE(events_.wait([&] { return !events_.versions.empty(); }));
  EXPECT_EQ(events_.versions.back(), 1);
  // ... re-cuts step 1 from its checkpoint (already trained: completes without redelivery) and
  // goes on with step 2, which the same trainer process receives.
  ASSERT_TRUE(send(1, 1));
  ASSERT_TRUE(send(2, 1));
  ASSERT_NO_FATAL_FAILURE(receive_and_ack(*c, 2));
  EXPECT_EQ(loop_.run([&] { return loop_.server()->last_acked_step(); }), 2);
}

TEST_P(Transport, CloseWakesAWaitingTrainer) {
  start_server(1, 2);
  auto c = client(0);
  auto waiting = std::async(std::launch::async, [&] { return c->next_batch(60s); });
  c->close();
  auto r = waiting.get();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kCancelled);
}

INSTANTIATE_TEST_SUITE_P(Both, Transport, ::testing::Values("dir", "socket"));

// Host names on the socket transport: "localhost" resolves through /etc/hosts on every machine the
// tests run on; ".invalid" never resolves (RFC 2606).
class SocketHostNames : public Transport {};

TEST_P(SocketHostNames, BothSidesTakeAHostName) {
  bind_ = "localhost";
  start_server(1, 2);
  host_ = "localhost";
  auto c = client(0);
  ASSERT_TRUE(send(1, 1));
  ASSERT_NO_FATAL_FAILURE(receive_and_ack(*c, 1));
}

TEST_P(SocketHostNames, AnUnresolvableNameIsNamedAndRetriedNotFatal) {
  start_server(1, 2);
  host_ = "no-such-host.invalid";
  auto c = client(0);
  // The first attempt failed once the client backs off (the lookup itself is real I/O).
  ASSERT_TRUE(client_clock_.wait_scheduled(1));
  auto r = c->next_batch(0s);
  ASSERT_FALSE(r);
  ASSERT_EQ(r.error().code(), ErrorCode::kTimeout) << r.error().what();  // never fatal: it keeps retrying
  EXPECT_NE(r.error().message().find("'no-such-host.invalid' (from the test's host) does not resolve"),
            std::string::npos)
      << r.error().message();
  // Its backoff passing, it tries again, fails again and backs off again.
  client_clock_.advance(1s);
  ASSERT_TRUE(client_clock_.wait_scheduled(2));
  // Still retrying, still saying why; a batch sent meanwhile waits for it.
  ASSERT_TRUE(send(1, 1));
  r = c->next_batch(0s);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kTimeout);
  EXPECT_NE(r.error().message().find("no-such-host.invalid"), std::string::npos) << r.error().message();
  c->close();
}

TEST_P(SocketHostNames, AnUnresolvableBindNameFailsStartNamingIt) {
  ServerOptions o;
  o.transport = "socket";
  o.bind = "no-such-host.invalid";
  loop_.run([&] {
    auto s = BridgeServer::create(loop_.io(), o);
    ASSERT_TRUE(s) << s.error().what();
    auto started = (*s)->start();
    ASSERT_FALSE(started);
    EXPECT_EQ(started.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(started.error().message().find("'no-such-host.invalid'"), std::string::npos) << started.error().message();
  });
}

TEST_P(SocketHostNames, AnEmptyHostIsRefusedAtConnect) {
  ClientOptions o;
  o.transport = "socket";
  o.host = "";
  o.host_source = "--bridge-host";
  o.port = 9;
  auto c = connect(o);
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message().find("(from --bridge-host) is empty"), std::string::npos) << c.error().message();
}

INSTANTIATE_TEST_SUITE_P(Socket, SocketHostNames, ::testing::Values("socket"));

// Heartbeat timeouts on the socket transport, both ways, on the fake clocks (timeout 60 s).
class SocketHeartbeats : public Transport {};

TEST_P(SocketHeartbeats, TheOrchestratorDropsASilentTrainerWhichReconnects) {
  start_server(1, 2);
  auto c = client(0);  // its clock stands still: it sends no heartbeats of its own
  ASSERT_TRUE(send(1, 1));
  auto b = c->next_batch(20s);  // connected
  ASSERT_TRUE(b) << b.error().what();
  const std::size_t scheduled = client_clock_.scheduled();
  loop_.run([&] { server_clock_.advance(59s); });  // silent, within the timeout: kept
  ASSERT_TRUE(c->published(1));
  ASSERT_TRUE(events_.wait([&] { return !events_.versions.empty(); }));
  loop_.run([&] { server_clock_.advance(61s); });  // silent for longer than the timeout since then
  // Dropped: the trainer sees its connection end and backs off.
  ASSERT_TRUE(client_clock_.wait_scheduled(scheduled + 1));
  ASSERT_TRUE(c->published(2));  // not connected: the next HELLO carries it
  client_clock_.advance(1s);
  ASSERT_TRUE(events_.wait([&] { return events_.versions.back() == 2; }));
  ASSERT_TRUE(c->ack(1));
  ASSERT_TRUE(events_.wait([&] { return events_.acks.size() == 1; }));
}

TEST_P(SocketHeartbeats, TheTrainerDropsASilentOrchestratorAndReconnects) {
  start_server(1, 2);  // its clock stands still: it sends no heartbeats
  auto c = client(0);
  ASSERT_TRUE(send(1, 1));
  auto b = c->next_batch(20s);  // connected
  ASSERT_TRUE(b) << b.error().what();
  const std::size_t scheduled = client_clock_.scheduled();
  client_clock_.advance(61s);  // the next heartbeat tick finds the orchestrator silent for too long
  ASSERT_TRUE(client_clock_.wait_scheduled(scheduled + 1));  // it closed and backs off
  ASSERT_TRUE(c->published(3));
  client_clock_.advance(1s);
  ASSERT_TRUE(events_.wait([&] { return !events_.versions.empty() && events_.versions.back() == 3; }));
  ASSERT_TRUE(c->ack(1));
  ASSERT_TRUE(events_.wait([&] { return events_.acks.size() == 1; }));
}

INSTANTIATE_TEST_SUITE_P(Socket, SocketHeartbeats, ::testing::Values("socket"));

TEST(DirTransport, HostileBatchFileIsRefusedNotTrained) {
  const test_files::TempDir dir("arlo_bridge_hostile");
  const fs::path& run_dir = dir.path();
  ClientOptions o;
  o.run_dir = run_dir;
  auto c = connect(o);
  ASSERT_TRUE(c);
  // A step directory whose batch lies about its size.
  const fs::path tmp = dir_layout::rollouts(run_dir) / ".tmp_step";
  fs::create_directories(tmp);
  std::ofstream(tmp / "rank_0.safetensors", std::ios::binary)
      << std::string("\xff\xff\xff\x00\x00\x00\x00\x00{\"a\":", 13);
  fs::rename(tmp, dir_layout::step_dir(run_dir, 1));
  auto b = (*c)->next_batch(5s);
  ASSERT_FALSE(b);
  EXPECT_EQ(b.error().code(), ErrorCode::kParse) << b.error().what();
}

}  // namespace
}  // namespace arlo::bridge
