#pragma once
// What users watch of a running orchestrator, apart from the metrics registry:
// - RecordLog: the run's records (the lines written to metrics.jsonl), kept in memory as their JSON
//   text so that the status port can serve them to the live run page (`GET /api/records?since=N`)
//   without re-encoding. Bounded: past `capacity` (about 1 KB each) the oldest records are dropped
//   (the file keeps them all); indices keep counting.
// - WorkerState: what each worker holds and how its last weight update went (`GET /api/status`).
// - StepLinePacer: which step lines the console prints (at most one per `interval_s`, plus the first
//   and the last step and the first step of each phase) and the ETA shown with the progress bar.
//
// Threading: the orchestrator's io_context thread only.
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>

#include "orchestrator/types.h"

namespace arlo::session {

class RecordLog {
 public:
  explicit RecordLog(std::size_t capacity = 50000) : capacity_(capacity) {}
  void append(std::string record_json);  // one JSON object
  // JSON text {"next": M, "records": [...]}: the kept records with index >= since, at most
  // max_records of them; M is the index after the last one returned (poll again with since = M).
  std::string since(std::uint64_t since, std::size_t max_records = 5000) const;
  std::uint64_t next() const { return first_ + records_.size(); }

 private:
  std::size_t capacity_;
  std::uint64_t first_ = 0;  // index of records_.front()
  std::deque<std::string> records_;
};

struct WorkerState {
  Version version = kNoVersion;  // the newest version this worker took
  bool healthy = true;           // its last update went through
  std::string last_error;
  std::uint64_t syncs = 0;     // updates it took
  std::uint64_t failures = 0;  // updates it failed
  nlohmann::json to_json(const std::string& worker) const;
};

class StepLinePacer {
 public:
  explicit StepLinePacer(double interval_s) : interval_s_(interval_s) {}
  // Whether the line of `step` is printed. Call once per step, in order.
  bool due(double now_s, std::int64_t step, std::int64_t max_steps, bool phase_changed);
  // Seconds to max_steps at the recent pace (mean over the last steps); negative when unknown.
  double eta_seconds(std::int64_t step, std::int64_t max_steps) const;

 private:
  double interval_s_;
  double last_printed_s_ = -1.0;
  std::deque<double> recent_;  // times of the last steps
};

// "[#####...............] 25% ETA 3m12s " (the ETA only when known).
std::string progress_prefix(std::int64_t step, std::int64_t total, double eta_s);

}  // namespace arlo::session
