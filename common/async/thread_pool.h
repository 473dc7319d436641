#pragma once
// A fixed-size pool for CPU-heavy work (reward scoring, batch packing, encoding) that posts results
// back to an io_context, so the event loop that owns the state never blocks and never locks.
//
// Thread-safety: submit/post_result may be called from any thread. The callback given to
// `run_then` runs on the io_context's thread(s), never on a pool thread.
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/executor_work_guard.hpp>

#include <cstddef>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

namespace arlo {

class ThreadPool {
 public:
  explicit ThreadPool(std::size_t threads) : pool_(threads == 0 ? 1 : threads), size_(threads == 0 ? 1 : threads) {}
  ~ThreadPool() { stop(); }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  std::size_t size() const { return size_; }

  // Runs `work` on the pool; when it finishes, runs `done(result)` on `loop`.
  // Until `done` has been posted, `loop` counts as having outstanding work, so `loop.run()` does
  // not return while a result is still on its way. `work` must not throw (errors are values).
  template <typename Work, typename Done>
  void run_then(boost::asio::io_context& loop, Work work, Done done) {
    auto guard = boost::asio::make_work_guard(loop);
    boost::asio::post(
        pool_, [&loop, guard = std::move(guard), work = std::move(work), done = std::move(done)]() mutable {
          if constexpr (std::is_void_v<std::invoke_result_t<Work&>>) {
            work();
            boost::asio::post(loop, [done = std::move(done)]() mutable { done(); });
          } else {
            auto result = work();
            boost::asio::post(
                loop, [done = std::move(done), result = std::move(result)]() mutable { done(std::move(result)); });
          }
          guard.reset();  // the posted completion now keeps `loop` busy
        });
  }

  // Coroutine form: `auto r = co_await pool.run(loop, [] { return heavy(); });`
  // The coroutine resumes on `loop` with the result.
  template <typename Work>
  auto run(boost::asio::io_context& loop, Work work) {
    using R = std::invoke_result_t<Work&>;
    static_assert(!std::is_void_v<R>, "ThreadPool::run needs work that returns a value");
    return boost::asio::async_initiate<decltype(boost::asio::use_awaitable), void(R)>(
        [this, &loop](auto handler, Work w) mutable {
          run_then(loop, std::move(w),
                   [handler = std::move(handler)](R r) mutable { std::move(handler)(std::move(r)); });
        },
        boost::asio::use_awaitable, std::move(work));
  }

  // Fire-and-forget on the pool.
  template <typename Work>
  void post(Work work) {
    boost::asio::post(pool_, std::move(work));
  }

  // Waits for queued work to finish and joins the threads. Idempotent.
  void stop() { pool_.join(); }

 private:
  boost::asio::thread_pool pool_;
  std::size_t size_;
};

}  // namespace arlo
