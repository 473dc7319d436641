#pragma once
// Token sampling on the host, one request at a time, so a request's tokens depend only on its own
// logits and its own random stream, never on which other requests shared the batch.
//
// The reported logprob is the token's log-probability under the distribution actually sampled
// from: softmax(logits / temperature), restricted to the top_p nucleus and renormalised.
// temperature == 0 means greedy (argmax, lowest id on ties); its distribution is a point mass, so
// the logprob reported is the one under the untempered softmax (temperature 1, full vocabulary),
// which is what a trainer can recompute.
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/vocabulary.h"

namespace arlo::reference {

// A request's sampling parameters are the shared vocabulary's SamplingParams (common/vocabulary.h).
// The engine reads temperature, top_p, max_tokens, seed (absent: a stream drawn from the engine's
// seed), stop, ignore_eos and top_logprobs; n and logprobs are the OpenAI layer's.

// splitmix64 finaliser: spreads (seed, stream) pairs into independent-looking 64-bit seeds.
std::uint64_t mix_seed(std::uint64_t seed, std::uint64_t stream);

// One request's random stream.
class SamplerRng {
 public:
  explicit SamplerRng(std::uint64_t seed) : engine_(seed) {}
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

 private:
  std::mt19937_64 engine_;
};

struct SampledToken {
  std::int32_t token = 0;
  float logprob = 0.0f;
};

// Draws one token from `logits` (one row, vocabulary-sized).
SampledToken sample_token(std::span<const float> logits, double temperature, double top_p, SamplerRng& rng);

// The log-probability sample_token would report for `token` (greedy: untempered softmax), or
// -infinity when top_p excludes it.
double token_logprob(std::span<const float> logits, std::int32_t token, double temperature, double top_p);

// The k most likely tokens of the sampling distribution (same definition as above), most likely
// first; tokens outside the nucleus are left out.
std::vector<std::pair<std::int32_t, float>> top_logprobs(std::span<const float> logits, double temperature,
                                                         double top_p, int k);

}  // namespace arlo::reference
