#pragma once
// An io_context with its own thread: where the orchestrator keeps its network I/O (HTTP clients to
// the inference workers, response parsing) so that thousands of requests in flight do not delay the
// orchestrator's own event loop.
//
// stop() lets the work already posted finish (up to `grace`), then stops the context and joins the
// thread; objects whose handlers run on it must be destroyed after stop() and before this object.
#include <sys/resource.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include <chrono>
#include <future>
#include <thread>

namespace arlo {

// The nice value arlo gives its network thread (HTTP to the workers): below the event loop's.
inline constexpr int kNetworkThreadNice = 5;

class IoThread {
 public:
  // `nice` > 0 lowers this thread's scheduling priority (Linux: per thread) so that, on a
  // saturated machine, the thread that owns the event loop runs first when both are ready.
  explicit IoThread(int nice = 0)
      : nice_(nice), guard_(boost::asio::make_work_guard(io_)), thread_([this] { run(); }) {}
  ~IoThread() { stop(); }
  IoThread(const IoThread&) = delete;
  IoThread& operator=(const IoThread&) = delete;

  boost::asio::io_context& context() { return io_; }
  boost::asio::io_context::executor_type executor() { return io_.get_executor(); }
  std::thread::id id() const { return thread_.get_id(); }

  // Runs fn on the thread and returns after it ran (fn must not wait for the caller's thread).
  template <typename Fn>
  void run_and_wait(Fn fn) {
    std::promise<void> done;
    boost::asio::post(io_, [&] {
      fn();
      done.set_value();
    });
    done.get_future().wait();
  }

  void stop(std::chrono::milliseconds grace = std::chrono::seconds(5)) {
    if (!thread_.joinable()) return;
    guard_.reset();
    if (finished_.wait_for(grace) != std::future_status::ready) io_.stop();
    thread_.join();
  }

 private:
  void run() {
    if (nice_ > 0) ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), nice_);  // best effort
    io_.run();
    ran_out_.set_value();
  }

  int nice_ = 0;
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> guard_;
  std::promise<void> ran_out_;
  std::shared_future<void> finished_ = ran_out_.get_future().share();
  std::thread thread_;  // last: starts after every member above exists
};

}  // namespace arlo
