#pragma once
// Coroutine primitives for code that lives on one io_context thread: a one-shot Promise, a broadcast
// Signal, sleep_until and deadline enforcement on a Clock (common/async/clock.h; a FakeClock in
// tests), run_on another thread's context, when_all, and spawn() that lets exceptions escape
// io_context::run() instead of vanishing.
//
// Thread-safety: none of these are thread-safe; use them only on their io_context's thread (run_on
// is the one crossing, and says how).
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/async/clock.h"
#include "common/result.h"

namespace arlo {

template <typename T>
using Awaitable = boost::asio::awaitable<T>;

// Runs `coro` on `ex`; an exception thrown by it is rethrown from io_context::run() (a bug must be
// loud; arlo code reports errors as values).
template <typename Executor, typename Coro>
void spawn(Executor ex, Coro&& coro) {
  boost::asio::co_spawn(ex, std::forward<Coro>(coro), [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  });
}

// A value set once and awaited by at most one coroutine. Copies share the state. The waiter is
// resumed through a post, never inline from set(), so set() can be called from anywhere on the loop.
template <typename T>
class Promise {
 public:
  explicit Promise(boost::asio::any_io_executor ex) : s_(std::make_shared<State>()) { s_->ex = std::move(ex); }

  bool is_set() const { return s_->set; }

  // Sets the value; later calls are ignored (returns false).
  bool set(T value) {
    if (s_->set) return false;
    s_->set = true;
    if (s_->handler) {
      resume(std::move(s_->handler), std::move(value), s_->ex);
    } else {
      s_->value.emplace(std::move(value));
    }
    return true;
  }

  Awaitable<T> get() {
    auto s = s_;
    return boost::asio::async_initiate<decltype(boost::asio::use_awaitable), void(T)>(
        [s](auto handler) {
          auto h = std::make_unique<HandlerImpl<decltype(handler)>>(std::move(handler));
          if (s->value) {
            T v = std::move(*s->value);
            s->value.reset();
            resume(std::move(h), std::move(v), s->ex);
          } else {
            s->handler = std::move(h);
          }
        },
        boost::asio::use_awaitable);
  }

 private:
  // A move-only, type-erased completion handler (the coroutine waiting in get()).
  struct HandlerBase {
    virtual ~HandlerBase() = default;
    virtual void call(T value) = 0;
  };
  template <typename H>
  struct HandlerImpl final : HandlerBase {
    explicit HandlerImpl(H&& h) : handler(std::move(h)) {}
    void call(T value) override { std::move(handler)(std::move(value)); }
    H handler;
  };
  struct State {
    boost::asio::any_io_executor ex;
    bool set = false;
    std::optional<T> value;
    std::unique_ptr<HandlerBase> handler;
  };
  static void resume(std::unique_ptr<HandlerBase> h, T v, const boost::asio::any_io_executor& ex) {
    boost::asio::post(ex, [h = std::move(h), v = std::move(v)]() mutable { h->call(std::move(v)); });
  }

  std::shared_ptr<State> s_;
};

// Wakes every coroutine waiting at the time of notify(). Waiters re-check their condition in a
// loop, so spurious wake-ups are harmless: `while (!cond()) co_await signal.wait();`
class Signal {
 public:
  explicit Signal(boost::asio::any_io_executor ex) : ex_(std::move(ex)) {}
  Awaitable<void> wait() {
    Promise<bool> p(ex_);
    waiters_.push_back(p);
    co_await p.get();
  }
  // As wait(), but gives up at `deadline` on `clock`: true when notified, false when the deadline
  // came first.
  Awaitable<bool> wait_until(Clock& clock, Clock::time_point deadline) {
    Promise<bool> p(ex_);
    waiters_.push_back(p);
    auto timer = clock.schedule(deadline, [p]() mutable { p.set(false); });
    const bool notified = co_await p.get();
    // A waiter the deadline set is still listed until the next notify(): drop it (and any other the
    // deadline set) now, so that timed waits without notifies do not pile up.
    std::erase_if(waiters_, [](const Promise<bool>& w) { return w.is_set(); });
    co_return notified;
  }
  void notify() {
    auto waiters = std::move(waiters_);
    waiters_.clear();
    for (auto& w : waiters) w.set(true);
  }
  std::size_t waiters() const { return waiters_.size(); }

 private:
  boost::asio::any_io_executor ex_;
  std::vector<Promise<bool>> waiters_;
};

inline Awaitable<void> sleep_until(boost::asio::any_io_executor ex, Clock& clock, Clock::time_point at) {
  Promise<bool> p(ex);
  auto timer = clock.schedule(at, [p]() mutable { p.set(true); });
  co_await p.get();
}

// Waits until `at` on `clock` like sleep_until, but the wait is an asio timer that the clock wakes,
// so asio's per-operation cancellation (a caller racing it with ||, a cancellation slot) ends it
// at once. Returns true when `at` came, false when the wait was cancelled first.
inline Awaitable<bool> cancellable_sleep_until(boost::asio::any_io_executor ex, Clock& clock, Clock::time_point at) {
  boost::asio::steady_timer wake(ex, boost::asio::steady_timer::time_point::max());
  bool due = false;
  auto timer = clock.schedule(at, [&] {
    due = true;
    wake.cancel();
  });
  boost::system::error_code ec;
  co_await wake.async_wait(boost::asio::redirect_error(boost::asio::use_awaitable, ec));
  co_return due;
}

// Runs the coroutine that make() returns on `elsewhere` (another io_context's thread; make() is
// called there too) and resumes the caller on its own executor with the result. The operation runs
// to its end even if the caller stops waiting; its result is then discarded. This is the one place
// where a value crosses threads: through a post to the caller's executor.
template <typename T, typename Make>
Awaitable<T> run_on(boost::asio::any_io_executor elsewhere, Make make) {
  boost::asio::any_io_executor home = co_await boost::asio::this_coro::executor;
  Promise<T> done(home);
  auto body = [make = std::move(make), done, home]() mutable -> Awaitable<void> {
    auto op = make();
    T result = co_await std::move(op);
    boost::asio::post(home, [done, result = std::move(result)]() mutable { done.set(std::move(result)); });
  };
  spawn(elsewhere, std::move(body));
  auto result = co_await done.get();
  co_return result;
}

// Awaits `op` but gives up at `deadline` with kTimeout. The operation is not required to support
// cancellation: it keeps running detached and its late result is discarded. When `cancel` is given,
// the operation is bound to it so the owner can cancel it (e.g. drain).
//
// GCC 12 note: pass every non-trivial argument of a coroutine call inside co_await as a named
// local moved in (temporaries in co_await expressions are mishandled by GCC 12).
template <typename T>
Awaitable<Result<T>> with_deadline(boost::asio::any_io_executor ex, Clock& clock, Clock::time_point deadline,
                                   Awaitable<Result<T>> op, const char* what,
                                   std::shared_ptr<boost::asio::cancellation_signal> cancel = nullptr) {
  Promise<Result<T>> done(ex);
  auto timer = clock.schedule(deadline, [done, what = std::string(what)]() mutable {
    done.set(make_error(ErrorCode::kTimeout, what + ": deadline expired"));
  });
  auto body = [done, op = std::move(op)]() mutable -> Awaitable<void> {
    auto r = co_await std::move(op);
    done.set(std::move(r));
  };
  if (cancel) {
    boost::asio::co_spawn(ex, std::move(body),
                          boost::asio::bind_cancellation_slot(cancel->slot(), [](std::exception_ptr e) {
                            if (e) std::rethrow_exception(e);
                          }));
  } else {
    spawn(ex, std::move(body));
  }
  auto result = co_await done.get();
  timer->cancel();
  co_return result;
}

// Runs all `tasks` concurrently on the current coroutine's executor and returns their results in
// order once every one has completed. Tasks must not throw.
template <typename T>
Awaitable<std::vector<T>> when_all(std::vector<Awaitable<T>> tasks) {
  auto ex = co_await boost::asio::this_coro::executor;
  struct State {
    std::vector<std::optional<T>> results;
    std::size_t remaining = 0;
    boost::asio::steady_timer done;
    explicit State(boost::asio::any_io_executor e) : done(e, boost::asio::steady_timer::time_point::max()) {}
  };
  auto st = std::make_shared<State>(ex);
  st->results.resize(tasks.size());
  st->remaining = tasks.size();
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    boost::asio::co_spawn(ex, std::move(tasks[i]), [st, i](std::exception_ptr e, T value) {
      if (!e) st->results[i].emplace(std::move(value));
      if (--st->remaining == 0) st->done.cancel();
    });
  }
  if (st->remaining > 0) {
    boost::system::error_code ec;
    co_await st->done.async_wait(boost::asio::redirect_error(boost::asio::use_awaitable, ec));
  }
  std::vector<T> out;
  out.reserve(st->results.size());
  for (auto& r : st->results) out.push_back(std::move(*r));
  co_return out;
}

}  // namespace arlo
