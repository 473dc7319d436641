#include "reference/loss.h"

#include <fmt/format.h>

#include "common/enum_names.h"

namespace arlo::reference {

namespace {
constexpr EnumName<IsCorrection> kIsCorrections[] = {{IsCorrection::kNone, "none"},
                                                     {IsCorrection::kTokenTis, "token_tis"},
                                                     {IsCorrection::kSeqTis, "seq_tis"},
                                                     {IsCorrection::kTokenMis, "token_mis"}};
}  // namespace

std::optional<IsCorrection> parse_is_correction(std::string_view name) { return enum_value(kIsCorrections, name); }

std::string_view to_string(IsCorrection c) { return enum_name(kIsCorrections, c); }

TokenLogprobs token_logprobs(const at::Tensor& logits, const at::Tensor& input_ids, const at::Tensor& position_ids,
                             double temperature) {
  const std::int64_t B = logits.size(0), T = logits.size(1);
  auto scaled = temperature == 1.0 ? logits : logits / temperature;
  auto logsm = at::log_softmax(scaled.narrow(1, 0, T - 1), -1);  // predicts 1..T-1
  auto targets = input_ids.narrow(1, 1, T - 1).to(at::kLong).unsqueeze(-1);
  auto picked = logsm.gather(-1, targets).squeeze(-1);  // [B, T-1]
  auto zero = at::zeros({B, 1}, picked.options());
  auto logp = at::cat({zero, picked}, 1);
  auto valid = position_ids.to(at::kLong) != 0;
  valid.narrow(1, 0, 1).fill_(false);
  logp = logp * valid.to(logp.scalar_type());
  at::Tensor entropy;
  {
    at::NoGradGuard no_grad;
    auto ent = -(logsm.exp() * logsm).sum(-1);
    entropy = at::cat({at::zeros({B, 1}, ent.options()), ent}, 1) * valid.to(ent.scalar_type());
  }
  return {logp, valid, entropy};
}

Result<LossOutput> compute_loss(const LossInputs& in, const LossOptions& o) {
  try {
    if (in.logits.dim() != 3) return make_error(ErrorCode::kInvalidArgument, "loss: logits must be [B, T, V]");
    const auto shape = in.input_ids.sizes();
    for (const at::Tensor* t : {&in.position_ids, &in.loss_mask, &in.advantages, &in.inference_logprobs})
      if (t->sizes() != shape)
        return make_error(ErrorCode::kInvalidArgument,
                          fmt::format("loss: every per-token tensor must be [{}]", fmt::join(shape, ", ")));
    if (in.logits.size(0) != shape[0] || in.logits.size(1) != shape[1])
      return make_error(ErrorCode::kInvalidArgument, "loss: logits do not match input_ids");
    if (in.ce_weights && in.ce_weights->sizes() != shape)
      return make_error(ErrorCode::kInvalidArgument, "loss: ce_weights must match input_ids");

    TokenLogprobs tl = token_logprobs(in.logits, in.input_ids, in.position_ids, o.temperature);
    auto mask = (in.loss_mask != 0) & tl.valid;
    auto m = mask.to(at::kFloat);
    const double n = m.sum().item<double>();
    auto adv = in.advantages.to(at::kFloat);
    auto q = in.inference_logprobs.to(at::kFloat);

    LossOutput out;
    at::Tensor pg = at::zeros({}, at::kFloat);
    {
      auto logp_d = tl.logp.detach();
      auto log_ratio = (logp_d - q) * m;
      auto rho = log_ratio.exp();
      at::Tensor w;
      // Tokens whose weight the correction changed: below the band (masked) or above the cap.
      at::Tensor low = at::zeros_like(rho, at::kBool);
      at::Tensor high = at::zeros_like(rho, at::kBool);
      switch (o.is_correction) {
        case IsCorrection::kNone: w = at::ones_like(rho); break;
        case IsCorrection::kTokenTis:
          w = rho.clamp_max(o.is_high);
          high = rho > o.is_high;
          break;
        case IsCorrection::kTokenMis:
          low = rho < o.is_low;
          high = rho > o.is_high;
          w = (~(low | high)).to(at::kFloat);
          break;
        case IsCorrection::kSeqTis: {
          // Sequence ids over the flattened batch: a sequence starts at position 0 or at a row start.
          auto starts = (in.position_ids.to(at::kLong) == 0);
          starts.narrow(1, 0, 1).fill_(true);
          auto seg = at::cumsum(starts.reshape({-1}).to(at::kLong), 0) - 1;
          const std::int64_t nseg = seg.numel() == 0 ? 0 : seg[-1].item<std::int64_t>() + 1;
          auto seq_log_ratio = at::zeros({nseg}, at::kFloat).index_add_(0, seg, log_ratio.reshape({-1}));
          auto seq_rho = seq_log_ratio.exp().index_select(0, seg).view(rho.sizes());
          w = seq_rho.clamp_max(o.is_high);
          high = seq_rho > o.is_high;
          break;
        }
      }
      if (n > 0) {
        pg = -(w * adv * tl.logp * m).sum() / n;
        out.mismatch_kl = ((rho - 1.0 - log_ratio) * m).sum().item<double>() / n;
        out.clipped_low_fraction = (low.to(at::kFloat) * m).sum().item<double>() / n;
        out.clipped_high_fraction = (high.to(at::kFloat) * m).sum().item<double>() / n;
        out.clipped_fraction = out.clipped_low_fraction + out.clipped_high_fraction;
        out.entropy = (tl.entropy * m).sum().item<double>() / n;
      } else {
        pg = (tl.logp * m).sum();  // 0, in the graph: nothing in the loss (every sample masked) steps on zero grads
      }
    }
    at::Tensor ce = at::zeros({}, at::kFloat);
    if (in.ce_weights) {
      auto c = in.ce_weights->to(at::kFloat) * tl.valid.to(at::kFloat);
      const double csum = c.sum().item<double>();
      out.ce_tokens = (c > 0).sum().item<std::int64_t>();
      if (csum > 0) ce = -(c * tl.logp).sum() / csum;
    }
    out.pg_tokens = static_cast<std::int64_t>(n);
    out.pg_loss = pg.item<double>();
    out.ce_loss = ce.item<double>();
    out.loss = pg + o.ce_coef * ce;
    return out;
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kInternal, fmt::format("loss: libtorch: {}", e.what()));
  }
}

}  // namespace arlo::reference
