"""Off-policy corrections for policy-gradient training on arlo's batches, over torch tensors.

An asynchronous run trains on tokens sampled by an inference engine whose logprobs (the batch's
`inference_logprobs`, log pi_inf) differ from the trainer's (log pi_theta): older weights, another
kernel, another precision. These functions weight or drop tokens by the importance ratio

    r_t = pi_theta(y_t) / pi_inf(y_t) = exp(log pi_theta(y_t) - log pi_inf(y_t))

so a trainer of one's own can import them:

    from arlo.loss import policy_gradient_loss
    loss, metrics = policy_gradient_loss(logp, batch["inference_logprobs"], batch["advantages"],
                                         batch["loss_mask"], correction="token_tis", is_high=2.0)

Every tensor is [B, T] (B sequences of T tokens, padded), float; `mask` is 1 on loss tokens and 0
elsewhere (padding, prompt). Ratios are computed from detached logprobs: the weights carry no
gradient. docs/loss.md gives the formulas, when to use which, and the papers they come from.
"""

from typing import Dict, Optional, Tuple

import torch

CORRECTIONS = ("none", "token_tis", "sequence_tis", "token_mis", "sequence_mis")


def _check(**tensors: torch.Tensor) -> None:
    """Raises ValueError unless every tensor is a 2-D torch.Tensor of the same [B, T] shape."""
    shape = None
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"arlo.loss: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"arlo.loss: {name} must be [batch, tokens], got shape {tuple(t.shape)}")
        if shape is None:
            shape, first = t.shape, name
        elif t.shape != shape:
            raise ValueError(f"arlo.loss: {name} has shape {tuple(t.shape)}, {first} has {tuple(shape)}; "
                             "they must match")


def log_ratio(logprobs: torch.Tensor, inference_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log r_t = (log pi_theta(y_t) - log pi_inf(y_t)) * m_t, detached; 0 off the loss tokens."""
    _check(logprobs=logprobs, inference_logprobs=inference_logprobs, mask=mask)
    return (logprobs.detach().float() - inference_logprobs.float()) * mask.float()


def _sequence_log_ratio(lr: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log R_i = sum_t log r_it * m_it, as [B, 1] (broadcasts over the tokens)."""
    return (lr * mask).sum(dim=-1, keepdim=True)


def token_tis(lr: torch.Tensor, mask: torch.Tensor, high: float) -> torch.Tensor:
    """Token-level truncated IS: w_t = min(r_t, high) * m_t."""
    _check(log_ratio=lr, mask=mask)
    return torch.exp(lr).clamp(max=high) * mask


def sequence_tis(lr: torch.Tensor, mask: torch.Tensor, high: float) -> torch.Tensor:
    """Sequence-level truncated IS: w_it = min(R_i, high) * m_it with R_i = prod_t r_it."""
    _check(log_ratio=lr, mask=mask)
    return torch.exp(_sequence_log_ratio(lr, mask)).clamp(max=high) * mask


def band_mask(lr: torch.Tensor, mask: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Keeps a token iff its ratio stays in the band: k_t = m_t * [low <= r_t <= high]."""
    _check(log_ratio=lr, mask=mask)
    r = torch.exp(lr)
    return ((r >= low) & (r <= high)).float() * mask


def token_mis(lr: torch.Tensor, mask: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Token-level masked IS: w_t = r_t * m_t * [low <= r_t <= high] (out-of-band tokens dropped, not capped)."""
    return torch.exp(lr) * band_mask(lr, mask, low, high)


def sequence_mis(lr: torch.Tensor, mask: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Sequence-level masked IS: w_it = R_i * m_it * [low <= R_i <= high], R_i = prod_t r_it."""
    _check(log_ratio=lr, mask=mask)
    big_r = torch.exp(_sequence_log_ratio(lr, mask))
    return big_r * ((big_r >= low) & (big_r <= high)).float() * mask


def geometric_mean_mask(lr: torch.Tensor, mask: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Keeps sequence i iff its geometric-mean ratio G_i = exp(sum_t log r_it * m_it / sum_t m_it)
    lies in [low, high]; k_it = m_it * [low <= G_i <= high]. A sequence without loss tokens has G = 1."""
    _check(log_ratio=lr, mask=mask)
    n = mask.sum(dim=-1, keepdim=True).clamp(min=1.0)
    g = torch.exp(_sequence_log_ratio(lr, mask) / n)
    return ((g >= low) & (g <= high)).float() * mask


def per_token_mismatch_kl(logprobs: torch.Tensor, inference_logprobs: torch.Tensor,
                          mask: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(pi_inf || pi_theta) per token, sampled from pi_inf: with d_t = log pi_inf -
    log pi_theta, k_t = (exp(-d_t) - 1 + d_t) * m_t (>= 0, 0 where the two agree)."""
    d = -log_ratio(logprobs, inference_logprobs, mask)
    return (torch.exp(-d) - 1 + d) * mask


def mismatch_kl(logprobs: torch.Tensor, inference_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of the per-token k3 mismatch KL over the loss tokens: sum_t k_t / max(1, sum_t m_t)."""
    return per_token_mismatch_kl(logprobs, inference_logprobs, mask).sum() / mask.float().sum().clamp(min=1.0)


def trust_region_mask(logprobs: torch.Tensor, inference_logprobs: torch.Tensor, mask: torch.Tensor,
                      max_kl: float) -> torch.Tensor:
    """Keeps sequence i iff its mean per-token mismatch KL, KL_i = sum_t k_it / max(1, sum_t m_it),
    is at most max_kl: k_it = m_it * [KL_i <= max_kl]."""
    k = per_token_mismatch_kl(logprobs, inference_logprobs, mask)
    kl_seq = k.sum(dim=-1, keepdim=True) / mask.float().sum(dim=-1, keepdim=True).clamp(min=1.0)
    return (kl_seq <= max_kl).float() * mask.float()


def entropy(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean entropy of the predicted distributions over the loss tokens:
    H = sum_t m_t * (-sum_v p_tv log p_tv) / max(1, sum_t m_t), with p = softmax(logits [B, T, V])."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or logits.shape[:2] != mask.shape:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"arlo.loss: logits must be [batch, tokens, vocab] matching mask {tuple(mask.shape)}, "
                         f"got {shape}")
    logp = torch.log_softmax(logits.detach().float(), dim=-1)
    h = -(logp.exp() * logp).sum(dim=-1)
    return (h * mask).sum() / mask.float().sum().clamp(min=1.0)


def _weights(lr, mask, correction, is_low, is_high):
    if correction == "none":
        return mask.clone()
    if correction == "token_tis":
        return token_tis(lr, mask, is_high)
    if correction == "sequence_tis":
        return sequence_tis(lr, mask, is_high)
    if correction == "token_mis":
        return token_mis(lr, mask, is_low, is_high)
    if correction == "sequence_mis":
        return sequence_mis(lr, mask, is_low, is_high)
    raise ValueError(f"arlo.loss: unknown correction '{correction}'; one of {', '.join(CORRECTIONS)}")


def policy_gradient_loss(logprobs: torch.Tensor, inference_logprobs: torch.Tensor, advantages: torch.Tensor,
                         loss_mask: torch.Tensor, *, correction: str = "token_tis", is_low: float = 0.0,
                         is_high: float = 2.0, band: Optional[Tuple[float, float]] = None,
                         geometric_band: Optional[Tuple[float, float]] = None, max_kl: Optional[float] = None,
                         normalizer: Optional[float] = None,
                         logits: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Dict[str, float]]:
    """The importance-weighted policy-gradient loss of arlo's batch fields:

        L = -sum_t w_t * k_t * A_t * log pi_theta(y_t) * m_t / N

    w: the `correction`'s weights (none: w = m; token_tis/sequence_tis capped at is_high;
    token_mis/sequence_mis dropped outside [is_low, is_high]); k: the product of the optional masks
    (band: band_mask; geometric_band: geometric_mean_mask; max_kl: trust_region_mask), 1 without
    them; N: `normalizer` (e.g. the step's loss tokens over all ranks), else max(1, sum_t m_t).
    Gradients flow through log pi_theta only.

    Metrics: mismatch_kl (mean k3 over the loss tokens), clipped_frac (loss tokens whose ratio a
    truncated correction capped), masked_frac (loss tokens given weight 0 by a mask or a masked
    correction), entropy (when logits [B, T, V] are given)."""
    _check(logprobs=logprobs, inference_logprobs=inference_logprobs, advantages=advantages, loss_mask=loss_mask)
    mask = loss_mask.float()
    lr = log_ratio(logprobs, inference_logprobs, mask)
    w = _weights(lr, mask, correction, is_low, is_high)
    keep = mask.clone()
    if band is not None:
        keep = keep * band_mask(lr, mask, band[0], band[1])
    if geometric_band is not None:
        keep = keep * geometric_mean_mask(lr, mask, geometric_band[0], geometric_band[1])
    if max_kl is not None:
        keep = keep * trust_region_mask(logprobs, inference_logprobs, mask, max_kl)
    n = float(normalizer) if normalizer is not None else max(1.0, float(mask.sum()))
    loss = -(w * keep * advantages.float() * logprobs.float() * mask).sum() / max(n, 1e-12)
    tokens = max(1.0, float(mask.sum()))
    if correction == "token_tis":
        clipped = (torch.exp(lr) > is_high).float() * mask
    elif correction == "sequence_tis":
        clipped = (torch.exp(_sequence_log_ratio(lr, mask)) > is_high).float() * mask
    else:
        clipped = torch.zeros_like(mask)
    masked = ((w * keep) == 0).float() * mask if correction.endswith("mis") else (keep == 0).float() * mask
    metrics = {"mismatch_kl": float(mismatch_kl(logprobs, inference_logprobs, mask)),
               "clipped_frac": float(clipped.sum()) / tokens, "masked_frac": float(masked.sum()) / tokens}
    if logits is not None:
        metrics["entropy"] = float(entropy(logits, mask))
    return loss, metrics
