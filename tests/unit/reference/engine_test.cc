#include <gtest/gtest.h>

#include <future>

#include "reference/engine.h"
#include "reference/model_impl.h"

namespace arlo::reference {
namespace {

using Done = std::shared_ptr<std::promise<Result<Generation>>>;

struct Submitted {
  Done promise = std::make_shared<std::promise<Result<Generation>>>();
  std::future<Result<Generation>> future = promise->get_future();
};

Submitted submit(Engine& engine, std::vector<std::int32_t> prompt, SamplingParams params) {
  Submitted s;
  auto id = engine.submit(std::move(prompt), std::move(params),
                          [p = s.promise](Result<Generation> r) { p->set_value(std::move(r)); });
  EXPECT_TRUE(id.has_value());
  return s;
}

std::shared_ptr<Model> model(std::uint64_t seed) {
  auto m = Model::init({}, seed);
  EXPECT_TRUE(m);
  return *m;
}

void install(Engine& engine, std::shared_ptr<Model> m, std::int64_t version) {
  std::promise<void> applied;
  ASSERT_TRUE(engine.set_model(std::move(m), version, [&] { applied.set_value(); }));
  applied.get_future().wait();
}

// Sampling of exactly `max_tokens` tokens (EOS ignored) from the random stream `seed`.
SamplingParams exactly(std::int64_t max_tokens, std::uint64_t seed) {
  return {.max_tokens = max_tokens, .seed = seed, .ignore_eos = true};
}

struct Case {
  std::string prompt;
  SamplingParams params;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  const char* prompts[] = {"1+2=", "Hello, world", "x", "12+34=", "the quick brown fox", "7", "abc", "9+9="};
  for (int i = 0; i < 8; ++i) {
    SamplingParams p;
    p.seed = 100 + i;
    p.max_tokens = 10 + 3 * i;
    p.temperature = i % 3 == 0 ? 1.0 : (i % 3 == 1 ? 0.7 : 1.3);
    p.top_p = i % 2 == 0 ? 1.0 : 0.9;
    p.ignore_eos = i % 4 == 0;
    out.push_back({prompts[i], p});
  }
  return out;
}

TEST(Engine, BatchedGenerationEqualsOneAtATime) {
  Tokenizer tok;
  auto m = model(21);
  std::vector<Generation> alone;
  {
    Engine engine({}, {});
    install(engine, m, 0);
    for (const auto& c : cases()) {
      auto s = submit(engine, tok.encode_prompt(c.prompt), c.params);
      auto r = s.future.get();
      ASSERT_TRUE(r) << r.error().what();
      alone.push_back(*r);
    }
  }
  Engine engine({}, {});
  install(engine, m, 0);
  std::vector<Submitted> together;
  for (const auto& c : cases()) together.push_back(submit(engine, tok.encode_prompt(c.prompt), c.params));
  for (std::size_t i = 0; i < together.size(); ++i) {
    auto r = together[i].future.get();
    ASSERT_TRUE(r) << r.error().what();
    EXPECT_EQ(r->tokens, alone[i].tokens) << "request " << i;
    ASSERT_EQ(r->logprobs.size(), alone[i].logprobs.size());
    for (std::size_t t = 0; t < r->logprobs.size(); ++t) EXPECT_NEAR(r->logprobs[t], alone[i].logprobs[t], 1e-5);
    EXPECT_EQ(r->text, alone[i].text);
    EXPECT_EQ(r->version_spans, (std::vector<VersionSpan>{{0, 0}}));
  }
  EXPECT_GE(engine.stats().tokens_generated, 8u);
}

TEST(Engine, LogprobsMatchAFreshForwardPass) {
  Tokenizer tok;
  auto m = model(22);
  Engine engine({}, {});
  install(engine, m, 0);
  std::vector<Submitted> subs;
  for (const auto& c : cases()) subs.push_back(submit(engine, tok.encode_prompt(c.prompt), c.params));
  at::NoGradGuard no_grad;
  const auto all = cases();
  // Every request first: the fresh passes below use the engine's model, which must be idle then
  // (a forward on it from this thread while the engine still steps the others raced under load).
  std::vector<decltype(subs[0].future.get())> results;
  for (auto& s : subs) results.push_back(s.future.get());
  for (std::size_t i = 0; i < subs.size(); ++i) {
    auto& r = results[i];
    ASSERT_TRUE(r);
    std::vector<std::int64_t> seq(r->prompt.begin(), r->prompt.end());
    seq.insert(seq.end(), r->tokens.begin(), r->tokens.end());
    const auto T = static_cast<std::int64_t>(seq.size());
    auto logits = m->impl().forward(at::tensor(seq, at::kLong).view({1, T}), at::arange(T, at::kLong).view({1, T}));
    logits = logits.contiguous();
    const std::int64_t V = logits.size(2);
    const std::size_t P = r->prompt.size();
    for (std::size_t t = 0; t < r->tokens.size(); ++t) {
      std::span<const float> row(logits.data_ptr<float>() + (P - 1 + t) * V, V);
      double expect = token_logprob(row, r->tokens[t], all[i].params.temperature, all[i].params.top_p);
      EXPECT_NEAR(r->logprobs[t], expect, 1e-4) << "request " << i << " token " << t;
    }
  }
}

TEST(Engine, StopStringsMaxTokensAndContext) {
  Tokenizer tok;
  Engine engine({}, {});
  install(engine, model(23), 0);
  const SamplingParams p = exactly(30, 1);
  auto base = submit(engine, tok.encode_prompt("a"), p).future.get();
  ASSERT_TRUE(base);
  ASSERT_EQ(base->tokens.size(), 30u);
  EXPECT_EQ(base->finish, FinishReason::kLength);
  ASSERT_GE(base->text.size(), 6u);
  // Stop on the 4th..5th characters of what this seed generates: the same stream stops there.
  SamplingParams ps = p;
  ps.stop = {base->text.substr(3, 2)};
  auto stopped = submit(engine, tok.encode_prompt("a"), ps).future.get();
  ASSERT_TRUE(stopped);
  EXPECT_EQ(stopped->finish, FinishReason::kStop);
  const auto cut = base->text.find(ps.stop[0]);
  EXPECT_EQ(stopped->text, base->text.substr(0, cut));
  EXPECT_EQ(stopped->tokens.size(), cut + 2);  // the stop string's tokens stay in token ids
  EXPECT_EQ(*stopped->matched_stop, ps.stop[0]);
  // The context bounds prompt + completion.
  SamplingParams pl = p;
  pl.max_tokens = 1000;
  auto longest = submit(engine, std::vector<std::int32_t>(60, 20), pl).future.get();
  ASSERT_TRUE(longest);
  EXPECT_EQ(longest->tokens.size(), 4u);
  EXPECT_EQ(longest->finish, FinishReason::kLength);
  // Invalid requests are refused up front.
  EXPECT_FALSE(engine.submit(std::vector<std::int32_t>(64, 20), p, [](Result<Generation>) {}));
  EXPECT_FALSE(engine.submit({}, p, [](Result<Generation>) {}));
  EXPECT_FALSE(engine.submit({1, 500}, p, [](Result<Generation>) {}));
  SamplingParams bad = p;
  bad.top_p = 0;
  EXPECT_FALSE(engine.submit({1}, bad, [](Result<Generation>) {}));
}

// An engine serving `m` as version 0 whose observer pauses (in `mode`) once `after` tokens have been
// generated.
struct PausingEngine {
  std::promise<void> paused;
  std::atomic<bool> fired{false};
  std::unique_ptr<Engine> engine;
  PausingEngine(PauseMode mode, std::uint64_t after, std::shared_ptr<Model> m) {
    EngineOptions o;
    o.on_step = [this, mode, after](const EngineStats& s) {
      if (s.tokens_generated >= after && !fired.exchange(true)) engine->pause(mode, [this] { paused.set_value(); });
    };
    engine = std::make_unique<Engine>(ModelConfig{}, o);
    install(*engine, std::move(m), 0);
  }
  Submitted submit(const std::string& prompt, SamplingParams params) {
    return reference::submit(*engine, tok.encode_prompt(prompt), std::move(params));
  }
  Tokenizer tok;
};

TEST(Engine, PauseKeepContinuesOnTheNewWeightsAndRecordsSpans) {
  PausingEngine pe(PauseMode::kKeep, 5, model(24));
  auto s = pe.submit("1+1=", exactly(12, 3));
  pe.paused.get_future().wait();
  EXPECT_TRUE(pe.engine->paused());
  EXPECT_EQ(pe.engine->stats().active, 1u);
  install(*pe.engine, model(25), 1);
  EXPECT_EQ(pe.engine->version(), 1);
  pe.engine->resume();
  auto r = s.future.get();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->tokens.size(), 12u);
  EXPECT_EQ(r->version_spans, (std::vector<VersionSpan>{{0, 0}, {1, 5}}));
}

TEST(Engine, PauseAbortFinishesInFlightRequests) {
  PausingEngine pe(PauseMode::kAbort, 3, model(26));
  const SamplingParams p = exactly(20, 4);
  auto s = pe.submit("2+2=", p);
  auto r = s.future.get();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->finish, FinishReason::kAbort);
  EXPECT_EQ(r->tokens.size(), 3u);
  pe.paused.get_future().wait();
  // Paused: a new request queues until resume.
  auto later = pe.submit("3+3=", p);
  EXPECT_EQ(later.future.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  pe.engine->resume();
  auto lr = later.future.get();
  ASSERT_TRUE(lr);
  EXPECT_EQ(lr->tokens.size(), 20u);
}

TEST(Engine, PauseWaitLetsInFlightRequestsFinish) {
  PausingEngine pe(PauseMode::kWait, 2, model(27));
  auto s = pe.submit("4+4=", exactly(9, 5));
  pe.paused.get_future().wait();
  // The pause completed only after the request did.
  ASSERT_EQ(s.future.wait_for(std::chrono::milliseconds(0)), std::future_status::ready);
  auto r = s.future.get();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->finish, FinishReason::kLength);
  EXPECT_EQ(r->tokens.size(), 9u);
  EXPECT_TRUE(pe.engine->paused());
}

TEST(Engine, CancelAndShutdown) {
  Tokenizer tok;
  Engine engine({}, {});
  SamplingParams p;
  p.max_tokens = 5;
  // No model yet: the request waits; cancelling finishes it with "abort".
  Submitted s;
  auto id =
      engine.submit(tok.encode_prompt("x"), p, [pr = s.promise](Result<Generation> r) { pr->set_value(std::move(r)); });
  ASSERT_TRUE(id);
  engine.cancel(*id);
  auto r = s.future.get();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->finish, FinishReason::kAbort);
  EXPECT_TRUE(r->tokens.empty());
  // Shutdown with a request pending: it fails with kCancelled.
  Submitted pending;
  {
    Engine e2({}, {});
    ASSERT_TRUE(e2.submit(tok.encode_prompt("y"), p,
                          [pr = pending.promise](Result<Generation> r) { pr->set_value(std::move(r)); }));
  }
  auto pr = pending.future.get();
  ASSERT_FALSE(pr);
  EXPECT_EQ(pr.error().code(), ErrorCode::kCancelled);
}

}  // namespace
}  // namespace arlo::reference
