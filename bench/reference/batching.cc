// arlo-bench-batching: tokens/s of the built-in engine serving N concurrent requests with
// continuous batching, against serving the same requests one at a time, measured in one run on the
// same model and thread count. Prints both and their ratio.
//
//   arlo-bench-batching [--requests 64] [--max-tokens 48] [--threads 1] [--repeats 3]
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <future>
#include <latch>
#include <string>
#include <vector>

#include "reference/engine.h"

using namespace arlo::reference;

namespace {

struct Run {
  double seconds = 0;
  std::uint64_t tokens = 0;
};

std::vector<std::vector<std::int32_t>> prompts(int n) {
  Tokenizer tok;
  std::vector<std::vector<std::int32_t>> out;
  for (int i = 0; i < n; ++i)
    out.push_back(tok.encode_prompt(std::to_string(i % 50) + "+" + std::to_string(i * 7 % 50) + "="));
  return out;
}

arlo::SamplingParams params(int i, int max_tokens) {
  arlo::SamplingParams p;
  p.seed = static_cast<std::uint64_t>(i);
  p.max_tokens = max_tokens;
  p.ignore_eos = true;  // every request generates exactly max_tokens: both modes do the same work
  return p;
}

Run batched(Engine& engine, const std::vector<std::vector<std::int32_t>>& ps, int max_tokens) {
  std::latch done(static_cast<std::ptrdiff_t>(ps.size()));
  std::atomic<std::uint64_t> tokens{0};
  auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < ps.size(); ++i)
    (void)engine.submit(ps[i], params(static_cast<int>(i), max_tokens), [&](arlo::Result<Generation> g) {
      if (g) tokens += g->tokens.size();
      done.count_down();
    });
  done.wait();
  return {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), tokens.load()};
}

Run one_at_a_time(Engine& engine, const std::vector<std::vector<std::int32_t>>& ps, int max_tokens) {
  Run r;
  auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < ps.size(); ++i) {
    std::promise<std::size_t> p;
    (void)engine.submit(ps[i], params(static_cast<int>(i), max_tokens),
                        [&](arlo::Result<Generation> g) { p.set_value(g ? g->tokens.size() : 0); });
    r.tokens += p.get_future().get();
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int requests = 64, max_tokens = 48, threads = 1, repeats = 3;
  CLI::App app{"continuous batching vs one request at a time"};
  app.add_option("--requests", requests);
  app.add_option("--max-tokens", max_tokens);
  app.add_option("--threads", threads);
  app.add_option("--repeats", repeats, "best of this many runs per mode");
  CLI11_PARSE(app, argc, argv);

  ModelConfig config;
  auto model = Model::init(config, 1);
  if (!model) return 1;
  EngineOptions eo;
  eo.max_batch = requests;
  eo.threads = threads;
  Engine engine(config, eo);
  std::promise<void> applied;
  (void)engine.set_model(*model, 0, [&] { applied.set_value(); });
  applied.get_future().wait();
  auto ps = prompts(requests);
  if (max_tokens + 8 > config.context) max_tokens = config.context - 8;

  (void)batched(engine, ps, 4);  // warm-up
  Run best_batched, best_single;
  for (int i = 0; i < repeats; ++i) {
    Run b = batched(engine, ps, max_tokens);
    Run s = one_at_a_time(engine, ps, max_tokens);
    if (best_batched.seconds == 0 || b.seconds < best_batched.seconds) best_batched = b;
    if (best_single.seconds == 0 || s.seconds < best_single.seconds) best_single = s;
  }
  const double tb = best_batched.tokens / best_batched.seconds;
  const double ts = best_single.tokens / best_single.seconds;
  std::printf("batching: %d requests x %d tokens, model %d layers x %d wide, %d thread(s), best of %d\n", requests,
              max_tokens, config.layers, config.hidden, threads, repeats);
  std::printf("one at a time:        %10.0f tokens/s  (%.3f s)\n", ts, best_single.seconds);
  std::printf("continuous batching:  %10.0f tokens/s  (%.3f s)\n", tb, best_batched.seconds);
  std::printf("ratio: %.2fx\n", tb / ts);
  return 0;
}
