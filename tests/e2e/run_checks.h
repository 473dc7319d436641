#pragma once
// Checks of what a finished `arlo run` wrote, for the tests that drive whole runs (tests/e2e,
// tests/cluster): the ledger's exactly-once accounting, every step trained and every worker on the
// trainer's final weights, and what a fault cost (printed for docs/reliability.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "testing/process.h"

namespace arlo::e2e {

// Extra --set overrides for a test's runs, from ARLO_E2E_SET ("key=value;key=value"), for measuring the
// tests under other settings by hand (e.g. ARLO_E2E_SET=trainer.lr=0 shows a learning test fail).
inline std::vector<std::string> extra_sets() {
  std::vector<std::string> out;
  const char* env = std::getenv("ARLO_E2E_SET");
  std::stringstream ss(env ? env : "");
  for (std::string item; std::getline(ss, item, ';');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// The sum of a ledger's per-reason counts ({"timeout": 2, "error": 1} is 3).
inline std::uint64_t sum_counts(const nlohmann::json& counts) {
  std::uint64_t s = 0;
  for (const auto& [reason, n] : counts.items()) s += n.get<std::uint64_t>();
  return s;
}

// The ledger (summary.json "ledger") counts every rollout once: none is left in flight, every
// dispatched one completed, failed or was cancelled, and every completed one has one disposition.
// Returns how many completed.
inline std::uint64_t expect_ledger_adds_up(const nlohmann::json& ledger) {
  const auto completed = ledger.at("completed").get<std::uint64_t>();
  EXPECT_EQ(ledger.at("in_flight").get<std::uint64_t>(), 0u) << ledger.dump(2);
  EXPECT_EQ(ledger.at("dispatched").get<std::uint64_t>(),
            completed + sum_counts(ledger.at("failed")) + sum_counts(ledger.at("cancelled")))
      << ledger.dump(2);
  EXPECT_EQ(sum_counts(ledger.at("dispositions")), completed) << ledger.dump(2);
  return completed;
}

// A run that trained all its `steps`: summary.json says ok and `steps`, the ledger adds up, the
// trainer ends on version `steps` with a checksum and each of the `workers` workers holds that
// version with the trainer's checksum; metrics.jsonl in `run_dir` has one step record per step, in
// order.
inline void expect_every_step_trained(const nlohmann::json& summary, const std::filesystem::path& run_dir, int steps,
                                      std::size_t workers) {
  if (!summary.contains("ledger")) {
    ADD_FAILURE() << "no ledger in summary.json: " << summary.dump(2);
    return;
  }
  EXPECT_TRUE(summary.value("ok", false)) << summary.dump(2);
  EXPECT_EQ(summary.value("steps", 0), steps) << summary.dump(2);
  expect_ledger_adds_up(summary.at("ledger"));
  const auto& trainer = summary.at("trainer");
  const auto checksum = trainer.value("checksum", std::string());
  EXPECT_EQ(trainer.value("version", -1), steps) << summary.dump(2);
  EXPECT_FALSE(checksum.empty()) << summary.dump(2);
  EXPECT_EQ(summary.at("workers").size(), workers) << summary.dump(2);
  for (const auto& [name, w] : summary.at("workers").items()) {
    EXPECT_FALSE(w.contains("error")) << name << ": " << w.dump();
    EXPECT_EQ(w.value("version", -1), steps) << name << ": " << w.dump();
    EXPECT_EQ(w.value("checksum", std::string()), checksum) << name << " holds other weights than the trainer's";
  }
  std::vector<int> recorded, expected;
  for (const auto& j : read_jsonl(run_dir / "metrics.jsonl"))
    if (j.value("kind", "") == "step") recorded.push_back(j.at("step").get<int>());
  for (int i = 1; i <= steps; ++i) expected.push_back(i);
  EXPECT_EQ(recorded, expected) << "one step record per step, in order";
}

// Prints what a fault cost: the longest RL step of metrics.jsonl in `run_dir` against the median
// one, and the ledger's rollouts (the fault tests' figures for docs/reliability.md).
inline void print_fault_cost(const char* fault, const std::filesystem::path& run_dir, const nlohmann::json& summary) {
  std::vector<double> seconds;
  for (const auto& j : read_jsonl(run_dir / "metrics.jsonl"))
    if (j.value("kind", "") == "step" && !j.value("train/supervised", false))
      seconds.push_back(j.value("time/step_seconds", 0.0));
  if (seconds.empty() || !summary.contains("ledger")) return;
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2], longest = seconds.back();
  const auto& ledger = summary.at("ledger");
  std::printf(
      "cost of %s: longest RL step %.2f s vs median %.2f s (about %.2f s lost); rollouts dispatched %llu, "
      "failed %s, cancelled %s; run %.1f s\n",
      fault, longest, median, longest - median,
      static_cast<unsigned long long>(ledger.at("dispatched").get<std::uint64_t>()), ledger.at("failed").dump().c_str(),
      ledger.at("cancelled").dump().c_str(), summary.value("seconds", 0.0));
}

}  // namespace arlo::e2e
