#pragma once
// The policy-gradient loss of the built-in trainer (torch-facing header).
//
// Per token t of a packed batch (tokens predicted from the previous position of the same sequence):
//   logp_t      trainer log-probability of the token, log_softmax(logits_{t-1} / temperature)[token_t]
//   q_t         inference log-probability (from the worker that sampled it)
//   rho_t       exp(logp_t - q_t), the trainer/inference importance ratio (no gradient through it)
//   w_t         the importance-sampling correction's weight (no gradient), by is_correction:
//                 none       1
//                 token_tis  min(rho_t, is_high)                          (truncated IS, per token)
//                 seq_tis    min(exp(sum_{u in seq, masked} (logp_u - q_u)), is_high), shared by the sequence
//                 token_mis  1 if is_low <= rho_t <= is_high, else 0       (masked IS)
//   pg_t        -w_t * A_t * logp_t           (so the gradient is -w_t * A_t * grad logp_t)
// pg_loss = sum_t m_t * pg_t / sum_t m_t over loss_mask tokens m (0 when there are none);
// ce_loss = sum_t c_t * (-logp_t) / sum_t c_t over ce_weights c (0 when absent or all zero);
// loss = pg_loss + ce_coef * ce_loss.
// A token that starts a sequence (position_ids == 0) has no prediction and never counts.
//
// Metrics over loss_mask tokens: mismatch_kl = mean(rho - 1 - log rho) (the k3 estimator of
// KL(inference || trainer) from samples of the inference policy), clipped_fraction = share of
// tokens whose weight the correction changed (truncated or masked), entropy = mean entropy of the
// trainer's full next-token distribution.
#include <ATen/ATen.h>

#include <optional>
#include <string_view>

#include "common/result.h"

namespace arlo::reference {

enum class IsCorrection { kNone, kTokenTis, kSeqTis, kTokenMis };
std::optional<IsCorrection> parse_is_correction(std::string_view name);  // none | token_tis | seq_tis | token_mis
std::string_view to_string(IsCorrection c);

struct LossOptions {
  // The importance-sampling correction and its bounds (the config's trainer.is_correction,
  // trainer.is_low and trainer.is_high).
  IsCorrection is_correction = IsCorrection::kTokenTis;
  double is_low = 0.5;       // token_mis: keep tokens with ratio in [is_low, is_high]
  double is_high = 2.0;      // token_tis and seq_tis: ratio cap; token_mis: top of the band
  double ce_coef = 1.0;      // weight of the cross-entropy term
  double temperature = 1.0;  // the sampling temperature the inference logprobs were taken at
};

// All [B, T]; logits [B, T, V] (with gradient). input_ids/position_ids int64; the rest float
// (loss_mask may be any dtype: nonzero = trained).
struct LossInputs {
  at::Tensor logits;
  at::Tensor input_ids;
  at::Tensor position_ids;
  at::Tensor loss_mask;
  at::Tensor advantages;
  at::Tensor inference_logprobs;
  std::optional<at::Tensor> ce_weights;
};

struct LossOutput {
  at::Tensor loss;  // scalar, differentiable
  double pg_loss = 0;
  double ce_loss = 0;
  double mismatch_kl = 0;
  double clipped_fraction = 0;       // clipped_low_fraction + clipped_high_fraction
  double clipped_low_fraction = 0;   // token_mis: ratio below is_low (masked)
  double clipped_high_fraction = 0;  // ratio above is_high (truncated or masked)
  double entropy = 0;
  std::int64_t pg_tokens = 0;
  std::int64_t ce_tokens = 0;
};

// Trainer log-probabilities per token [B, T] (0 where a token starts a sequence) and the mask of
// tokens that have a prediction.
struct TokenLogprobs {
  at::Tensor logp;
  at::Tensor valid;    // bool [B, T]
  at::Tensor entropy;  // [B, T], no gradient
};
TokenLogprobs token_logprobs(const at::Tensor& logits, const at::Tensor& input_ids, const at::Tensor& position_ids,
                             double temperature = 1.0);

Result<LossOutput> compute_loss(const LossInputs& in, const LossOptions& options);

}  // namespace arlo::reference
