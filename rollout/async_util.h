#pragma once
// Small coroutine helpers for the rollout module (Asio, C++20 coroutines).
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <memory>
#include <optional>
#include <vector>

namespace arlo::rollout {

// Runs all `tasks` concurrently on the current coroutine's executor and returns their results in
// order once every one has completed. Single-threaded executor assumed (the event loop).
template <typename T>
boost::asio::awaitable<std::vector<T>> when_all(std::vector<boost::asio::awaitable<T>> tasks) {
  namespace asio = boost::asio;
  auto ex = co_await asio::this_coro::executor;
  struct State {
    std::vector<std::optional<T>> results;
    std::size_t remaining = 0;
    asio::steady_timer done;
    explicit State(asio::any_io_executor e) : done(e, asio::steady_timer::time_point::max()) {}
  };
  auto st = std::make_shared<State>(ex);
  st->results.resize(tasks.size());
  st->remaining = tasks.size();
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    asio::co_spawn(ex, std::move(tasks[i]), [st, i](std::exception_ptr e, T value) {
      if (!e) st->results[i].emplace(std::move(value));
      if (--st->remaining == 0) st->done.cancel();
    });
  }
  if (st->remaining > 0) {
    boost::system::error_code ec;
    co_await st->done.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
  std::vector<T> out;
  out.reserve(st->results.size());
  for (auto& r : st->results) out.push_back(std::move(*r));  // tasks must not throw
  co_return out;
}

}  // namespace arlo::rollout
