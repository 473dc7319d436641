#pragma once
// A Clock for tests: time stands still until the test advances it, and advancing runs the timers that
// fall due, in time order, on the caller's thread (the loop's). A timer's callback usually posts to
// the io_context, so a test steps time and then polls the context: deterministic, no waiting.
//
// Thread-safety: none; use it on the thread that runs the io_context.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>

#include "common/async/clock.h"

namespace arlo {

class FakeClock final : public Clock {
 public:
  FakeClock() = default;
  // Drops the pending callbacks first, while the clock is whole: destroying one may destroy a Timer
  // handle of this clock (a callback that owns its own timer), which then cancels here harmlessly.
  ~FakeClock() override {
    auto pending = std::move(timers_);
    timers_.clear();
  }
  FakeClock(const FakeClock&) = delete;
  FakeClock& operator=(const FakeClock&) = delete;

  time_point now() const override { return now_; }
  std::unique_ptr<Timer> schedule(time_point at, std::function<void()> fn) override {
    const auto id = next_id_++;
    timers_.emplace(id, Entry{at, std::move(fn)});
    return std::make_unique<Handle>(this, id);
  }
  // Fires due timers in time order, moving now() to each.
  void advance(duration d) {
    const auto target = now_ + d;
    while (true) {
      auto it = earliest();
      if (it == timers_.end() || it->second.at > target) break;
      now_ = std::max(now_, it->second.at);
      auto fn = std::move(it->second.fn);
      timers_.erase(it);
      fn();
    }
    now_ = target;
  }
  // Moves to the next timer and fires it; false when none.
  bool fire_next() {
    auto it = earliest();
    if (it == timers_.end()) return false;
    advance(it->second.at - now_);
    return true;
  }
  std::size_t pending() const { return timers_.size(); }

 private:
  struct Entry {
    time_point at;
    std::function<void()> fn;
  };
  struct Handle final : Timer {
    Handle(FakeClock* c, std::uint64_t id) : clock(c), id(id) {}
    ~Handle() override { cancel(); }
    void cancel() override { clock->timers_.erase(id); }
    FakeClock* clock;
    std::uint64_t id;
  };
  std::map<std::uint64_t, Entry>::iterator earliest() {
    auto best = timers_.end();
    for (auto it = timers_.begin(); it != timers_.end(); ++it)
      if (best == timers_.end() || it->second.at < best->second.at) best = it;
    return best;
  }
  time_point now_{std::chrono::hours(1)};
  std::uint64_t next_id_ = 1;
  std::map<std::uint64_t, Entry> timers_;
};

}  // namespace arlo
