#include "session/run_view.h"

#include <fmt/format.h>

#include <algorithm>

namespace arlo::session {

void RecordLog::append(std::string record_json) {
  records_.push_back(std::move(record_json));
  while (records_.size() > capacity_) {
    records_.pop_front();
    ++first_;
  }
}

std::string RecordLog::since(std::uint64_t since, std::size_t max_records) const {
  std::string records;
  std::uint64_t i = std::max(since, first_);
  for (std::size_t n = 0; i < next() && n < max_records; ++i, ++n) {
    if (n > 0) records += ',';
    records += records_[i - first_];
  }
  return fmt::format("{{\"next\":{},\"records\":[{}]}}", std::max(i, since), records);
}

nlohmann::json WorkerState::to_json(const std::string& worker) const {
  return {{"worker", worker},   {"version", version == kNoVersion ? nlohmann::json() : nlohmann::json(version)},
          {"healthy", healthy}, {"last_error", last_error},
          {"syncs", syncs},     {"failures", failures}};
}

bool StepLinePacer::due(double now_s, std::int64_t step, std::int64_t max_steps, bool phase_changed) {
  constexpr std::size_t kWindow = 20;
  recent_.push_back(now_s);
  if (recent_.size() > kWindow + 1) recent_.pop_front();
  const bool first = last_printed_s_ < 0;
  if (first || phase_changed || step >= max_steps || interval_s_ <= 0 || now_s - last_printed_s_ >= interval_s_) {
    last_printed_s_ = now_s;
    return true;
  }
  return false;
}

double StepLinePacer::eta_seconds(std::int64_t step, std::int64_t max_steps) const {
  if (recent_.size() < 2) return -1.0;
  const double per_step = (recent_.back() - recent_.front()) / static_cast<double>(recent_.size() - 1);
  return per_step * static_cast<double>(std::max<std::int64_t>(0, max_steps - step));
}

std::string progress_prefix(std::int64_t step, std::int64_t total, double eta_s) {
  constexpr int kWidth = 20;
  const int filled = total > 0 ? static_cast<int>(kWidth * std::clamp<std::int64_t>(step, 0, total) / total) : 0;
  const int percent = total > 0 ? static_cast<int>(100 * std::clamp<std::int64_t>(step, 0, total) / total) : 0;
  std::string eta;
  if (eta_s >= 0) {
    const auto s = static_cast<long long>(eta_s + 0.5);
    eta = s >= 3600 ? fmt::format(" ETA {}h{:02}m", s / 3600, s / 60 % 60)
                    : fmt::format(" ETA {}m{:02}s", s / 60, s % 60);
  }
  return fmt::format("[{}{}] {:3}%{} ", std::string(filled, '#'), std::string(kWidth - filled, '.'), percent, eta);
}

}  // namespace arlo::session
