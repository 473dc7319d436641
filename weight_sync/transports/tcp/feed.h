#pragma once
// The tcp transport's buffering window between the side that produces a version's buckets (the
// publisher's encoder, or a relay's upstream link) and the links that send them downstream, and
// the per-bucket checksum cache those links share (each bucket hashed once, not once per link).
// server.cc, sender.cc and receiver.cc hold the protocol that uses it.
#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"
#include "weight_sync/types.h"

namespace arlo::weight_sync::detail {

// A bucket's bytes as parts (spans into the source, a sink or an encode buffer).
using Parts = std::vector<std::span<const std::byte>>;

// Buckets of one version offered to downstream senders; bounds how far the producer runs ahead of
// the slowest consumer (`depth` buffers). Thread-safe.
//
// Feed also holds each bucket's checksum, computed once for every downstream link: the first link
// to send a bucket hashes it while sending (claim_sum / set_sum) and the others reuse the value;
// a relay posts the checksum it received and verified, so it never hashes for the next hop.
class Feed {
 public:
  Feed(std::size_t n, std::size_t depth) : items_(n), depth_(depth), sums_(n, 0), sum_state_(n, kSumNone) {}

  // Known checksum of bucket i, if any.
  std::optional<std::uint64_t> sum(std::size_t i) {
    std::lock_guard l(mu_);
    if (sum_state_[i] == kSumDone) return sums_[i];
    return std::nullopt;
  }
  // True when the caller is the one to compute bucket i's checksum (it must then call set_sum).
  bool claim_sum(std::size_t i) {
    std::lock_guard l(mu_);
    if (sum_state_[i] != kSumNone) return false;
    sum_state_[i] = kSumClaimed;
    return true;
  }
  void set_sum(std::size_t i, std::uint64_t value) {
    std::lock_guard l(mu_);
    sums_[i] = value;
    sum_state_[i] = kSumDone;
    cv_.notify_all();
  }
  // Cut-through (a relay receiving `full` in place): every bucket's parts are the sink's spans from
  // the start and downstream links send bytes as soon as they arrived (avail), then wait for the
  // checksum the relay verified. A bucket that arrives corrupted upstream is received again into
  // the same spans; the bytes a downstream link already took then fail its own check and it
  // resumes, so nothing unverified is ever applied downstream either.
  void enable_cut_through(const std::function<Parts(std::size_t)>& parts_of) {
    std::lock_guard l(mu_);
    avail_.assign(items_.size(), 0);
    for (std::size_t i = 0; i < items_.size(); ++i) {
      items_[i] = parts_of(i);
      sum_state_[i] = kSumClaimed;  // comes from upstream, never hashed here
    }
    produced_ = items_.size();
    cv_.notify_all();
  }
  bool cut_through() {
    std::lock_guard l(mu_);
    return !avail_.empty();
  }
  // Bytes of bucket i received so far (in the current attempt).
  void set_avail(std::size_t i, std::uint64_t bytes) {
    std::lock_guard l(mu_);
    avail_[i] = bytes;
    cv_.notify_all();
  }
  Status wait_avail(std::size_t i, std::uint64_t bytes, Deadline deadline) {
    std::unique_lock l(mu_);
    const bool ok_ = cv_.wait_until(l, deadline, [&] { return failed_ || avail_[i] >= bytes; });
    if (avail_[i] >= bytes) return ok();
    if (failed_) return std::unexpected(*failed_);
    if (!ok_)
      return make_error(ErrorCode::kTimeout, "bucket " + std::to_string(i) + " did not arrive upstream in time");
    return ok();
  }

  // Waits for the checksum another link is computing.
  Result<std::uint64_t> wait_sum(std::size_t i, Deadline deadline) {
    std::unique_lock l(mu_);
    if (!cv_.wait_until(l, deadline, [&] { return sum_state_[i] == kSumDone; }))
      return make_error(ErrorCode::kTimeout, "checksum of bucket " + std::to_string(i) + " not ready in time");
    return sums_[i];
  }

  void add_consumer(int id, std::size_t from) {
    std::lock_guard l(mu_);
    pos_[id] = from;
    cv_.notify_all();
  }
  void remove_consumer(int id) {
    std::lock_guard l(mu_);
    pos_.erase(id);
    cv_.notify_all();
  }
  void advance(int id, std::size_t next) {
    std::lock_guard l(mu_);
    if (pos_.count(id)) pos_[id] = next;
    cv_.notify_all();
  }
  // Producer: waits until bucket i may reuse the buffer of bucket i - depth.
  Status wait_room(std::size_t i, Deadline deadline) {
    std::unique_lock l(mu_);
    const bool ok_ = cv_.wait_until(l, deadline, [&] { return failed_ || i < low() + depth_; });
    if (failed_) return std::unexpected(*failed_);
    if (!ok_) return make_error(ErrorCode::kTimeout, "downstream did not take bucket " + std::to_string(i - depth_));
    if (i >= depth_) items_[i - depth_].reset();
    return ok();
  }
  void put(std::size_t i, Parts parts) {
    std::lock_guard l(mu_);
    items_[i] = std::move(parts);
    produced_ = std::max(produced_, i + 1);
    cv_.notify_all();
  }
  void fail(Error e) {
    std::lock_guard l(mu_);
    if (!failed_) failed_ = std::move(e);
    cv_.notify_all();
  }
  // Consumer: bucket i, kNotFound when it already left the window, or the producer's error.
  Result<Parts> get(std::size_t i, Deadline deadline) {
    std::unique_lock l(mu_);
    const bool ok_ = cv_.wait_until(l, deadline, [&] { return failed_ || items_[i] || i < produced_; });
    if (items_[i]) return *items_[i];
    if (failed_) return std::unexpected(*failed_);
    if (!ok_) return make_error(ErrorCode::kTimeout, "bucket " + std::to_string(i) + " was not produced in time");
    return make_error(ErrorCode::kNotFound, "bucket " + std::to_string(i) + " left the buffer window");
  }

 private:
  std::size_t low() const {
    std::size_t m = produced_ + depth_;  // no consumer: never blocks
    for (const auto& [id, p] : pos_) m = std::min(m, p);
    return m == produced_ + depth_ ? produced_ : m;
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::optional<Parts>> items_;
  std::map<int, std::size_t> pos_;
  std::size_t depth_;
  std::size_t produced_ = 0;
  std::optional<Error> failed_;
  static constexpr std::uint8_t kSumNone = 0, kSumClaimed = 1, kSumDone = 2;
  std::vector<std::uint64_t> sums_;
  std::vector<std::uint8_t> sum_state_;
  std::vector<std::uint64_t> avail_;  // cut-through only
};

}  // namespace arlo::weight_sync::detail
