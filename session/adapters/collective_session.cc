#include "session/adapters/collective_session.h"

#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "common/log.h"
#include "weight_sync/collective.h"

namespace arlo::session::adapters {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {

// A blocking call on a thread of its own (off_thread), awaited on the caller's executor (result).
// Two steps, not one coroutine taking the callable: GCC 12 mis-destroys a coroutine's by-value
// parameter that was moved from.
template <typename T>
struct OffThread {
  explicit OffThread(asio::any_io_executor e) : timer(e) {}
  std::optional<T> value;
  asio::steady_timer timer;
};

template <typename T, typename F>
std::shared_ptr<OffThread<T>> off_thread(asio::any_io_executor ex, F fn) {
  auto done = std::make_shared<OffThread<T>>(ex);
  std::thread([done, ex, fn = std::move(fn)]() mutable {
    T value = fn();
    asio::post(ex, [done, value = std::move(value)]() mutable {
      done->value.emplace(std::move(value));
      done->timer.cancel();
    });
  }).detach();
  return done;
}

template <typename T>
asio::awaitable<T> result(std::shared_ptr<OffThread<T>> done) {
  while (!done->value) {
    // Woken by the post; the period only bounds a wake-up lost to a multi-threaded executor.
    done->timer.expires_after(std::chrono::milliseconds(100));
    boost::system::error_code ec;
    co_await done->timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
  co_return std::move(*done->value);
}

}  // namespace

struct TrainerCollective::State {
  explicit State(CollectiveSessionOptions o) : options(std::move(o)) {}
  const CollectiveSessionOptions options;

  std::mutex mu;
  std::condition_variable cv;
  std::optional<weight_sync::Announcement> announcement;
  std::optional<weight_sync::GroupInfo> current;  // the group in use
  std::vector<weight_sync::GroupMember> current_members;
  bool current_failed = false;
  struct Forming {
    std::vector<weight_sync::GroupMember> members;
    Clock::time_point until;
    bool closed = false;  // asked the publisher; later arrivals wait for the next one
    bool done = false;
    Result<weight_sync::GroupInfo> result = std::unexpected(Error(ErrorCode::kInternal, "unset"));
  };
  std::shared_ptr<Forming> forming;
  std::optional<nlohmann::json> tensors;

  Clock::time_point deadline() const { return Clock::now() + options.timeout; }

  // Under mu: the control of the trainer that announced last.
  Result<std::unique_ptr<weight_sync::CollectiveControl>> control() {
    if (!announcement)
      return make_error(ErrorCode::kUnavailable, "collective weight sync: the trainer has announced no version yet");
    return weight_sync::CollectiveControl::connect(*announcement, deadline());
  }
};

std::shared_ptr<TrainerCollective> TrainerCollective::create(CollectiveSessionOptions options) {
  return std::shared_ptr<TrainerCollective>(new TrainerCollective(std::move(options)));
}

TrainerCollective::TrainerCollective(CollectiveSessionOptions options)
    : st_(std::make_unique<State>(std::move(options))) {}
TrainerCollective::~TrainerCollective() = default;

void TrainerCollective::announce(const nlohmann::json& announcement) {
  const auto& body = announcement.contains("weight_sync") ? announcement["weight_sync"] : announcement;
  auto a = weight_sync::parse_announcement(body);
  if (!a) {
    ARLO_WARN("collective weight sync: ignoring an announcement: {}", a.error().what());
    return;
  }
  std::lock_guard l(st_->mu);
  if (st_->announcement && st_->announcement->endpoint != a->endpoint) {
    ARLO_INFO("collective weight sync: the trainer moved to {}; workers join a new group", a->endpoint.dump());
    st_->current.reset();
    st_->tensors.reset();
  }
  st_->announcement = std::move(*a);
}

Result<nlohmann::json> TrainerCollective::group_blocking(const std::string& worker, int world_size) {
  auto& st = *st_;
  std::unique_lock l(st.mu);
  while (true) {
    if (st.current && !st.current_failed) {
      auto it = st.current->join.find(worker);
      if (it != st.current->join.end()) return it->second;
    }
    if (st.forming && !st.forming->closed) {  // join the group that is forming
      auto f = st.forming;
      f->members.push_back({worker, world_size, st.options.flavor});
      st.cv.notify_all();
      st.cv.wait(l, [&] { return f->done; });
      if (!f->result) return std::unexpected(f->result.error());
      continue;
    }
    if (st.forming) {  // asked already without this worker: the next one
      auto f = st.forming;
      st.cv.wait(l, [&] { return f->done; });
      continue;
    }
    // Lead a new group: gather the others, then ask the publisher. A worker joining a healthy
    // group (it rejoined) brings its members along: they are alive, and re-join on their next call.
    auto f = std::make_shared<State::Forming>();
    if (st.current && !st.current_failed) f->members = st.current_members;
    f->members.push_back({worker, world_size, st.options.flavor});
    f->until = Clock::now() + st.options.gather;
    st.forming = f;
    st.cv.wait_until(l, f->until, [&] { return f->members.size() >= st.options.expected; });
    f->closed = true;
    auto control = st.control();
    const auto members = f->members;
    l.unlock();
    if (control) {
      f->result = (*control)->open_group(members, st.deadline());
    } else {
      f->result = std::unexpected(control.error());
    }
    l.lock();
    if (f->result) {
      st.current = *f->result;
      st.current_members = members;
      st.current_failed = false;
      std::string names;
      for (const auto& m : members) names += (names.empty() ? "" : ", ") + m.name;
      ARLO_INFO("collective weight sync: group {} with {}", f->result->generation, names);
    } else {
      ARLO_WARN("collective weight sync: no group: {}", f->result.error().what());
    }
    f->done = true;
    st.forming.reset();
    st.cv.notify_all();
    if (!f->result) return std::unexpected(f->result.error());
  }
}

asio::awaitable<Result<nlohmann::json>> TrainerCollective::group(std::string worker, int world_size) {
  auto self = shared_from_this();
  auto ex = co_await asio::this_coro::executor;
  auto done = off_thread<Result<nlohmann::json>>(
      ex, [self, worker, world_size] { return self->group_blocking(worker, world_size); });
  co_return co_await result(done);
}

asio::awaitable<Result<nlohmann::json>> TrainerCollective::tensors() {
  auto self = shared_from_this();
  auto ex = co_await asio::this_coro::executor;
  auto done = off_thread<Result<nlohmann::json>>(ex, [self]() -> Result<nlohmann::json> {
    auto& st = *self->st_;
    std::unique_lock l(st.mu);
    if (st.tensors) return *st.tensors;
    ARLO_ASSIGN_OR_RETURN(auto control, st.control());
    l.unlock();
    ARLO_ASSIGN_OR_RETURN(auto t, control->tensors(st.deadline()));
    l.lock();
    st.tensors = t;
    return t;
  });
  co_return co_await result(done);
}

asio::awaitable<Result<std::int64_t>> TrainerCollective::receiving(std::string worker, std::int64_t generation,
                                                                   std::int64_t version) {
  auto self = shared_from_this();
  auto ex = co_await asio::this_coro::executor;
  auto done = off_thread<Result<std::int64_t>>(ex, [self, worker, generation, version]() -> Result<std::int64_t> {
    auto& st = *self->st_;
    std::unique_lock l(st.mu);
    ARLO_ASSIGN_OR_RETURN(auto control, st.control());
    l.unlock();
    auto sent = control->receiving(generation, version, st.deadline());
    if (!sent) {
      l.lock();
      if (st.current && st.current->generation == generation) st.current_failed = true;
      return std::unexpected(std::move(sent).error().with_context(fmt::format("{} receiving v{}", worker, version)));
    }
    return static_cast<std::int64_t>(*sent);
  });
  co_return co_await result(done);
}

void TrainerCollective::failed(std::string worker, std::int64_t generation, std::string why) {
  auto& st = *st_;
  std::unique_lock l(st.mu);
  if (st.current && st.current->generation == generation) st.current_failed = true;
  auto control = st.control();
  l.unlock();
  if (!control) return;
  const std::string reason = fmt::format("{}: {}", worker, why);
  std::thread([control = std::shared_ptr<weight_sync::CollectiveControl>(std::move(*control)), generation, reason,
               deadline = st.deadline()] {
    auto r = control->abort(generation, reason, deadline);
    if (!r) ARLO_WARN("collective weight sync: could not abort group {}: {}", generation, r.error().what());
  }).detach();
}

}  // namespace arlo::session::adapters
