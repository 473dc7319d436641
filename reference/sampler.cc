#include "reference/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace arlo::reference {
namespace {

// The sampling distribution: unnormalised weights over `kept` ids (in the order the sampler walks
// them) and their sum. Computed in double so rounding cannot depend on anything but the row.
struct Distribution {
  std::vector<double> weight;      // exp(z_i - max z), for every id
  std::vector<std::int32_t> kept;  // ids in the nucleus, walk order
  double kept_sum = 0.0;
};

Distribution distribution(std::span<const float> logits, double temperature, double top_p) {
  Distribution d;
  const std::size_t n = logits.size();
  const double t = temperature > 0 ? temperature : 1.0;
  double m = -std::numeric_limits<double>::infinity();
  for (float x : logits) m = std::max(m, static_cast<double>(x) / t);
  d.weight.resize(n);
  double total = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    d.weight[i] = std::exp(static_cast<double>(logits[i]) / t - m);
    total += d.weight[i];
  }
  d.kept.resize(n);
  std::iota(d.kept.begin(), d.kept.end(), 0);
  if (temperature > 0 && top_p < 1.0) {
    std::stable_sort(d.kept.begin(), d.kept.end(),
                     [&](std::int32_t a, std::int32_t b) { return d.weight[a] > d.weight[b]; });
    double cum = 0.0;
    std::size_t keep = 0;
    while (keep < n) {
      cum += d.weight[d.kept[keep]];
      ++keep;
      if (cum >= top_p * total) break;
    }
    d.kept.resize(keep);
    d.kept_sum = cum;
  } else {
    d.kept_sum = total;
  }
  return d;
}

}  // namespace

std::uint64_t mix_seed(std::uint64_t seed, std::uint64_t stream) {
  std::uint64_t z = seed + 0x9e3779b97f4a7c15ull * (stream + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

SampledToken sample_token(std::span<const float> logits, double temperature, double top_p, SamplerRng& rng) {
  if (temperature <= 0) {
    auto best = std::max_element(logits.begin(), logits.end());
    auto token = static_cast<std::int32_t>(best - logits.begin());
    return {token, static_cast<float>(token_logprob(logits, token, 0.0, 1.0))};
  }
  Distribution d = distribution(logits, temperature, top_p);
  const double target = rng.uniform() * d.kept_sum;
  double cum = 0.0;
  std::int32_t token = d.kept.back();
  for (std::int32_t id : d.kept) {
    cum += d.weight[id];
    if (target < cum) {
      token = id;
      break;
    }
  }
  return {token, static_cast<float>(std::log(d.weight[token] / d.kept_sum))};
}

double token_logprob(std::span<const float> logits, std::int32_t token, double temperature, double top_p) {
  if (token < 0 || static_cast<std::size_t>(token) >= logits.size()) return -std::numeric_limits<double>::infinity();
  Distribution d = distribution(logits, temperature, temperature > 0 ? top_p : 1.0);
  if (std::find(d.kept.begin(), d.kept.end(), token) == d.kept.end()) return -std::numeric_limits<double>::infinity();
  return std::log(d.weight[token] / d.kept_sum);
}

std::vector<std::pair<std::int32_t, float>> top_logprobs(std::span<const float> logits, double temperature,
                                                         double top_p, int k) {
  std::vector<std::pair<std::int32_t, float>> out;
  if (k <= 0) return out;
  Distribution d = distribution(logits, temperature, temperature > 0 ? top_p : 1.0);
  std::vector<std::int32_t> ids = d.kept;
  std::stable_sort(ids.begin(), ids.end(), [&](std::int32_t a, std::int32_t b) { return d.weight[a] > d.weight[b]; });
  if (ids.size() > static_cast<std::size_t>(k)) ids.resize(static_cast<std::size_t>(k));
  for (auto id : ids) out.emplace_back(id, static_cast<float>(std::log(d.weight[id] / d.kept_sum)));
  return out;
}

}  // namespace arlo::reference
