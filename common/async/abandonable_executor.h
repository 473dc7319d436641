#pragma once
// Runs untrusted blocking calls (reward plugins, user code) off the event loop, each under a
// timeout, without ever letting a hung call block the loop or shutdown.
//
// A call that overruns its timeout is *abandoned*: the awaiting coroutine resumes with kTimeout,
// the worker thread stuck in the call is written off and a replacement thread is started, so
// capacity is kept. When the stuck call eventually returns, its thread exits and its result is
// discarded. Threads are detached: the destructor never joins, so shutdown cannot hang on a plugin.
// After `max_abandoned` threads are stuck at once, new calls fail fast with kResourceExhausted.
//
// Timeouts run on Options::clock when one is given (a FakeClock in tests: a call is abandoned when the
// test advances time past its timeout), else on real time (steady timers on run()'s io_context).
//
// Contract: the io_context passed to run() (and the clock, if any) must outlive this executor. Whatever the work
// closure captures (e.g. a shared_ptr to a plugin) stays alive until the call really returns. Thread-safety: run() is
// called from the loop's thread; everything else is internal.
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>

#include <fmt/format.h>

#include "common/async/clock.h"
#include "common/result.h"

namespace arlo {

class AbandonableExecutor {
 public:
  struct Options {
    std::size_t threads = 2;
    std::size_t max_abandoned = 16;
    // The clock the timeouts run on; null: real time. Must be the clock of run()'s io_context.
    Clock* clock = nullptr;
  };
  explicit AbandonableExecutor(Options options);
  ~AbandonableExecutor();
  AbandonableExecutor(const AbandonableExecutor&) = delete;
  AbandonableExecutor& operator=(const AbandonableExecutor&) = delete;

  // Runs `fn` (returning Result<R>) on a worker thread; resumes on `loop` with its result, or with
  // kTimeout after `timeout` (on Options::clock), or kCancelled if the executor is destroyed first.
  // Await it through co_spawn (e.g. common/async/coro.h when_all), not with a bare co_await in a
  // coroutine body: GCC 12 mis-destroys the frame of a coroutine that directly co_awaits this
  // async_initiate-based operation with a non-trivial result (seen as a double free).
  template <typename R, typename F>
  boost::asio::awaitable<Result<R>> run(boost::asio::io_context& loop, F fn,
                                        std::chrono::steady_clock::duration timeout);

  // Calls currently stuck past their timeout (threads written off and not yet returned).
  std::size_t abandoned() const;
  // Total calls that timed out since construction.
  std::size_t timeouts() const;

 private:
  enum : int { kQueued = 0, kRunning = 1, kDone = 2, kAbandoned = 3 };
  struct Job {
    std::atomic<int> state{kQueued};
    // Runs the work and returns the closure that delivers its result to the loop.
    std::move_only_function<std::move_only_function<void()>()> work;
    // Delivers an error to the loop instead (shutdown).
    std::move_only_function<void(Error)> fail;
  };
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::shared_ptr<Job>> queue;
    std::set<std::shared_ptr<Job>> running;
    bool stopping = false;
    std::size_t abandoned = 0;
    std::size_t timeouts = 0;
    std::size_t max_abandoned = 0;
  };

  static void worker_main(std::shared_ptr<Shared> shared);
  static void start_worker(const std::shared_ptr<Shared>& shared);
  // Called on the loop when a job's timer expires; returns true when the job was running (lost thread).
  static void on_timeout(const std::shared_ptr<Shared>& shared, const std::shared_ptr<Job>& job);
  Status enqueue(std::shared_ptr<Job> job);

  std::shared_ptr<Shared> shared_;
  Clock* clock_ = nullptr;
};

template <typename R, typename F>
boost::asio::awaitable<Result<R>> AbandonableExecutor::run(boost::asio::io_context& loop, F fn,
                                                           std::chrono::steady_clock::duration timeout) {
  namespace asio = boost::asio;
  auto initiate = [this, &loop, timeout](auto handler, F fn) {
    using H = decltype(handler);
    // Loop-thread only: whichever of result / timeout / shutdown arrives first completes the wait.
    struct Waiter {
      H handler;
      std::unique_ptr<Timer> timer;
      bool finished = false;
      explicit Waiter(H h) : handler(std::move(h)) {}
      void finish(Result<R> r) {
        if (finished) return;
        finished = true;
        if (timer) timer->cancel();
        std::move(handler)(std::move(r));
      }
    };
    // The waiter is owned by the loop side only (its pending timer callback keeps it alive until it
    // finishes), so a worker thread never destroys loop objects; workers hold weak references.
    auto waiter = std::make_shared<Waiter>(std::move(handler));
    std::weak_ptr<Waiter> weak = waiter;
    auto job = std::make_shared<Job>();
    auto ex = loop.get_executor();
    job->work = [fn = std::move(fn), weak, ex]() mutable -> std::move_only_function<void()> {
      Result<R> result = fn();
      return [result = std::move(result), weak, ex]() mutable {
        asio::post(ex, [result = std::move(result), weak]() mutable {
          if (auto w = weak.lock()) w->finish(std::move(result));
        });
      };
    };
    job->fail = [weak, ex](Error e) mutable {
      asio::post(ex, [e = std::move(e), weak]() mutable {
        if (auto w = weak.lock()) w->finish(std::unexpected(std::move(e)));
      });
    };
    if (auto st = enqueue(job); !st) {
      asio::post(ex, [waiter, e = std::move(st).error()]() mutable { waiter->finish(std::unexpected(std::move(e))); });
      return;
    }
    RealClock real(ex);
    Clock& clock = clock_ != nullptr ? *clock_ : real;
    waiter->timer = clock.schedule(clock.now() + timeout, [waiter, job, shared = shared_, timeout] {
      if (waiter->finished) return;
      on_timeout(shared, job);
      waiter->finish(make_error(ErrorCode::kTimeout,
                                fmt::format("call did not finish within {} ms; abandoned (its thread is written off)",
                                            std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count())));
    });
  };
  return asio::async_initiate<decltype(asio::use_awaitable), void(Result<R>)>(std::move(initiate), asio::use_awaitable,
                                                                              std::move(fn));
}

}  // namespace arlo
