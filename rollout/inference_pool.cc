#include "rollout/inference_pool.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <random>

#include <variant>

#include <fmt/format.h>

#include "common/log.h"
#include "common/async/coro.h"
#include "rollout/openai.h"

namespace arlo::rollout {

namespace asio = boost::asio;
using namespace boost::asio::experimental::awaitable_operators;

namespace {

std::string strip_slash(std::string url) {
  while (!url.empty() && url.back() == '/') url.pop_back();
  return url;
}

// The clock the pool runs on: `options.clock`, or a real one created into `own`. Also handed to the
// HTTP client when the caller set no clock of its own there.
arlo::Clock* pick_clock(asio::io_context& io, PoolOptions& options, std::unique_ptr<arlo::Clock>& own) {
  if (!options.clock) {
    own = std::make_unique<RealClock>(io.get_executor());
    options.clock = own.get();
  }
  if (!options.client.clock) options.client.clock = options.clock;
  return options.clock;
}

bool retryable(ErrorCode code) {
  return code == ErrorCode::kUnavailable || code == ErrorCode::kTimeout || code == ErrorCode::kIo;
}

}  // namespace

InferencePool::InferencePool(asio::io_context& io, PoolOptions options)
    : io_(io),
      options_(std::move(options)),
      clock_(pick_clock(io, options_, own_clock_)),
      client_(std::make_unique<http::Client>(io, options_.client)),
      health_timer_(io),
      alive_(std::make_shared<bool>(true)),
      salt_id_(fmt::format("{:08x}", std::random_device{}())) {}

InferencePool::~InferencePool() {
  *alive_ = false;
  running_ = false;
  health_timer_.cancel();
}

InferencePool::Worker* InferencePool::find(const std::string& url) {
  for (auto& s : workers_)
    if (s->url == url) return s.get();
  return nullptr;
}

void InferencePool::weights_changed(const std::string& base_url, std::optional<std::int64_t> version) {
  Worker* s = find(strip_slash(base_url));
  if (!s) return;
  ++s->weights_changes;
  if (version) s->weights_version = version;
}

std::string InferencePool::cache_salt(const std::string& base_url) const {
  const std::string url = strip_slash(base_url);
  for (const auto& s : workers_)
    if (s->url == url)
      return fmt::format("arlo-{}-v{}-{}", salt_id_,
                         s->weights_version ? std::to_string(*s->weights_version) : std::string("init"),
                         s->weights_changes);
  return "";
}

void InferencePool::add_worker(const std::string& base_url) {
  const std::string url = strip_slash(base_url);
  Worker* s = find(url);
  if (s) {
    if (!s->removed) return;
    s->removed = false;
  } else {
    // Workers are never erased, so Worker* held by in-flight requests stay valid.
    workers_.push_back(std::make_unique<Worker>());
    s = workers_.back().get();
    s->url = url;
    s->lost = std::make_shared<asio::steady_timer>(io_, asio::steady_timer::time_point::max());
  }
  s->healthy = false;
  s->circuit_open = false;
  s->consecutive_failures = 0;
  ARLO_INFO("inference pool: worker {} joined", url);
  if (running_) {
    auto alive = alive_;
    asio::co_spawn(
        io_,
        [this, s, alive]() -> asio::awaitable<void> {
          if (*alive) co_await probe(*s);
        },
        asio::detached);
  }
}

void InferencePool::remove_worker(const std::string& base_url) {
  Worker* s = find(strip_slash(base_url));
  if (!s || s->removed) return;
  s->removed = true;
  s->healthy = false;
  ARLO_INFO("inference pool: worker {} left ({} requests still in flight finish there)", s->url, s->outstanding);
}

std::vector<std::string> InferencePool::workers() const {
  std::vector<std::string> out;
  for (const auto& s : workers_)
    if (!s->removed) out.push_back(s->url);
  return out;
}

std::vector<WorkerStatus> InferencePool::status() const {
  std::vector<WorkerStatus> out;
  for (const auto& s : workers_)
    out.push_back({s->url, s->healthy && !s->circuit_open, s->circuit_open, s->removed, s->outstanding, s->completed,
                   s->failed, s->version, s->silent});
  return out;
}

void InferencePool::start() {
  if (running_) return;
  running_ = true;
  asio::co_spawn(io_, health_loop(alive_), asio::detached);
}

void InferencePool::stop() {
  running_ = false;
  health_timer_.cancel();
}

InferencePool::Worker* InferencePool::pick(const std::string& key, const std::vector<std::string>& tried) {
  auto usable = [](const Worker& s) { return !s.removed && s.healthy && !s.circuit_open; };
  auto was_tried = [&](const Worker& s) { return std::find(tried.begin(), tried.end(), s.url) != tried.end(); };
  if (!key.empty()) {
    if (auto it = affinity_.find(key); it != affinity_.end()) {
      Worker* s = find(it->second);
      if (s && usable(*s) && !was_tried(*s)) return s;
    }
  }
  Worker* best = nullptr;
  const std::size_t n = workers_.size();
  for (int pass = 0; pass < 2 && !best; ++pass) {
    for (std::size_t k = 0; k < n; ++k) {
      Worker& s = *workers_[(round_robin_ + k) % n];
      if (!usable(s) || (pass == 0 && was_tried(s))) continue;
      if (!best || s.outstanding < best->outstanding) best = &s;
    }
  }
  ++round_robin_;
  return best;
}

void InferencePool::remember_affinity(const std::string& key, const std::string& url) {
  if (key.empty()) return;
  auto [it, inserted] = affinity_.insert_or_assign(key, url);
  if (!inserted) return;
  affinity_order_.push_back(key);
  while (affinity_order_.size() > options_.affinity_capacity) {
    affinity_.erase(affinity_order_.front());
    affinity_order_.pop_front();
  }
}

void InferencePool::on_success(Worker& s) {
  ++s.completed;
  s.consecutive_failures = 0;
  if (!s.circuit_open) s.healthy = true;
}

void InferencePool::on_failure(Worker& s, const Error& why) {
  ++s.failed;
  ++s.consecutive_failures;
  ARLO_WARN_EVERY(5.0, "inference worker {} failed ({} in a row): {}", s.url, s.consecutive_failures, why.what());
  if (s.consecutive_failures >= options_.failure_threshold && !s.circuit_open)
    open_circuit(s, fmt::format("after {} consecutive failures", s.consecutive_failures));
}

void InferencePool::open_circuit(Worker& s, const std::string& why) {
  s.circuit_open = true;
  s.healthy = false;
  s.backoff = options_.open_backoff_initial;
  s.lost->cancel();  // wakes the requests waiting on it; later ones wait on a fresh timer
  s.lost = std::make_shared<asio::steady_timer>(io_, asio::steady_timer::time_point::max());
  ARLO_WARN("inference pool: circuit open for {} {}; its {} request(s) in flight move to other workers", s.url, why,
            s.outstanding);
  if (!s.recovering && running_) {
    s.recovering = true;
    asio::co_spawn(io_, recover(s, alive_), asio::detached);
  }
}

asio::awaitable<bool> InferencePool::probe(Worker& s) {
  if (s.probing) co_return s.healthy;
  s.probing = true;
  auto alive = alive_;
  const auto started = clock_->now();
  auto r = co_await client_->get(s.url + "/health", options_.health_timeout);
  if (!*alive) co_return false;
  s.probing = false;
  // Silent: nothing answered, not even a refusal (that is a live host whose port is closed).
  s.silent = !r && r.error().code() == ErrorCode::kTimeout;
  if (r) s.last_answer = clock_->now();
  const bool ok = r && r->status >= 200 && r->status < 300;
  if (!ok && s.silent && options_.open_on_silence && !s.circuit_open && s.outstanding > 0 && s.last_answer < started) {
    // Its requests are as unanswered as the probe: a dark link or a hung host, not a slow worker
    // (that one answers some of its requests meanwhile). They move now rather than after
    // failure_threshold more probe timeouts.
    ++s.failed;
    ++s.consecutive_failures;
    open_circuit(s,
                 fmt::format("at once: its health check got no answer in {} ms, nor did any of its requests "
                             "meanwhile (inference.failover_on_silence)",
                             std::chrono::duration_cast<std::chrono::milliseconds>(options_.health_timeout).count()));
    co_return false;
  }
  if (ok) {
    if (auto j = r->parse_json(); j && j->is_object() && j->contains("version") && (*j)["version"].is_number_integer())
      s.version = (*j)["version"].get<std::int64_t>();
    const bool back = s.circuit_open;
    s.circuit_open = false;
    s.healthy = !s.removed;
    s.consecutive_failures = 0;
    if (back) {
      ARLO_INFO("inference pool: {} is back, circuit closed", s.url);
      if (on_back_) on_back_(s.url);
    }
  } else {
    Error why = r ? Error(ErrorCode::kUnavailable, fmt::format("/health answered HTTP {}", r->status)) : r.error();
    if (s.healthy)
      on_failure(s, why);
    else
      ++s.failed;
  }
  co_return ok;
}

asio::awaitable<void> InferencePool::recover(Worker& s, std::shared_ptr<bool> alive) {
  while (*alive && running_ && s.circuit_open && !s.removed) {
    co_await cancellable_sleep_until(io_.get_executor(), *clock_, clock_->now() + s.backoff);
    if (!*alive || !running_) co_return;
    const bool back = co_await probe(s);
    if (back) break;
    if (!*alive) co_return;
    s.backoff = std::min(options_.open_backoff_max, s.backoff * 2);
  }
  if (*alive) s.recovering = false;
}

asio::awaitable<void> InferencePool::check_all() {
  std::vector<asio::awaitable<bool>> probes;
  for (auto& s : workers_)
    if (!s->removed && !s->recovering) probes.push_back(probe(*s));
  co_await when_all(std::move(probes));
}

asio::awaitable<void> InferencePool::health_loop(std::shared_ptr<bool> alive) {
  while (*alive && running_) {
    co_await check_all();
    if (!*alive || !running_) co_return;
    // Workers whose circuit opened while the loop was idle get a recovery coroutine.
    for (auto& s : workers_)
      if (s->circuit_open && !s->recovering && !s->removed) {
        s->recovering = true;
        asio::co_spawn(io_, recover(*s, alive), asio::detached);
      }
    co_await wait_health_interval(alive);
  }
}

// Waits health_interval on the pool's clock; stop() (or the destructor) cuts the wait short by
// cancelling health_timer_.
asio::awaitable<void> InferencePool::wait_health_interval(std::shared_ptr<bool> alive) {
  health_timer_.expires_at(asio::steady_timer::time_point::max());
  auto due = clock_->schedule(clock_->now() + options_.health_interval, [this, alive] {
    if (*alive) health_timer_.cancel();
  });
  boost::system::error_code ec;
  co_await health_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
}

asio::awaitable<Result<Completion>> InferencePool::submit(CompletionRequest request, Duration timeout) {
  auto alive = alive_;
  const auto end = clock_->now() + timeout;
  const std::string path = endpoint_path(request);
  const bool chat = request.is_chat();
  Json body = to_openai_body(request);
  std::vector<std::string> tried;
  std::optional<Error> last_error;
  int attempts = 0;
  while (attempts < options_.max_attempts) {
    const auto now = clock_->now();
    if (now >= end) break;
    Worker* s = pick(request.affinity_key, tried);
    if (!s) {
      // Nothing usable right now: wait for a worker to (re)join, within the deadline.
      if (!running_ && workers_.empty())
        co_return make_error(ErrorCode::kUnavailable, "inference pool has no workers (set inference.urls)");
      co_await cancellable_sleep_until(io_.get_executor(), *clock_,
                                       now + std::min<Duration>(end - now, std::chrono::milliseconds(20)));
      if (!*alive) co_return make_error(ErrorCode::kCancelled, "inference pool destroyed");
      continue;
    }
    ++attempts;
    tried.push_back(s->url);
    remember_affinity(request.affinity_key, s->url);
    http::ClientRequest hr;
    hr.method = http::Verb::post;
    hr.url = s->url + path;
    if (request.cache_salt) body["cache_salt"] = cache_salt(s->url);
    hr.body = body.dump();
    hr.timeout = end - now;
    if (options_.attempt_timeout) hr.timeout = std::min(hr.timeout, *options_.attempt_timeout);
    hr.idempotent = false;
    hr.retry = http::RetryPolicy{1, {}, {}};  // the pool retries, on another worker
    ++s->outstanding;
    auto lost = s->lost;  // this attempt gives up when the worker's circuit opens meanwhile
    std::variant<Result<http::Response>, std::tuple<boost::system::error_code>> raced;
    try {
      raced = co_await (client_->request(std::move(hr)) || lost->async_wait(asio::as_tuple(asio::use_awaitable)));
    } catch (const boost::system::system_error& e) {  // the caller cancelled both (operator|| rethrows it)
      if (*alive) --s->outstanding;
      co_return make_error(ErrorCode::kCancelled, fmt::format("{}{}: cancelled: {}", s->url, path, e.what()));
    }
    if (!*alive) co_return make_error(ErrorCode::kCancelled, "inference pool destroyed");
    --s->outstanding;
    if (raced.index() == 0 && std::get<0>(raced)) s->last_answer = clock_->now();
    if (raced.index() == 1) {  // no on_failure: the circuit is open already
      last_error = Error(
          ErrorCode::kUnavailable,
          fmt::format("{}{}: the worker stopped answering (its circuit opened) while the request ran", s->url, path));
      continue;
    }
    auto resp = std::move(std::get<0>(raced));
    if (!resp) {
      if (!retryable(resp.error().code()))
        co_return std::unexpected(std::move(resp).error().with_context(s->url + path));
      on_failure(*s, resp.error());
      last_error = std::move(resp).error().with_context(s->url + path);
      continue;
    }
    if (resp->status >= 500) {
      Error e(ErrorCode::kUnavailable,
              fmt::format("{}{} answered HTTP {}: {}", s->url, path, resp->status, resp->body.substr(0, 200)));
      on_failure(*s, e);
      last_error = std::move(e);
      continue;
    }
    if (resp->status >= 400) {
      on_success(*s);  // the worker is fine; the request is not
      co_return make_error(ErrorCode::kInvalidArgument,
                           fmt::format("{}{} rejected the request with HTTP {}: {}", s->url, path, resp->status,
                                       resp->body.substr(0, 500)));
    }
    auto json = resp->parse_json();
    if (!json) co_return std::unexpected(std::move(json).error().with_context(s->url + path));
    auto completion = parse_openai_response(*json, chat);
    if (!completion) co_return std::unexpected(std::move(completion).error().with_context(s->url + path));
    on_success(*s);
    completion->worker = s->url;
    completion->attempts = attempts;
    co_return std::move(*completion);
  }
  if (last_error && attempts >= options_.max_attempts)
    co_return std::unexpected(std::move(*last_error).with_context(fmt::format("all {} attempts failed", attempts)));
  co_return make_error(ErrorCode::kTimeout,
                       fmt::format("no completion within the deadline ({} attempts{}{})", attempts,
                                   last_error ? "; last error: " : "", last_error ? last_error->what() : ""));
}

}  // namespace arlo::rollout
