#include "common/async/abandonable_executor.h"

#include <thread>

#include "common/log.h"

namespace arlo {

AbandonableExecutor::AbandonableExecutor(Options options) : shared_(std::make_shared<Shared>()), clock_(options.clock) {
  shared_->max_abandoned = options.max_abandoned;
  const std::size_t n = options.threads == 0 ? 1 : options.threads;
  for (std::size_t i = 0; i < n; ++i) start_worker(shared_);
}

AbandonableExecutor::~AbandonableExecutor() {
  std::deque<std::shared_ptr<Job>> queued;
  std::set<std::shared_ptr<Job>> running;
  {
    std::lock_guard lk(shared_->mu);
    shared_->stopping = true;
    queued.swap(shared_->queue);
    running = shared_->running;
    // Jobs still running are abandoned: their threads will not deliver into a loop that may be gone.
    for (const auto& job : running) {
      int expected = kRunning;
      if (!job->state.compare_exchange_strong(expected, kAbandoned)) continue;
      job->fail(Error(ErrorCode::kCancelled, "reward executor shut down while the call was running"));
    }
    for (const auto& job : queued) {
      int expected = kQueued;
      if (job->state.compare_exchange_strong(expected, kAbandoned))
        job->fail(Error(ErrorCode::kCancelled, "reward executor shut down before the call started"));
    }
  }
  shared_->cv.notify_all();
  // No join: idle workers exit promptly; a worker stuck in a hung call exits whenever it returns.
}

void AbandonableExecutor::start_worker(const std::shared_ptr<Shared>& shared) {
  std::thread(worker_main, shared).detach();
}

void AbandonableExecutor::worker_main(std::shared_ptr<Shared> s) {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lk(s->mu);
      s->cv.wait(lk, [&] { return s->stopping || !s->queue.empty(); });
      if (s->stopping) return;
      job = std::move(s->queue.front());
      s->queue.pop_front();
      int expected = kQueued;
      if (!job->state.compare_exchange_strong(expected, kRunning)) continue;  // timed out while queued
      s->running.insert(job);
    }
    auto deliver = job->work();
    {
      std::lock_guard lk(s->mu);
      s->running.erase(job);
      int expected = kRunning;
      if (job->state.compare_exchange_strong(expected, kDone)) {
        if (!s->stopping) deliver();
      } else {
        // Abandoned after a timeout: a replacement thread already took this one's place.
        if (s->abandoned > 0) --s->abandoned;
        return;
      }
    }
  }
}

void AbandonableExecutor::on_timeout(const std::shared_ptr<Shared>& s, const std::shared_ptr<Job>& job) {
  std::lock_guard lk(s->mu);
  ++s->timeouts;
  int expected = kQueued;
  if (job->state.compare_exchange_strong(expected, kAbandoned)) return;  // never started: nothing lost
  expected = kRunning;
  if (job->state.compare_exchange_strong(expected, kAbandoned)) {
    ++s->abandoned;
    if (!s->stopping) start_worker(s);
    ARLO_WARN_EVERY(10.0, "a call ran past its timeout and was abandoned ({} threads now stuck)", s->abandoned);
  }
}

Status AbandonableExecutor::enqueue(std::shared_ptr<Job> job) {
  {
    std::lock_guard lk(shared_->mu);
    if (shared_->stopping) return make_error(ErrorCode::kCancelled, "executor is shutting down");
    if (shared_->abandoned >= shared_->max_abandoned)
      return make_error(
          ErrorCode::kResourceExhausted,
          fmt::format("{} calls are stuck past their timeout; refusing new work (the module appears hung)",
                      shared_->abandoned));
    shared_->queue.push_back(std::move(job));
  }
  shared_->cv.notify_one();
  return ok();
}

std::size_t AbandonableExecutor::abandoned() const {
  std::lock_guard lk(shared_->mu);
  return shared_->abandoned;
}

std::size_t AbandonableExecutor::timeouts() const {
  std::lock_guard lk(shared_->mu);
  return shared_->timeouts;
}

}  // namespace arlo
