// InferencePool against real local HTTP servers: routing, affinity, retries, circuit breaking,
// servers leaving and joining, and a server killed mid-run. Where a test depends on the pool's
// timing (health intervals and timeouts, deadlines), the pool runs on a FakeClock that the test moves.
// The clock is declared before the io_context (coroutines the context destroys still hold timers of
// it), the servers before the pool: at the end the pool's destructor stops it, then the servers'
// close them. No drain: closed servers may still have queued handlers; the io_context destroys them.
#include <gtest/gtest.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>

#include <map>
#include <set>

#include "common/async/coro.h"
#include "common/async/fake_clock.h"
#include "rollout/inference_pool.h"
#include "testing/inference_server_fake.h"
#include "tests/unit/rollout/rollout_test_util.h"

namespace arlo::rollout {
namespace {

using arlo::FakeClock;
using arlo::testing::InferenceServerFake;
using test::Event;
using test::run;
namespace asio = boost::asio;

PoolOptions fast_options() {
  PoolOptions o;
  o.health_interval = std::chrono::milliseconds(50);
  // A probe of a healthy server must never time out, even on a starved machine: a timed-out probe
  // counts as a failure and can open a good server's circuit. No test here needs a probe to expire
  // (a dead server refuses the connection at once).
  o.health_timeout = std::chrono::seconds(20);
  o.failure_threshold = 2;
  o.open_backoff_initial = std::chrono::milliseconds(20);
  o.open_backoff_max = std::chrono::milliseconds(200);
  o.max_attempts = 3;
  o.client.retry.max_attempts = 1;
  return o;
}

CompletionRequest request(const std::string& prompt, const std::string& key = "") {
  CompletionRequest r;
  r.prompt = prompt;
  r.affinity_key = key;
  r.sampling.max_tokens = 8;
  return r;
}

const WorkerStatus& status_of(const std::vector<WorkerStatus>& all, const std::string& url) {
  for (const auto& s : all)
    if (s.url == url) return s;
  throw std::runtime_error("no server " + url);
}

// Submits `n` requests one after another: every one must be answered by the server at `url`.
asio::awaitable<void> expect_answered_by(InferencePool& pool, int n, const std::string& url) {
  for (int i = 0; i < n; ++i) {
    auto r = co_await pool.submit(request("x"), std::chrono::seconds(10));
    EXPECT_TRUE(r) << (r ? "" : r.error().what());
    if (r) {
      EXPECT_EQ(r->worker, url);
    }
  }
}

// Until every server passed a health check (the loop's first probe of each is in flight at start).
asio::awaitable<bool> all_healthy(const InferencePool& pool) {
  co_return co_await test::eventually([&] {
    for (const auto& s : pool.status())
      if (!s.healthy) return false;
    return true;
  });
}

// Tests of what the pool does over time (health checks, probe timeouts, deadlines): its time is a
// FakeClock that the test moves. The clock is declared before the io_context: coroutines the context
// destroys still hold timers of it.
class InferencePoolOnAFakeClock : public ::testing::Test {
 protected:
  // The pool, with `o` on this clock (kept in `options`), over `servers`; its health loop started
  // unless `start` is false.
  InferencePool& make_pool(PoolOptions o, std::initializer_list<const InferenceServerFake*> servers,
                           bool start = true) {
    options = std::move(o);
    options.clock = &clock;
    pool_ = std::make_unique<InferencePool>(io, options);
    for (const auto* s : servers) pool_->add_worker(s->url());
    if (start) pool_->start();
    return *pool_;
  }
  // Runs `body` once the health loop's first probes answered.
  void run_once_healthy(asio::awaitable<void> body) {
    run(io, [&]() -> asio::awaitable<void> {
      EXPECT_TRUE(co_await all_healthy(*pool_));
      co_await std::move(body);
    }());
  }
  // From now on `server`'s requests and its health checks get no answer (its link is down).
  static void go_dark(InferenceServerFake& server) {
    server.hold = true;
    server.health_delay = std::chrono::seconds(60);
  }

  FakeClock clock;
  asio::io_context io;
  PoolOptions options;

 private:
  std::unique_ptr<InferencePool> pool_;
};

TEST(InferencePool, ParsesCompletionsAndRoutesGroupsByAffinity) {
  asio::io_context io;
  InferenceServerFake a(io), b(io);
  a.version = 3;
  InferencePool pool(io, fast_options());
  pool.add_worker(a.url());
  pool.add_worker(b.url() + "/");
  run(io, [&]() -> asio::awaitable<void> {
    co_await pool.check_all();
    auto st = pool.status();
    EXPECT_TRUE(status_of(st, a.url()).healthy);
    EXPECT_EQ(status_of(st, a.url()).version, 3);
    EXPECT_TRUE(status_of(st, b.url()).healthy);

    auto c = co_await pool.submit(request("1+1="), std::chrono::seconds(10));
    EXPECT_TRUE(c);
    if (!c) co_return;
    EXPECT_EQ(c->choices.at(0).text, "echo:1+1=");
    EXPECT_EQ(c->choices.at(0).logprobs.size(), c->choices.at(0).token_ids.size());
    EXPECT_EQ(c->attempts, 1);

    // Four samples of one group, sent concurrently, land on one server.
    std::vector<asio::awaitable<Result<Completion>>> calls;
    for (int i = 0; i < 4; ++i) calls.push_back(pool.submit(request("g", "group-1"), std::chrono::seconds(10)));
    auto results = co_await when_all(std::move(calls));
    std::set<std::string> servers;
    for (auto& r : results) {
      EXPECT_TRUE(r);
      if (r) servers.insert(r->worker);
    }
    EXPECT_EQ(servers.size(), 1u);
  }());
}

// A request that asks for a cache salt carries its worker's: the same until that worker's weights
// change (a pause, an update), then one no earlier request carried.
TEST(InferencePool, CacheSaltNamesTheWorkersWeightsAndChangesWithThem) {
  asio::io_context io;
  InferenceServerFake a(io);
  InferencePool pool(io, fast_options());
  pool.add_worker(a.url());
  auto salted = [](const std::string& key) {
    CompletionRequest r = request("p", key);
    r.cache_salt = true;
    return r;
  };
  std::vector<std::string> salts;  // of the requests to a, in order
  run(io, [&]() -> asio::awaitable<void> {
    co_await pool.check_all();
    auto send = [&](CompletionRequest r) -> asio::awaitable<void> {
      auto c = co_await pool.submit(std::move(r), std::chrono::seconds(10));
      EXPECT_TRUE(c) << (c ? "" : c.error().what());
      if (c) {
        EXPECT_EQ(c->worker, a.url());
      }
    };
    co_await send(salted("k"));
    co_await send(salted("k"));
    pool.weights_changed(a.url());  // a pause: the update may follow
    co_await send(salted("k"));
    pool.weights_changed(a.url() + "/", 5);  // v5 loaded
    co_await send(salted("k"));
    co_await send(request("p", "k"));  // not asked for
    pool.weights_changed(a.url());
    pool.weights_changed(a.url());  // a failed update: still v5, other weights maybe
    co_await send(salted("k"));
  }());
  ASSERT_EQ(a.bodies.size(), 6u);
  for (const auto& body : a.bodies) salts.push_back(body.value("cache_salt", ""));
  EXPECT_EQ(salts[0], salts[1]);
  EXPECT_EQ(salts[0].rfind("arlo-", 0), 0u) << salts[0];
  EXPECT_NE(salts[0].find("-vinit-0"), std::string::npos) << salts[0];
  EXPECT_NE(salts[2], salts[1]);
  EXPECT_NE(salts[3], salts[2]);
  EXPECT_NE(salts[3].find("-v5-"), std::string::npos) << salts[3];
  EXPECT_FALSE(a.bodies[4].contains("cache_salt"));
  EXPECT_NE(salts[5], salts[3]);
  EXPECT_NE(salts[5].find("-v5-"), std::string::npos) << salts[5];
  EXPECT_EQ(std::set<std::string>(salts.begin(), salts.end()).size(), 5u);  // 0 = 1; the unsalted one is ""
  EXPECT_EQ(pool.cache_salt(a.url()), salts[5]);
  EXPECT_EQ(pool.cache_salt("http://unknown:1"), "");
  // Another pool (another run against the same servers) shares no salt with this one.
  InferencePool other(io, fast_options());
  other.add_worker(a.url());
  EXPECT_NE(other.cache_salt(a.url()), salts[0]);
}

TEST(InferencePool, LeastOutstandingSpreadsLoadAcrossServers) {
  asio::io_context io;
  InferenceServerFake a(io), b(io), c(io);
  for (auto* s : {&a, &b, &c}) s->hold = true;
  Event all_held(io);
  int held = 0;
  for (auto* s : {&a, &b, &c})
    s->on_held = [&] {
      if (++held == 9) all_held.set();
    };
  InferencePool pool(io, fast_options());
  for (auto* s : {&a, &b, &c}) pool.add_worker(s->url());
  run(io, [&]() -> asio::awaitable<void> {
    co_await pool.check_all();
    int done = 0;
    for (int i = 0; i < 9; ++i)
      asio::co_spawn(
          io,
          [&, i]() -> asio::awaitable<void> {
            auto r = co_await pool.submit(request("p" + std::to_string(i)), std::chrono::seconds(20));
            EXPECT_TRUE(r);
            ++done;
          },
          asio::detached);
    co_await all_held.wait();
    // While all nine are outstanding, each server holds exactly three.
    EXPECT_EQ(a.held, 3);
    EXPECT_EQ(b.held, 3);
    EXPECT_EQ(c.held, 3);
    for (auto* s : {&a, &b, &c}) s->release_all();
    EXPECT_TRUE(co_await test::eventually([&] { return done == 9; }));
  }());
}

TEST(InferencePool, RetriesOn5xxOnAnotherServerAndOpensTheCircuit) {
  asio::io_context io;
  InferenceServerFake bad(io), good(io);
  bad.fail_with_status = 503;
  InferencePool pool(io, fast_options());
  for (auto* s : {&bad, &good}) pool.add_worker(s->url());
  run(io, [&]() -> asio::awaitable<void> {
    co_await pool.check_all();
    co_await expect_answered_by(pool, 6, good.url());
    auto st = pool.status();
    EXPECT_TRUE(status_of(st, bad.url()).circuit_open);
    EXPECT_EQ(status_of(st, bad.url()).failed, 2u);  // threshold reached, then no more traffic
    EXPECT_EQ(status_of(st, good.url()).completed, 6u);
    EXPECT_EQ(bad.received, 2);
  }());
}

// Moves time to the next health check once the loop waits for it (its one timer besides the
// deadlines of the requests `server` holds) and waits until `server`'s probe of that round began and
// every other probe of it answered, then until the pool counted the probe of `server` a failure
// (at once for a refusal; for a probe that gets no answer, `then` moves time past health_timeout).
asio::awaitable<void> next_health_check(FakeClock& clock, const InferencePool& pool, const InferenceServerFake& server,
                                        const PoolOptions& o, Duration then = {}) {
  const auto timers = [&] { return static_cast<std::size_t>(server.held) + 1; };
  EXPECT_TRUE(co_await test::eventually([&] { return clock.pending() == timers(); }));
  const int calls = server.health_calls;
  const auto failed = status_of(pool.status(), server.url()).failed;
  clock.advance(o.health_interval);
  EXPECT_TRUE(co_await test::eventually([&] { return server.health_calls > calls && clock.pending() == timers(); }));
  if (then.count() > 0) clock.advance(then);
  EXPECT_TRUE(co_await test::eventually([&] { return status_of(pool.status(), server.url()).failed > failed; }));
}

// One health round in which `dark`'s probe gets no answer: it times out and is counted.
asio::awaitable<void> probe_dark_until_it_times_out(FakeClock& clock, const InferencePool& pool,
                                                    const InferenceServerFake& dark, const PoolOptions& o) {
  co_await next_health_check(clock, pool, dark, o, o.health_timeout);
}

// A server that stops answering (here: it parks the request and its health checks fail, as a
// SIGSTOPped worker would look): once its circuit opens, the request waiting on it is cut off and
// answered by the other server, long before its deadline; the parked one never answers.
TEST_F(InferencePoolOnAFakeClock, ARequestOnAServerThatStopsAnsweringMovesToAnother) {
  InferenceServerFake stuck(io), good(io);
  auto& pool = make_pool(fast_options(), {&stuck, &good});
  run_once_healthy([&]() -> asio::awaitable<void> {
    stuck.hold = true;
    stuck.on_held = [&] { stuck.health_status = 503; };  // from now on it answers nothing useful
    // Requests alternate between the two (round robin among the least loaded): submit until one is
    // parked on the stuck server.
    std::optional<Result<Completion>> r;
    for (int i = 0; i < 20 && stuck.held == 0; ++i) {
      r.reset();
      asio::co_spawn(
          io, [&]() -> asio::awaitable<void> { r = co_await pool.submit(request("q"), std::chrono::seconds(300)); },
          asio::detached);
      EXPECT_TRUE(co_await test::eventually([&] { return r.has_value() || stuck.held == 1; }));
    }
    // Its next two health checks fail (failure_threshold): the circuit opens, the request moves.
    for (int check = 0; check < options.failure_threshold; ++check)
      co_await next_health_check(clock, pool, stuck, options);
    EXPECT_TRUE(co_await test::eventually([&] { return r.has_value(); }));
    EXPECT_EQ(stuck.held, 1);
    EXPECT_EQ(stuck.answered, 0);
    EXPECT_TRUE(r.has_value() && *r) << (r && !*r ? r->error().what() : "no result");
    if (r && *r) {
      EXPECT_EQ((*r)->worker, good.url());
      EXPECT_EQ((*r)->attempts, 2);
    }
    EXPECT_TRUE(status_of(pool.status(), stuck.url()).circuit_open);
  }());
}

PoolOptions silence_options() {
  PoolOptions o = fast_options();
  o.health_timeout = std::chrono::milliseconds(700);
  o.failure_threshold = 1000;  // only the silence rule can open a circuit
  return o;
}

// A server whose link goes dark (its requests and its health checks get no answer at all, as when
// a host's link is down): the first probe that times out while it holds requests opens its circuit
// (failure_threshold is out of reach here), the requests it held are answered by the other server,
// each exactly once, and the answers the dark server produces once it wakes up are dropped.
TEST_F(InferencePoolOnAFakeClock, AProbeTimeoutWhileRequestsWaitOpensTheCircuitAtOnceAndTheyMove) {
  InferenceServerFake dark(io), good(io);
  auto& pool = make_pool(silence_options(), {&dark, &good});
  constexpr int kRequests = 6;
  std::map<int, int> completions_per_request;
  std::map<std::string, int> served_by;
  int finished = 0, attempts = 0;
  run_once_healthy([&]() -> asio::awaitable<void> {
    go_dark(dark);
    for (int i = 0; i < kRequests; ++i)
      asio::co_spawn(
          io,
          [&, i]() -> asio::awaitable<void> {
            auto r = co_await pool.submit(request("q-" + std::to_string(i)), std::chrono::seconds(60));
            EXPECT_TRUE(r) << (r ? "" : r.error().what());
            if (r) {
              ++completions_per_request[i];
              ++served_by[r->worker];
              attempts += r->attempts;
            }
            ++finished;
          },
          asio::detached);
    // The good server answered its share; the dark one holds the rest.
    EXPECT_TRUE(co_await test::eventually([&] { return finished + dark.held == kRequests; }));
    EXPECT_GE(dark.held, 1);  // some went to it first
    co_await probe_dark_until_it_times_out(clock, pool, dark, options);
    EXPECT_TRUE(co_await test::eventually([&] { return finished == kRequests; }, std::chrono::seconds(30)));
    const auto st = pool.status();
    EXPECT_TRUE(status_of(st, dark.url()).circuit_open);
    EXPECT_TRUE(status_of(st, dark.url()).silent);
    EXPECT_EQ(status_of(st, dark.url()).outstanding, 0u);
    EXPECT_EQ(served_by[good.url()], kRequests);
    EXPECT_EQ(attempts, kRequests + dark.held);  // each held one took a second attempt
    // The dark server wakes up and answers what it held: too late, nobody counts it.
    dark.release_all();
    EXPECT_TRUE(co_await test::eventually([&] { return dark.answered == dark.held; }));
    co_await test::sleep_for(std::chrono::milliseconds(100));  // room for a (wrong) late answer to arrive
    EXPECT_EQ(completions_per_request.size(), static_cast<std::size_t>(kRequests));
    for (const auto& [i, n] : completions_per_request) EXPECT_EQ(n, 1) << "request " << i;
    const auto after = pool.status();
    EXPECT_EQ(status_of(after, dark.url()).completed, 0u);
    EXPECT_EQ(status_of(after, good.url()).completed, static_cast<std::uint64_t>(kRequests));
  }());
}

// A server that is slow (its health checks time out) but answers its requests keeps its circuit
// closed: a probe timeout counts as one failure only, since requests were answered meanwhile.
TEST_F(InferencePoolOnAFakeClock, ASlowServerThatAnswersItsRequestsDoesNotFlap) {
  InferenceServerFake slow(io);
  auto& pool = make_pool(silence_options(), {&slow});
  int done = 0, moved = 0;
  run_once_healthy([&]() -> asio::awaitable<void> {
    slow.health_delay = std::chrono::seconds(60);  // from now on no probe is answered in time
    for (int round = 0; round < 2; ++round) {
      // The health loop waits out its interval (its one timer: no request is in flight).
      EXPECT_TRUE(co_await test::eventually([&] { return clock.pending() == 1u; }));
      // Four callers submit one request after another while the next probe waits for its answer.
      bool stop = false;
      int callers = 4;
      for (int k = 0; k < 4; ++k)
        asio::co_spawn(
            io,
            [&]() -> asio::awaitable<void> {
              while (!stop) {
                auto r = co_await pool.submit(request("slow"), std::chrono::seconds(30));
                EXPECT_TRUE(r) << (r ? "" : r.error().what());
                if (r && r->attempts > 1) ++moved;
                ++done;
              }
              --callers;
            },
            asio::detached);
      // The probe begins...
      const int calls = slow.health_calls;
      clock.advance(options.health_interval);
      EXPECT_TRUE(co_await test::eventually([&] { return slow.health_calls > calls; }));
      // ... requests are answered while it waits, and it times out with requests in flight.
      const auto answered = status_of(pool.status(), slow.url()).completed;
      EXPECT_TRUE(
          co_await test::eventually([&] { return status_of(pool.status(), slow.url()).completed >= answered + 8; }));
      EXPECT_GT(status_of(pool.status(), slow.url()).outstanding, 0u);
      const auto failed = status_of(pool.status(), slow.url()).failed;
      clock.advance(options.health_timeout);
      EXPECT_TRUE(co_await test::eventually([&] { return status_of(pool.status(), slow.url()).failed > failed; }));
      stop = true;
      EXPECT_TRUE(co_await test::eventually([&] { return callers == 0; }));
    }
    const auto st = status_of(pool.status(), slow.url());
    EXPECT_EQ(st.failed, 2u);
    EXPECT_EQ(st.outstanding, 0u);
    EXPECT_FALSE(st.circuit_open);
    EXPECT_GT(st.completed, 0u);
    EXPECT_EQ(moved, 0);
  }());
}

// open_on_silence = false: a silent server with requests waiting is only counted, as before.
TEST_F(InferencePoolOnAFakeClock, WithoutOpenOnSilenceAProbeTimeoutOnlyCounts) {
  InferenceServerFake dark(io), good(io);
  auto silence_only_counts = silence_options();
  silence_only_counts.open_on_silence = false;
  auto& pool = make_pool(silence_only_counts, {&dark, &good});
  int finished = 0;
  run_once_healthy([&]() -> asio::awaitable<void> {
    go_dark(dark);
    for (int i = 0; i < 4; ++i)
      asio::co_spawn(
          io,
          [&, i]() -> asio::awaitable<void> {
            (void)co_await pool.submit(request("w-" + std::to_string(i)), std::chrono::seconds(60));
            ++finished;
          },
          asio::detached);
    EXPECT_TRUE(co_await test::eventually([&] { return finished + dark.held == 4; }));
    EXPECT_GE(dark.held, 1);
    co_await probe_dark_until_it_times_out(clock, pool, dark, options);
    co_await probe_dark_until_it_times_out(clock, pool, dark, options);
    const auto st = status_of(pool.status(), dark.url());
    EXPECT_EQ(st.failed, 2u);
    EXPECT_FALSE(st.circuit_open);
    EXPECT_TRUE(st.silent);
    EXPECT_EQ(st.outstanding, static_cast<std::size_t>(dark.held));
  }());
}

// A caller that gives up on a request (its deadline raced the submit, as the orchestrator does)
// cancels it cleanly, also when the pool runs on the caller's own io_context: no exception escapes
// the loop, and the server's slot is given back.
TEST_F(InferencePoolOnAFakeClock, ACancelledRequestEndsWithoutThrowing) {
  InferenceServerFake stuck(io);
  auto& pool = make_pool(fast_options(), {&stuck});
  Event parked(io);
  stuck.on_held = [&] { parked.set(); };
  // Once the health loop's first probe answered (check_all() would skip the probe it has in flight).
  run_once_healthy([&]() -> asio::awaitable<void> {
    stuck.hold = true;
    using namespace boost::asio::experimental::awaitable_operators;
    // The caller gives up 200 ms after it began; time moves once the request is parked.
    auto give_up = cancellable_sleep_until(io.get_executor(), clock, clock.now() + std::chrono::milliseconds(200));
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          co_await parked.wait();
          clock.advance(std::chrono::milliseconds(200));
        },
        asio::detached);
    auto raced = co_await (pool.submit(request("q"), std::chrono::seconds(300)) || std::move(give_up));
    EXPECT_EQ(raced.index(), 1u);  // the timer won; the submit was cancelled inside
    EXPECT_EQ(stuck.held, 1);
    EXPECT_EQ(status_of(pool.status(), stuck.url()).outstanding, 0u);
  }());
}

TEST_F(InferencePoolOnAFakeClock, RejectedRequestsAreNotRetriedAndDeadlinesHold) {
  InferenceServerFake a(io);
  // Not started: no health loop timer beside the request's deadline.
  auto& pool = make_pool(fast_options(), {&a}, /*start=*/false);
  Event parked(io);
  a.on_held = [&] { parked.set(); };
  run(io, [&]() -> asio::awaitable<void> {
    co_await pool.check_all();
    a.fail_with_status = 400;
    auto r = co_await pool.submit(request("x"), std::chrono::seconds(10));
    EXPECT_FALSE(r);
    if (!r) {
      EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
    }
    EXPECT_EQ(a.received, 1);
    a.fail_with_status = 0;
    a.hold = true;  // parked until the server closes: only the 300 ms deadline can end it
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          co_await parked.wait();
          clock.advance(std::chrono::milliseconds(299));
          EXPECT_EQ(clock.pending(), 1u);  // its deadline has not fired yet
          clock.advance(std::chrono::milliseconds(1));
        },
        asio::detached);
    r = co_await pool.submit(request("y"), std::chrono::milliseconds(300));
    EXPECT_FALSE(r);
    if (!r) {
      EXPECT_EQ(r.error().code(), ErrorCode::kTimeout) << r.error().what();
    }
  }());
}

TEST(InferencePool, ServersJoinAndLeaveAtRuntime) {
  asio::io_context io;
  InferenceServerFake a(io), b(io);
  InferencePool pool(io, fast_options());
  pool.add_worker(a.url());
  pool.start();
  run(io, [&]() -> asio::awaitable<void> {
    EXPECT_TRUE(co_await test::eventually([&] { return status_of(pool.status(), a.url()).healthy; }));
    pool.add_worker(b.url());
    EXPECT_TRUE(co_await test::eventually([&] { return status_of(pool.status(), b.url()).healthy; }));
    pool.remove_worker(a.url());
    EXPECT_EQ(pool.workers(), std::vector<std::string>{b.url()});
    co_await expect_answered_by(pool, 4, b.url());
    EXPECT_EQ(a.received, 0);
  }());
}

// The acceptance test: three servers, one killed while it holds requests. Every request completes
// exactly once on the survivors, and the killed server takes traffic again once it is back.
TEST(InferencePool, KeepsServingWhenOneOfThreeServersIsKilledMidRun) {
  asio::io_context io;
  InferenceServerFake a(io), b(io), victim(io);
  victim.hold = true;  // requests that reach it stay in flight until it dies
  Event victim_busy(io);
  victim.on_held = [&] {
    if (victim.held == 4) victim_busy.set();
  };
  InferencePool pool(io, fast_options());
  for (auto* s : {&a, &b, &victim}) pool.add_worker(s->url());
  std::vector<std::string> back;  // on_back: circuits that closed after they opened
  pool.on_back([&](const std::string& url) { back.push_back(url); });
  pool.start();

  constexpr int kRequests = 30;
  std::map<int, int> completions_per_request;
  std::map<std::string, int> served_by;
  int finished = 0;
  run(io, [&]() -> asio::awaitable<void> {
    EXPECT_TRUE(co_await all_healthy(pool));
    for (int i = 0; i < kRequests; ++i)
      asio::co_spawn(
          io,
          [&, i]() -> asio::awaitable<void> {
            auto r = co_await pool.submit(request("req-" + std::to_string(i), "group-" + std::to_string(i % 10)),
                                          std::chrono::seconds(30));
            EXPECT_TRUE(r) << (r ? "" : r.error().what());
            if (r) {
              EXPECT_EQ(r->choices.at(0).text, "echo:req-" + std::to_string(i));  // its own answer
              ++completions_per_request[i];
              ++served_by[r->worker];
            }
            ++finished;
          },
          asio::detached);
    co_await victim_busy.wait();
    const std::uint16_t victim_port = victim.port();
    victim.close();  // killed mid-run with four requests in flight

    EXPECT_TRUE(co_await test::eventually([&] { return finished == kRequests; }));
    EXPECT_EQ(completions_per_request.size(), static_cast<std::size_t>(kRequests));
    for (const auto& [i, n] : completions_per_request) EXPECT_EQ(n, 1) << "request " << i;
    EXPECT_EQ(served_by.count(victim.url()), 0u);
    EXPECT_EQ(a.answered + b.answered, kRequests);  // every answer produced once, by a survivor
    const auto st = pool.status();
    EXPECT_EQ(status_of(st, a.url()).completed + status_of(st, b.url()).completed,
              static_cast<std::uint64_t>(kRequests));
    EXPECT_FALSE(status_of(st, victim.url()).healthy);
    EXPECT_TRUE(back.empty());

    // Back on the same port: the pool probes it, closes the circuit (on_back says so, once) and
    // routes to it again.
    victim.hold = false;
    victim.start(victim_port);
    EXPECT_TRUE(co_await test::eventually([&] { return status_of(pool.status(), victim.url()).healthy; }));
    EXPECT_EQ(back, std::vector<std::string>{victim.url()});
    std::vector<asio::awaitable<Result<Completion>>> calls;
    for (int i = 0; i < 9; ++i)
      calls.push_back(pool.submit(request("after-" + std::to_string(i)), std::chrono::seconds(10)));
    auto results = co_await when_all(std::move(calls));
    int on_victim = 0;
    for (auto& r : results) {
      EXPECT_TRUE(r);
      if (r && r->worker == victim.url()) ++on_victim;
    }
    EXPECT_GT(on_victim, 0);
    EXPECT_EQ(victim.answered, on_victim);
  }());
}

}  // namespace
}  // namespace arlo::rollout
