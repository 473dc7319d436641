#include "common/async/clock.h"

#include <boost/asio/steady_timer.hpp>

namespace arlo {

namespace {
// Owns the timer through a shared_ptr so a handler already queued when the handle is destroyed
// still finds a live object; `cancelled` stops `fn` from running after cancel().
class SteadyTimerHandle final : public Timer {
 public:
  explicit SteadyTimerHandle(boost::asio::any_io_executor ex)
      : timer_(std::make_shared<boost::asio::steady_timer>(ex)) {}
  ~SteadyTimerHandle() override { cancel(); }
  void cancel() override {
    *cancelled_ = true;
    timer_->cancel();
  }
  void arm(Clock::time_point at, std::function<void()> fn) {
    timer_->expires_at(at);
    timer_->async_wait(
        [timer = timer_, cancelled = cancelled_, fn = std::move(fn)](const boost::system::error_code& ec) {
          if (!ec && !*cancelled) fn();
        });
  }

 private:
  std::shared_ptr<boost::asio::steady_timer> timer_;
  std::shared_ptr<bool> cancelled_ = std::make_shared<bool>(false);
};
}  // namespace

std::unique_ptr<Timer> RealClock::schedule(time_point at, std::function<void()> fn) {
  auto t = std::make_unique<SteadyTimerHandle>(ex_);
  t->arm(at, std::move(fn));
  return t;
}

}  // namespace arlo
