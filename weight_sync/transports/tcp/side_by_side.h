#pragma once
// The tcp transport's side-by-side exchanges: the serving side (server.cc) runs handshakes and a
// manifest's offer on every link at once, so a dark link holds no other.
#include <sys/socket.h>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <list>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "weight_sync/transports/tcp/conn.h"

namespace arlo::weight_sync::detail {

// Blocking exchanges on several links at once (handshakes, a manifest and its answer), one thread
// each, so a dark link holds no other. A call still running when the caller gives up on it is cut
// off: its socket is shut down, so its blocked read returns, and the call is marked cut.
template <typename T>
class SideBySide {
 public:
  struct Call {
    T value;  // what the exchange returned (after a cut: its failure)
    bool cut = false;
  };
  ~SideBySide() { cut_off(); }
  // Runs `exchange` on a thread of its own; `conn`, the link it talks on, outlives the call.
  void start(Conn& conn, std::move_only_function<T()> exchange) {
    std::lock_guard l(mu_);
    Slot& s = slots_.emplace_back();
    s.conn = &conn;
    threads_.emplace_back([this, &s, exchange = std::move(exchange)]() mutable {
      T value = exchange();
      std::lock_guard l(mu_);
      s.value = std::move(value);
      if (!first_end_) first_end_ = Clock::now();
      ++ended_;
      changed_.notify_all();
    });
  }
  // Waits until a call ends, or `until`.
  void wait(Deadline until) {
    std::unique_lock l(mu_);
    const std::size_t seen = ended_;
    changed_.wait_until(l, until, [&] { return ended_ != seen || !running_locked(); });
  }
  bool running() {
    std::lock_guard l(mu_);
    return running_locked();
  }
  // When the first call ended.
  std::optional<Deadline> first_end() {
    std::lock_guard l(mu_);
    return first_end_;
  }
  // The calls that ended since the last take.
  std::vector<Call> finished() {
    std::lock_guard l(mu_);
    std::vector<Call> out;
    for (auto it = slots_.begin(); it != slots_.end();) {
      if (!it->value) {
        ++it;
        continue;
      }
      out.push_back({std::move(*it->value), it->cut});
      it = slots_.erase(it);
    }
    return out;
  }
  // Cuts off the calls still running, waits for every thread, returns what had not been taken.
  std::vector<Call> cut_off() {
    {
      std::lock_guard l(mu_);
      for (auto& s : slots_)
        if (!s.value) {
          s.cut = true;
          ::shutdown(s.conn->sock.native_handle(), SHUT_RDWR);
        }
    }
    for (auto& t : threads_) t.join();
    threads_.clear();
    return finished();
  }

 private:
  struct Slot {
    Conn* conn = nullptr;
    std::optional<T> value;
    bool cut = false;
  };
  bool running_locked() const {
    return std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return !s.value; });
  }

  std::mutex mu_;
  std::condition_variable changed_;
  std::list<Slot> slots_;  // stable addresses: each thread fills its own
  std::size_t ended_ = 0;
  std::optional<Deadline> first_end_;
  std::vector<std::thread> threads_;
};

}  // namespace arlo::weight_sync::detail
