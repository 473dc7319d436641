#include "orchestrator/ledger.h"

#include <fmt/format.h>

#include <cstdlib>

#include "common/log.h"

namespace arlo::orch {

namespace {
std::uint64_t sum(const std::map<std::string, std::uint64_t>& m) {
  std::uint64_t s = 0;
  for (const auto& [k, v] : m) s += v;
  return s;
}
}  // namespace

void Ledger::end_flight(std::uint64_t n) {
  if (n > in_flight_) {
    // Ending more rollouts than are in flight is a double count: a bug we must not hide.
    ARLO_ERROR("ledger: ending {} rollouts with only {} in flight (double accounting)", n, in_flight_);
    std::abort();
  }
  in_flight_ -= n;
}

void Ledger::completed(std::uint64_t n) {
  end_flight(n);
  completed_ += n;
}
void Ledger::failed(const std::string& reason, std::uint64_t n) {
  end_flight(n);
  failed_[reason] += n;
}
void Ledger::cancelled(const std::string& reason, std::uint64_t n) {
  end_flight(n);
  cancelled_[reason] += n;
}

void Ledger::dispose(const std::string& disposition, std::uint64_t n) {
  if (disposed_total() + n > completed_) {
    ARLO_ERROR("ledger: disposing {} as {} but only {} completed rollouts are held", n, disposition, held());
    std::abort();
  }
  dispositions_[disposition] += n;
}

std::uint64_t Ledger::failed_total() const { return sum(failed_); }
std::uint64_t Ledger::cancelled_total() const { return sum(cancelled_); }
std::uint64_t Ledger::disposed_total() const { return sum(dispositions_); }
std::uint64_t Ledger::disposed(const std::string& d) const {
  auto it = dispositions_.find(d);
  return it == dispositions_.end() ? 0 : it->second;
}

Status Ledger::check() const {
  const auto ended = completed_ + failed_total() + cancelled_total() + in_flight_;
  if (dispatched_ != ended)
    return make_error(ErrorCode::kInternal,
                      fmt::format("ledger: dispatched {} != completed {} + failed {} + cancelled {} + in flight {}",
                                  dispatched_, completed_, failed_total(), cancelled_total(), in_flight_));
  if (disposed_total() > completed_)
    return make_error(ErrorCode::kInternal,
                      fmt::format("ledger: disposed {} > completed {}", disposed_total(), completed_));
  return ok();
}

nlohmann::json Ledger::to_json() const {
  return {{"dispatched", dispatched_}, {"completed", completed_}, {"in_flight", in_flight_},
          {"failed", failed_},         {"cancelled", cancelled_}, {"dispositions", dispositions_}};
}

Result<Ledger> Ledger::from_json_for_resume(const nlohmann::json& j) {
  try {
    Ledger l;
    l.dispatched_ = j.at("dispatched").get<std::uint64_t>();
    l.completed_ = j.at("completed").get<std::uint64_t>();
    l.failed_ = j.at("failed").get<std::map<std::string, std::uint64_t>>();
    l.cancelled_ = j.at("cancelled").get<std::map<std::string, std::uint64_t>>();
    l.dispositions_ = j.at("dispositions").get<std::map<std::string, std::uint64_t>>();
    const auto in_flight = j.at("in_flight").get<std::uint64_t>();
    if (in_flight > 0) l.cancelled_["resume"] += in_flight;
    if (l.held() > 0) l.dispositions_["lost_on_resume"] += l.held();
    ARLO_TRY(l.check());
    return l;
  } catch (const nlohmann::json::exception& e) {
    return make_error(ErrorCode::kParse, std::string("ledger in checkpoint: ") + e.what());
  }
}

}  // namespace arlo::orch
