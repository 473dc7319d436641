#include "reference/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "common/log.h"
#include "reference/model_impl.h"

namespace arlo::reference {

struct Engine::Request {
  std::uint64_t id = 0;
  SamplingParams params;
  SamplerRng rng;
  GenerationCallback done;
  std::vector<std::int32_t> tokens;  // prompt then generated: what the cache holds (minus the last)
  std::size_t prompt_len = 0;
  int slot = -1;
  bool prefilled = false;
  bool finished = false;
  Generation out;
  std::size_t max_stop_len = 0;

  Request(std::uint64_t id_, SamplingParams p, std::uint64_t seed, GenerationCallback cb,
          std::vector<std::int32_t> prompt)
      : id(id_), params(std::move(p)), rng(seed), done(std::move(cb)), tokens(std::move(prompt)) {
    prompt_len = tokens.size();
    out.prompt = tokens;
    for (const auto& s : params.stop) max_stop_len = std::max(max_stop_len, s.size());
  }
};

Engine::Engine(const ModelConfig& config, EngineOptions options)
    : config_(config), options_(options), thread_([this] { run(); }) {}

Engine::~Engine() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Result<std::uint64_t> Engine::submit(std::vector<std::int32_t> prompt, SamplingParams params, GenerationCallback done) {
  auto invalid = [](std::string m) { return make_error(ErrorCode::kInvalidArgument, std::move(m)); };
  if (prompt.empty()) return invalid("prompt is empty");
  for (auto id : prompt)
    if (id < 0 || id >= config_.vocab_size)
      return invalid(fmt::format("prompt token id {} is outside the vocabulary [0, {})", id, config_.vocab_size));
  if (static_cast<int>(prompt.size()) >= config_.context)
    return invalid(fmt::format("prompt has {} tokens; this model's context is {} tokens, so at most {} fit",
                               prompt.size(), config_.context, config_.context - 1));
  if (params.max_tokens < 1) return invalid(fmt::format("max_tokens must be >= 1, got {}", params.max_tokens));
  if (!(params.temperature >= 0)) return invalid(fmt::format("temperature must be >= 0, got {}", params.temperature));
  if (!(params.top_p > 0 && params.top_p <= 1))
    return invalid(fmt::format("top_p must be in (0, 1], got {}", params.top_p));
  if (params.top_logprobs < 0 || params.top_logprobs > 20)
    return invalid(fmt::format("top_logprobs must be in [0, 20], got {}", params.top_logprobs));
  for (const auto& s : params.stop)
    if (s.empty()) return invalid("stop strings must not be empty");
  std::uint64_t id;
  {
    std::lock_guard lk(mu_);
    id = next_id_++;
    const std::uint64_t seed = params.seed ? mix_seed(*params.seed, 0) : mix_seed(options_.seed, 1'000'000'007ull + id);
    queued_.push_back(std::make_unique<Request>(id, std::move(params), seed, std::move(done), std::move(prompt)));
  }
  cv_.notify_all();
  return id;
}

void Engine::cancel(std::uint64_t id) {
  {
    std::lock_guard lk(mu_);
    cancels_.insert(id);
  }
  cv_.notify_all();
}

Status Engine::set_model(std::shared_ptr<Model> model, std::int64_t version, std::function<void()> applied) {
  if (!model) return make_error(ErrorCode::kInvalidArgument, "set_model: null model");
  if (!(model->config() == config_))
    return make_error(ErrorCode::kMismatch, "set_model: the model's shape differs from the engine's");
  {
    std::lock_guard lk(mu_);
    if (pending_model_ && pending_model_->applied) {
      // Superseded before it was applied: its waiter still learns the engine moved on.
      auto prev = std::move(pending_model_->applied);
      pending_model_->applied = [prev = std::move(prev), next = std::move(applied)] {
        prev();
        if (next) next();
      };
      pending_model_->model = std::move(model);
      pending_model_->version = version;
    } else {
      pending_model_ = PendingModel{std::move(model), version, std::move(applied)};
    }
  }
  cv_.notify_all();
  return ok();
}

std::optional<std::int64_t> Engine::version() const {
  std::lock_guard lk(mu_);
  return version_;
}

std::shared_ptr<const Model> Engine::model() const {
  std::lock_guard lk(mu_);
  return model_;
}

void Engine::pause(PauseMode mode, std::function<void()> paused) {
  {
    std::lock_guard lk(mu_);
    pause_orders_.push_back({mode, std::move(paused)});
  }
  cv_.notify_all();
}

void Engine::resume() {
  {
    std::lock_guard lk(mu_);
    paused_ = false;
    draining_ = false;
    pause_orders_.clear();
    // Wait-mode callers still waiting learn that the pause ended: the engine thread calls them.
  }
  cv_.notify_all();
}

bool Engine::paused() const {
  std::lock_guard lk(mu_);
  return paused_;
}

EngineStats Engine::stats() const {
  std::lock_guard lk(mu_);
  EngineStats s = stats_;
  s.requests_finished = finished_count_.load(std::memory_order_relaxed);
  s.active = active_.size();
  s.queued = queued_.size();
  s.paused = paused_;
  return s;
}

bool Engine::has_work_locked() const {
  if (stop_ || pending_model_ || !pause_orders_.empty() || !cancels_.empty()) return true;
  if (draining_ || !drained_waiters_.empty()) return true;
  if (!model_) return false;
  if (paused_ && !draining_) return false;
  if (!active_.empty()) return true;
  return !draining_ && !queued_.empty();
}

void Engine::finish(Request* r, FinishReason reason, std::vector<std::function<void()>>& callbacks) {
  r->finished = true;
  r->out.finish = reason;
  finished_count_.fetch_add(1, std::memory_order_relaxed);
  callbacks.push_back([done = std::move(r->done), out = std::move(r->out)]() mutable { done(std::move(out)); });
}

void Engine::run() {
  set_torch_threads(options_.threads);
  at::NoGradGuard no_grad;
  std::optional<KvCache> cache;
  std::vector<int> free_slots;
  for (int s = options_.max_batch - 1; s >= 0; --s) free_slots.push_back(s);

  while (true) {
    std::vector<std::function<void()>> callbacks;
    std::vector<Request*> fresh;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return has_work_locked(); });
      if (stop_) break;
      take_pending_model_locked(cache, callbacks);
      apply_cancels_locked(callbacks);
      apply_pause_orders_locked(callbacks);
      retire_finished_locked(free_slots, callbacks);
      const bool stepping = model_ && (!paused_ || draining_);
      if (!stepping) {
        lk.unlock();
        for (auto& cb : callbacks) cb();
        continue;
      }
      if (!paused_) admit_queued_locked(free_slots, fresh);
    }
    for (auto& cb : callbacks) cb();
    callbacks.clear();
    step_or_fail(*cache, fresh, callbacks);
    for (auto& cb : callbacks) cb();
    if (options_.on_step) options_.on_step(stats());
  }
  fail_pending();
}

void Engine::take_pending_model_locked(std::optional<KvCache>& cache, std::vector<std::function<void()>>& callbacks) {
  if (!pending_model_) return;
  model_ = std::move(pending_model_->model);
  version_ = pending_model_->version;
  if (pending_model_->applied) callbacks.push_back(std::move(pending_model_->applied));
  pending_model_.reset();
  if (!cache) cache = model_->impl().make_cache(options_.max_batch);
}

void Engine::apply_cancels_locked(std::vector<std::function<void()>>& callbacks) {
  if (cancels_.empty()) return;
  for (auto it = queued_.begin(); it != queued_.end();) {
    if (cancels_.count((*it)->id)) {
      finish(it->get(), FinishReason::kAbort, callbacks);
      it = queued_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& r : active_)
    if (cancels_.count(r->id)) finish(r.get(), FinishReason::kAbort, callbacks);
  cancels_.clear();
}

void Engine::apply_pause_orders_locked(std::vector<std::function<void()>>& callbacks) {
  for (auto& order : pause_orders_) {
    if (order.mode == PauseMode::kAbort) {
      for (auto& r : active_)
        if (!r->finished) finish(r.get(), FinishReason::kAbort, callbacks);
      for (auto& r : queued_) finish(r.get(), FinishReason::kAbort, callbacks);
      queued_.clear();
      paused_ = true;
      draining_ = false;
      if (order.paused) callbacks.push_back(std::move(order.paused));
    } else if (order.mode == PauseMode::kKeep) {
      paused_ = true;
      draining_ = false;
      if (order.paused) callbacks.push_back(std::move(order.paused));
    } else {
      paused_ = true;
      draining_ = true;
      if (order.paused) drained_waiters_.push_back(std::move(order.paused));
    }
  }
  pause_orders_.clear();
}

void Engine::retire_finished_locked(std::vector<int>& free_slots, std::vector<std::function<void()>>& callbacks) {
  for (auto it = active_.begin(); it != active_.end();) {
    if ((*it)->finished) {
      free_slots.push_back((*it)->slot);
      it = active_.erase(it);
    } else {
      ++it;
    }
  }
  if (draining_ && active_.empty()) draining_ = false;
  if (!draining_ && !drained_waiters_.empty()) {
    for (auto& w : drained_waiters_)
      if (w) callbacks.push_back(std::move(w));
    drained_waiters_.clear();
  }
}

void Engine::admit_queued_locked(std::vector<int>& free_slots, std::vector<Request*>& fresh) {
  while (!queued_.empty() && !free_slots.empty()) {
    auto r = std::move(queued_.front());
    queued_.pop_front();
    r->slot = free_slots.back();
    free_slots.pop_back();
    fresh.push_back(r.get());
    active_.push_back(std::move(r));
  }
}

void Engine::step_or_fail(KvCache& cache, std::vector<Request*>& fresh, std::vector<std::function<void()>>& callbacks) {
  try {
    step(cache, fresh, callbacks);
  } catch (const std::exception& e) {
    // A libtorch failure is a bug or resource exhaustion: fail the requests in this step, keep serving.
    ARLO_ERROR("engine step failed: {}", e.what());
    std::lock_guard lk(mu_);
    for (auto& r : active_) {
      if (r->finished) continue;
      r->finished = true;
      callbacks.push_back([done = std::move(r->done), msg = std::string(e.what())] {
        done(make_error(ErrorCode::kInternal, "generation failed: libtorch: " + msg));
      });
    }
  }
}

void Engine::fail_pending() {
  std::vector<std::unique_ptr<Request>> left;
  {
    std::lock_guard lk(mu_);
    for (auto& r : active_) left.push_back(std::move(r));
    for (auto& r : queued_) left.push_back(std::move(r));
    active_.clear();
    queued_.clear();
  }
  for (auto& r : left)
    if (!r->finished && r->done) r->done(make_error(ErrorCode::kCancelled, "generation engine shut down"));
}

void Engine::step(KvCache& cache, std::vector<Request*>& fresh, std::vector<std::function<void()>>& callbacks) {
  // The model and cache are only touched on this thread; model_ changes only on this thread too.
  std::shared_ptr<Model> model;
  std::int64_t version = 0;
  {
    std::lock_guard lk(mu_);
    model = model_;
    version = *version_;
  }
  const ModelImpl& m = model->impl();

  std::vector<Request*> decoding;
  for (auto& r : active_)
    if (!r->finished && r->prefilled) decoding.push_back(r.get());

  auto sample_rows = [&](const std::vector<Request*>& rows, const at::Tensor& logits) {
    auto host = logits.contiguous();
    const float* base = host.data_ptr<float>();
    const std::size_t V = static_cast<std::size_t>(host.size(1));
    std::uint64_t produced = 0;
    for (std::size_t b = 0; b < rows.size(); ++b) {
      Request* r = rows[b];
      std::span<const float> row(base + b * V, V);
      SampledToken t = sample_token(row, r->params.temperature, r->params.top_p, r->rng);
      Generation& g = r->out;
      if (g.version_spans.empty() || g.version_spans.back().version != version)
        g.version_spans.push_back({version, static_cast<std::int64_t>(g.tokens.size())});
      g.tokens.push_back(t.token);
      g.logprobs.push_back(t.logprob);
      if (r->params.top_logprobs > 0)
        g.top_logprobs.push_back(top_logprobs(row, r->params.temperature, r->params.top_p, r->params.top_logprobs));
      r->tokens.push_back(t.token);
      ++produced;
      if (t.token == Tokenizer::kEos && !r->params.ignore_eos) {
        finish(r, FinishReason::kStop, callbacks);
        continue;
      }
      const std::size_t before = g.text.size();
      g.text += tokenizer_.piece(t.token);
      if (r->max_stop_len > 0 && g.text.size() > before) {
        const std::size_t from = before + 1 >= r->max_stop_len ? before + 1 - r->max_stop_len : 0;
        std::size_t best = std::string::npos;
        const std::string* which = nullptr;
        for (const auto& s : r->params.stop) {
          auto p = g.text.find(s, from);
          if (p != std::string::npos && p < best) best = p, which = &s;
        }
        if (which != nullptr) {
          g.matched_stop = *which;
          g.text.resize(best);
          finish(r, FinishReason::kStop, callbacks);
          continue;
        }
      }
      if (static_cast<int>(g.tokens.size()) >= r->params.max_tokens ||
          static_cast<int>(r->tokens.size()) >= config_.context) {
        finish(r, FinishReason::kLength, callbacks);
      }
    }
    return produced;
  };

  std::uint64_t produced = 0, steps = 0;
  if (!fresh.empty()) {
    const std::int64_t B = static_cast<std::int64_t>(fresh.size());
    std::int64_t P = 0;
    for (auto* r : fresh) P = std::max<std::int64_t>(P, static_cast<std::int64_t>(r->tokens.size()));
    auto ids = at::zeros({B, P}, at::kLong);
    auto lens = at::empty({B}, at::kLong);
    auto slots = at::empty({B}, at::kLong);
    auto* ip = ids.data_ptr<std::int64_t>();
    for (std::int64_t b = 0; b < B; ++b) {
      const auto& toks = fresh[b]->tokens;
      for (std::size_t t = 0; t < toks.size(); ++t) ip[b * P + static_cast<std::int64_t>(t)] = toks[t];
      lens.data_ptr<std::int64_t>()[b] = static_cast<std::int64_t>(toks.size());
      slots.data_ptr<std::int64_t>()[b] = fresh[b]->slot;
      fresh[b]->prefilled = true;
    }
    produced += sample_rows(fresh, m.prefill(cache, ids, lens, slots));
    ++steps;
  }
  if (!decoding.empty()) {
    const std::int64_t B = static_cast<std::int64_t>(decoding.size());
    auto ids = at::empty({B}, at::kLong);
    auto pos = at::empty({B}, at::kLong);
    auto slots = at::empty({B}, at::kLong);
    for (std::int64_t b = 0; b < B; ++b) {
      const auto& toks = decoding[b]->tokens;
      ids.data_ptr<std::int64_t>()[b] = toks.back();
      pos.data_ptr<std::int64_t>()[b] = static_cast<std::int64_t>(toks.size()) - 1;
      slots.data_ptr<std::int64_t>()[b] = decoding[b]->slot;
    }
    produced += sample_rows(decoding, m.decode(cache, ids, pos, slots));
    ++steps;
  }
  std::lock_guard lk(mu_);
  stats_.tokens_generated += produced;
  stats_.steps += steps;
}

}  // namespace arlo::reference
