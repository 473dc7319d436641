#pragma once
// Time, as code on an event loop sees it: now() and timers that run a callback on the loop. The real
// clock (RealClock) uses steady_clock and asio steady timers on one io_context; FakeClock
// (common/async/fake_clock.h) is advanced by hand in tests, so timeouts, intervals, heartbeats and
// back-offs are tested without waiting on real time.
//
// Thread-safety: a clock and its timers are used on their io_context's thread only.
#include <boost/asio/any_io_executor.hpp>

#include <chrono>
#include <functional>
#include <memory>

namespace arlo {

class Timer {
 public:
  virtual ~Timer() = default;  // destroying a timer cancels it
  virtual void cancel() = 0;
};

class Clock {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  using duration = std::chrono::steady_clock::duration;

  virtual ~Clock() = default;
  virtual time_point now() const = 0;
  // Runs `fn` on the loop at or after `at`, unless the returned timer is cancelled or destroyed first.
  virtual std::unique_ptr<Timer> schedule(time_point at, std::function<void()> fn) = 0;
};

// The real clock: steady_clock and asio steady timers on the io_context of `ex`.
class RealClock final : public Clock {
 public:
  explicit RealClock(boost::asio::any_io_executor ex) : ex_(std::move(ex)) {}
  time_point now() const override { return std::chrono::steady_clock::now(); }
  std::unique_ptr<Timer> schedule(time_point at, std::function<void()> fn) override;

 private:
  boost::asio::any_io_executor ex_;
};

}  // namespace arlo
