// What users watch of a run besides the metrics (session/run_view.h): the records the live page
// polls, and the pace of the console's step lines with their ETA.
#include "session/run_view.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

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

}  // namespace
}  // namespace arlo::session
