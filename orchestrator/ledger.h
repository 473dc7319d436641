#pragma once
// Exactly-once accounting of rollouts (docs/architecture.md, "Exactly-once accounting"). A rollout is one sample:
// dispatching a group of n dispatches n rollouts. Each ends exactly once as completed, failed (reason) or cancelled
// (reason); each completed one is then disposed of exactly once (trained, filtered, stale, ...), or is still held by a
// sink. Invariants, checked by check():
//   dispatched == completed + failed + cancelled + in_flight
//   completed  == sum(dispositions) + held
// Owned by the Orchestrator; used only on the io_context thread.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>

#include "common/result.h"

namespace arlo::orch {

class Ledger {
 public:
  void dispatched(std::uint64_t n = 1) {
    dispatched_ += n;
    in_flight_ += n;
  }
  void completed(std::uint64_t n = 1);
  void failed(const std::string& reason, std::uint64_t n = 1);
  void cancelled(const std::string& reason, std::uint64_t n = 1);
  // A completed rollout was handed to a sink, or left it.
  void dispose(const std::string& disposition, std::uint64_t n = 1);

  std::uint64_t dispatched_total() const { return dispatched_; }
  std::uint64_t completed_total() const { return completed_; }
  std::uint64_t failed_total() const;
  std::uint64_t cancelled_total() const;
  std::uint64_t in_flight() const { return in_flight_; }
  std::uint64_t held() const { return completed_ - disposed_total(); }
  std::uint64_t disposed(const std::string& disposition) const;
  std::uint64_t disposed_total() const;
  const std::map<std::string, std::uint64_t>& failed_by_reason() const { return failed_; }
  const std::map<std::string, std::uint64_t>& cancelled_by_reason() const { return cancelled_; }
  const std::map<std::string, std::uint64_t>& dispositions() const { return dispositions_; }

  // kInternal naming the broken invariant, or ok.
  Status check() const;

  nlohmann::json to_json() const;
  // Restores counters saved by to_json() in a previous process. Rollouts that were in flight or
  // held then cannot continue: they are closed as cancelled("resume") / disposed("lost_on_resume"),
  // so the invariants hold across the restart.
  static Result<Ledger> from_json_for_resume(const nlohmann::json& j);

 private:
  void end_flight(std::uint64_t n);
  std::uint64_t dispatched_ = 0;
  std::uint64_t completed_ = 0;
  std::uint64_t in_flight_ = 0;
  std::map<std::string, std::uint64_t> failed_;
  std::map<std::string, std::uint64_t> cancelled_;
  std::map<std::string, std::uint64_t> dispositions_;
};

}  // namespace arlo::orch
