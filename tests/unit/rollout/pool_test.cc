// HttpInferencePool against real local HTTP servers: routing, affinity, retries, circuit breaking,
// servers leaving and joining, and a server killed mid-run.
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
#include "tests/unit/rollout/rollout_test_util.h"

namespace arlo::rollout {
namespace {

using arlo::FakeClock;
using test::Event;
using test::FakeOpenAIServer;
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

const ServerStatus& status_of(const std::vector<ServerStatus>& all, const std::string& url) {
  for (const auto& s : all)
    if (s.url == url) return s;
  throw std::runtime_error("no server " + url);
}

TEST(InferencePool, ParsesCompletionsAndRoutesGroupsByAffinity) {
  asio::io_context io;
  FakeOpenAIServer a(io), b(io);
  a.version = 3;
  HttpInferencePool pool(io, fast_options());
  pool.add_server(a.url());
  pool.add_server(b.url() + "/");
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
      if (r) servers.insert(r->server);
    }
    EXPECT_EQ(servers.size(), 1u);
  }());
  pool.stop();
  a.close();
  b.close();
  // No drain: closed servers may still have queued handlers; the io_context destroys them.
}

TEST(InferencePool, LeastOutstandingSpreadsLoadAcrossServers) {
  asio::io_context io;
  FakeOpenAIServer a(io), b(io), c(io);
  for (auto* s : {&a, &b, &c}) s->hold = true;
  Event all_held(io);
  int held = 0;
  for (auto* s : {&a, &b, &c})
    s->on_held = [&] {
      if (++held == 9) all_held.set();
    };
  HttpInferencePool pool(io, fast_options());
  for (auto* s : {&a, &b, &c}) pool.add_server(s->url());
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
  pool.stop();
  for (auto* s : {&a, &b, &c}) s->close();
  // No drain: closed servers may still have queued handlers; the io_context destroys them.
}

TEST(InferencePool, RetriesOn5xxOnAnotherServerAndOpensTheCircuit) {
  asio::io_context io;
  FakeOpenAIServer bad(io), good(io);
  bad.fail_with_status = 503;
  HttpInferencePool pool(io, fast_options());
  pool.add_server(bad.url());
  pool.add_server(good.url());
  run(io, [&]() -> asio::awaitable<void> {
    co_await pool.check_all();
    for (int i = 0; i < 6; ++i) {
      auto r = co_await pool.submit(request("x"), std::chrono::seconds(10));
      EXPECT_TRUE(r);
      if (r) {
        EXPECT_EQ(r->server, good.url());
      }
    }
    auto st = pool.status();
    EXPECT_TRUE(status_of(st, bad.url()).circuit_open);
    EXPECT_EQ(status_of(st, bad.url()).failed, 2u);  // threshold reached, then no more traffic
    EXPECT_EQ(status_of(st, good.url()).completed, 6u);
    EXPECT_EQ(bad.received, 2);
  }());
  pool.stop();
  bad.close();
  good.close();
  // No drain: closed servers may still have queued handlers; the io_context destroys them.
}

// A server that stops answering (here: it parks the request and its health checks fail, as a
// SIGSTOPped worker would look): once its circuit opens, the request waiting on it is cut off and
// answered by the other server, long before its deadline; the parked one never answers.
TEST(InferencePool, ARequestOnAServerThatStopsAnsweringMovesToAnother) {
  asio::io_context io;
  FakeOpenAIServer stuck(io), good(io);
  HttpInferencePool pool(io, fast_options());
  pool.add_server(stuck.url());
  pool.add_server(good.url());
  pool.start();
  run(io, [&]() -> asio::awaitable<void> {
    co_await pool.check_all();
    stuck.hold = true;
    stuck.on_held = [&] { stuck.health_status = 503; };  // from now on it answers nothing useful
    // Requests alternate between the two (round robin among the least loaded): submit until one is
    // parked on the stuck server.
    std::optional<Result<Completion>> r;
    auto parked = [&]() -> asio::awaitable<void> { r = co_await pool.submit(request("q"), std::chrono::seconds(300)); };
    for (int i = 0; i < 20 && stuck.held == 0; ++i) {
      r.reset();
      co_await parked();
    }
    EXPECT_EQ(stuck.held, 1);
    EXPECT_EQ(stuck.answered, 0);
    EXPECT_TRUE(r.has_value() && *r) << (r && !*r ? r->error().what() : "no result");
    if (r && *r) {
      EXPECT_EQ((*r)->server, good.url());
      EXPECT_EQ((*r)->attempts, 2);
    }
    EXPECT_TRUE(status_of(pool.status(), stuck.url()).circuit_open);
  }());
  pool.stop();
  stuck.close();
  good.close();
}

// A server whose link goes dark (its requests and its health checks get no answer at all, as when
// a host's link is down): the first probe that times out while it holds requests opens its circuit
// (failure_threshold is out of reach here), the requests it held are answered by the other server,
// each exactly once, and the answers the dark server produces once it wakes up are dropped.
// Until every server passed a health check (the loop's first probe of each is in flight at start).
asio::awaitable<bool> all_healthy(const HttpInferencePool& pool) {
  co_return co_await test::eventually([&] {
    for (const auto& s : pool.status())
      if (!s.healthy) return false;
    return true;
  });
}

// One health round on a FakeClock in which `dark`'s probe gets no answer: moves time to the next
// health check once the loop waits for it, waits until every other probe of the round answered
// (only `dark`'s probe and the requests `dark` holds still have deadline timers), then moves time
// past health_timeout and waits until the pool counted the timeout.
asio::awaitable<void> probe_dark_until_it_times_out(FakeClock& clock, const HttpInferencePool& pool,
                                                    const FakeOpenAIServer& dark, const PoolOptions& o) {
  // The health loop waits out its interval (the one timer besides the held requests' deadlines).
  EXPECT_TRUE(co_await test::eventually([&] { return clock.pending() == static_cast<std::size_t>(dark.held) + 1; }));
  const int calls = dark.health_calls;
  clock.advance(o.health_interval);
  EXPECT_TRUE(co_await test::eventually(
      [&] { return dark.health_calls > calls && clock.pending() == static_cast<std::size_t>(dark.held) + 1; }));
  const auto failed = status_of(pool.status(), dark.url()).failed;
  clock.advance(o.health_timeout);
  EXPECT_TRUE(co_await test::eventually([&] { return status_of(pool.status(), dark.url()).failed > failed; }));
}

PoolOptions silence_options() {
  PoolOptions o = fast_options();
  o.health_timeout = std::chrono::milliseconds(700);
  o.failure_threshold = 1000;  // only the silence rule can open a circuit
  return o;
}

// The clock is declared before the io_context: coroutines the context destroys still hold timers
// of it.
TEST(InferencePool, AProbeTimeoutWhileRequestsWaitOpensTheCircuitAtOnceAndTheyMove) {
  FakeClock clock;
  asio::io_context io;
  FakeOpenAIServer dark(io), good(io);
  auto o = silence_options();
  o.clock = &clock;
  HttpInferencePool pool(io, o);
  pool.add_server(dark.url());
  pool.add_server(good.url());
  pool.start();
  constexpr int kRequests = 6;
  std::map<int, int> completions_per_request;
  std::map<std::string, int> served_by;
  int finished = 0, attempts = 0;
  run(io, [&]() -> asio::awaitable<void> {
    EXPECT_TRUE(co_await all_healthy(pool));       // the health loop's first probes answered
    dark.hold = true;                              // its requests get no answer
    dark.health_delay = std::chrono::seconds(60);  // nor its health checks
    for (int i = 0; i < kRequests; ++i)
      asio::co_spawn(
          io,
          [&, i]() -> asio::awaitable<void> {
            auto r = co_await pool.submit(request("q-" + std::to_string(i)), std::chrono::seconds(60));
            EXPECT_TRUE(r) << (r ? "" : r.error().what());
            if (r) {
              ++completions_per_request[i];
              ++served_by[r->server];
              attempts += r->attempts;
            }
            ++finished;
          },
          asio::detached);
    // The good server answered its share; the dark one holds the rest.
    EXPECT_TRUE(co_await test::eventually([&] { return finished + dark.held == kRequests; }));
    EXPECT_GE(dark.held, 1);  // some went to it first
    co_await probe_dark_until_it_times_out(clock, pool, dark, o);
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
  pool.stop();
  dark.close();
  good.close();
}

// A server that is slow (its health checks time out) but answers its requests keeps its circuit
// closed: a probe timeout counts as one failure only, since requests were answered meanwhile.
TEST(InferencePool, ASlowServerThatAnswersItsRequestsDoesNotFlap) {
  asio::io_context io;
  FakeOpenAIServer slow(io);
  HttpInferencePool pool(io, silence_options());
  pool.add_server(slow.url());
  pool.start();
  int done = 0, moved = 0;
  run(io, [&]() -> asio::awaitable<void> {
    EXPECT_TRUE(co_await all_healthy(pool));              // the health loop's first probes answered
    slow.health_delay = std::chrono::milliseconds(2000);  // every probe times out (700 ms)
    slow.answer_delay = std::chrono::milliseconds(100);   // while its requests take 100 ms each
    bool stop = false;
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
          },
          asio::detached);
    // Until two probes timed out with requests in flight.
    EXPECT_TRUE(co_await test::eventually([&] { return status_of(pool.status(), slow.url()).failed >= 2; }));
    stop = true;
    EXPECT_TRUE(co_await test::eventually([&] { return status_of(pool.status(), slow.url()).outstanding == 0; }));
    const auto st = status_of(pool.status(), slow.url());
    EXPECT_FALSE(st.circuit_open);
    EXPECT_GT(st.completed, 0u);
    EXPECT_EQ(moved, 0);
  }());
  pool.stop();
  slow.close();
}

// open_on_silence = false: a silent server with requests waiting is only counted, as before.
TEST(InferencePool, WithoutOpenOnSilenceAProbeTimeoutOnlyCounts) {
  FakeClock clock;
  asio::io_context io;
  FakeOpenAIServer dark(io), good(io);
  auto o = silence_options();
  o.open_on_silence = false;
  o.clock = &clock;
  HttpInferencePool pool(io, o);
  pool.add_server(dark.url());
  pool.add_server(good.url());
  pool.start();
  int finished = 0;
  run(io, [&]() -> asio::awaitable<void> {
    EXPECT_TRUE(co_await all_healthy(pool));  // the health loop's first probes answered
    dark.hold = true;
    dark.health_delay = std::chrono::seconds(60);
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
    co_await probe_dark_until_it_times_out(clock, pool, dark, o);
    co_await probe_dark_until_it_times_out(clock, pool, dark, o);
    const auto st = status_of(pool.status(), dark.url());
    EXPECT_EQ(st.failed, 2u);
    EXPECT_FALSE(st.circuit_open);
    EXPECT_TRUE(st.silent);
    EXPECT_EQ(st.outstanding, static_cast<std::size_t>(dark.held));
  }());
  pool.stop();
  dark.close();
  good.close();
}

// A caller that gives up on a request (its deadline raced the submit, as the orchestrator does)
// cancels it cleanly, also when the pool runs on the caller's own io_context: no exception escapes
// the loop, and the server's slot is given back.
TEST(InferencePool, ACancelledRequestEndsWithoutThrowing) {
  FakeClock clock;
  asio::io_context io;
  FakeOpenAIServer stuck(io);
  auto o = fast_options();
  o.clock = &clock;
  HttpInferencePool pool(io, o);
  pool.add_server(stuck.url());
  pool.start();
  Event parked(io);
  stuck.on_held = [&] { parked.set(); };
  run(io, [&]() -> asio::awaitable<void> {
    // The health loop's first probe (check_all() would skip the probe it has in flight).
    EXPECT_TRUE(co_await all_healthy(pool));
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
  pool.stop();
  stuck.close();
}

TEST(InferencePool, RejectedRequestsAreNotRetriedAndDeadlinesHold) {
  FakeClock clock;
  asio::io_context io;
  FakeOpenAIServer a(io);
  auto o = fast_options();
  o.clock = &clock;
  HttpInferencePool pool(io, o);
  Event parked(io);
  a.on_held = [&] { parked.set(); };
  pool.add_server(a.url());
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
  pool.stop();
  a.close();
  // No drain: closed servers may still have queued handlers; the io_context destroys them.
}

TEST(InferencePool, ServersJoinAndLeaveAtRuntime) {
  asio::io_context io;
  FakeOpenAIServer a(io), b(io);
  HttpInferencePool pool(io, fast_options());
  pool.add_server(a.url());
  pool.start();
  run(io, [&]() -> asio::awaitable<void> {
    EXPECT_TRUE(co_await test::eventually([&] { return status_of(pool.status(), a.url()).healthy; }));
    pool.add_server(b.url());
    EXPECT_TRUE(co_await test::eventually([&] { return status_of(pool.status(), b.url()).healthy; }));
    pool.remove_server(a.url());
    EXPECT_EQ(pool.servers(), std::vector<std::string>{b.url()});
    for (int i = 0; i < 4; ++i) {
      auto r = co_await pool.submit(request("x"), std::chrono::seconds(10));
      EXPECT_TRUE(r);
      if (r) {
        EXPECT_EQ(r->server, b.url());
      }
    }
    EXPECT_EQ(a.received, 0);
  }());
  pool.stop();
  a.close();
  b.close();
  // No drain: closed servers may still have queued handlers; the io_context destroys them.
}

// The acceptance test: three servers, one killed while it holds requests. Every request completes
// exactly once on the survivors, and the killed server takes traffic again once it is back.
TEST(InferencePool, KeepsServingWhenOneOfThreeServersIsKilledMidRun) {
  asio::io_context io;
  FakeOpenAIServer a(io), b(io), victim(io);
  victim.hold = true;  // requests that reach it stay in flight until it dies
  Event victim_busy(io);
  victim.on_held = [&] {
    if (victim.held == 4) victim_busy.set();
  };
  HttpInferencePool pool(io, fast_options());
  for (auto* s : {&a, &b, &victim}) pool.add_server(s->url());
  pool.start();

  constexpr int kRequests = 30;
  std::map<int, int> completions_per_request;
  std::map<std::string, int> served_by;
  int finished = 0;
  run(io, [&]() -> asio::awaitable<void> {
    EXPECT_TRUE(co_await test::eventually([&] {
      for (const auto& s : pool.status())
        if (!s.healthy) return false;
      return true;
    }));
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
              ++served_by[r->server];
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

    // Back on the same port: the pool probes it, closes the circuit and routes to it again.
    victim.hold = false;
    victim.start(victim_port);
    EXPECT_TRUE(co_await test::eventually([&] { return status_of(pool.status(), victim.url()).healthy; }));
    std::vector<asio::awaitable<Result<Completion>>> calls;
    for (int i = 0; i < 9; ++i)
      calls.push_back(pool.submit(request("after-" + std::to_string(i)), std::chrono::seconds(10)));
    auto results = co_await when_all(std::move(calls));
    int on_victim = 0;
    for (auto& r : results) {
      EXPECT_TRUE(r);
      if (r && r->server == victim.url()) ++on_victim;
    }
    EXPECT_GT(on_victim, 0);
    EXPECT_EQ(victim.answered, on_victim);
  }());
  pool.stop();
  for (auto* s : {&a, &b, &victim}) s->close();
  // No drain: closed servers may still have queued handlers; the io_context destroys them.
}

}  // namespace
}  // namespace arlo::rollout
