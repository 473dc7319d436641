// What users watch of a run besides the metrics (session/run_view.h): the records the live page
// polls, and the pace of the console's step lines with their ETA; the multi-turn figures the
// Reporter (session/reporter.h) writes in its step records.
#include "session/run_view.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>

#include "common/async/fake_clock.h"
#include "common/metrics.h"
#include "session/reporter.h"

namespace arlo::session {
namespace {

TEST(Records, TheLogKeepsItsNewestRecordsAndCountsOn) {
  RecordLog log(3);
  for (int i = 0; i < 5; ++i) log.append(nlohmann::json{{"i", i}}.dump());
  EXPECT_EQ(log.next(), 5u);
  auto all = nlohmann::json::parse(log.since(0));
  EXPECT_EQ(all.at("next").get<int>(), 5);
  ASSERT_EQ(all.at("records").size(), 3u);
  EXPECT_EQ(all.at("records")[0].at("i").get<int>(), 2);  // the two oldest were dropped
  auto tail = nlohmann::json::parse(log.since(4));
  ASSERT_EQ(tail.at("records").size(), 1u);
  EXPECT_EQ(tail.at("records")[0].at("i").get<int>(), 4);
  EXPECT_EQ(nlohmann::json::parse(log.since(5)).at("records").size(), 0u);
  EXPECT_EQ(nlohmann::json::parse(log.since(9)).at("next").get<int>(),
            9);  // a poller ahead of the log waits where it is
  auto page = nlohmann::json::parse(log.since(2, 2));
  EXPECT_EQ(page.at("records").size(), 2u);
  EXPECT_EQ(page.at("next").get<int>(), 4);
}

TEST(Console, StepLinesArePacedAndTheEtaFollowsThePace) {
  StepLinePacer p(5.0);
  std::vector<std::int64_t> printed;
  // 4 steps per second, RL starting at step 31; 100 steps in all.
  for (std::int64_t s = 1; s <= 100; ++s)
    if (p.due(0.25 * static_cast<double>(s), s, 100, s == 31)) printed.push_back(s);
  EXPECT_EQ(printed, (std::vector<std::int64_t>{1, 21, 31, 51, 71, 91, 100}));
  EXPECT_NEAR(p.eta_seconds(50, 100), 12.5, 1e-9);
  StepLinePacer every(0.0);
  for (std::int64_t s = 1; s <= 5; ++s) EXPECT_TRUE(every.due(0.0, s, 5, false));
  EXPECT_LT(StepLinePacer(1.0).eta_seconds(1, 10), 0.0);  // unknown before two steps
  EXPECT_EQ(progress_prefix(25, 100, 192.0), "[#####...............]  25% ETA 3m12s ");
  EXPECT_EQ(progress_prefix(100, 100, -1.0), "[####################] 100% ");
  EXPECT_EQ(progress_prefix(1, 2, 7300.0), "[##########..........]  50% ETA 2h01m ");
}

// The step records of a Reporter without a run dir or status port (what GET /api/records serves).
std::vector<nlohmann::json> step_records(const Reporter& reporter) {
  std::vector<nlohmann::json> out;
  const auto all = nlohmann::json::parse(reporter.records().since(0));
  for (const auto& r : all.at("records"))
    if (r.at("kind") == "step") out.push_back(r);
  return out;
}

orch::StepObservation step(std::int64_t n, std::uint64_t model_turns, std::uint64_t trajectories,
                           std::uint64_t env_failed) {
  orch::StepObservation s;
  s.report.step = n;
  s.model_turns = model_turns;
  s.trajectories = trajectories;
  s.env_failed = env_failed;
  s.ledger = {{"dispatched", 0}, {"in_flight", 0}, {"dispositions", nlohmann::json::object()}};
  return s;
}

TEST(Reporter, MultiTurnStepRecordsCarryTurnsPerTrajectoryAndTheFailureCounts) {
  boost::asio::io_context io;
  FakeClock clock;
  orch::Options opt;
  opt.console = false;
  opt.status_port = -1;
  metrics::Registry registry;
  Reporter reporter(io, clock, opt, &registry);
  reporter.on_start({});
  reporter.on_step(step(1, 10, 4, 0));  // 10 model turns, 4 trajectories ended: 2.5 turns each
  registry.counter("multi_turn/split").inc(3);
  reporter.on_step(step(2, 13, 4, 1));  // none ended since: no turns_mean; its 3 turns count next
  auto third = step(3, 19, 6, 2);       // (19 - 10) turns over (6 - 4) trajectories
  third.ended_because = {{"malformed_tool_call", 2}};
  reporter.on_step(third);
  const auto recs = step_records(reporter);
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_DOUBLE_EQ(recs[0].at("multi_turn/turns_mean").get<double>(), 2.5);
  EXPECT_FALSE(recs[1].contains("multi_turn/turns_mean"));
  EXPECT_DOUBLE_EQ(recs[2].at("multi_turn/turns_mean").get<double>(), 4.5);
  EXPECT_EQ(recs[0].at("multi_turn/env_failed"), 0);
  EXPECT_EQ(recs[2].at("multi_turn/env_failed"), 2);  // cumulative
  EXPECT_EQ(recs[0].at("multi_turn/split"), 0);
  EXPECT_EQ(recs[2].at("multi_turn/split"), 3);
  EXPECT_FALSE(recs[0].contains("multi_turn/ended/malformed_tool_call"));
  EXPECT_EQ(recs[2].at("multi_turn/ended/malformed_tool_call"), 2);
  // The counter stays a counter in /metrics (the records' other figures become gauges).
  EXPECT_NE(registry.prometheus().find("arlo_multi_turn_split 3"), std::string::npos) << registry.prometheus();
  EXPECT_DOUBLE_EQ(registry.gauge("multi_turn/turns_mean").value(), 4.5);

  // A single-turn run's records have none of them.
  Reporter single(io, clock, opt, nullptr);
  single.on_start({});
  single.on_step(step(1, 0, 0, 0));
  const auto plain = step_records(single);
  ASSERT_EQ(plain.size(), 1u);
  for (const auto& [k, v] : plain[0].items()) EXPECT_EQ(k.rfind("multi_turn/", 0), std::string::npos) << k;
}

}  // namespace
}  // namespace arlo::session
