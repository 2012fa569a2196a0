"""The policy-gradient loss under a trust-region mask, and the per-step statistics behind it.

    loss = - A * sg(min(pi(a) / mu(a), c)) * m * log pi(a)      (DESIGN.md §1, as in DPPO)

aggregated as a token mean over the response mask. The mask `m` and every logged statistic come
from one no-grad pass over the detached logits; the only pass with a gradient is the fused
cross-entropy that yields log pi(a).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from core.behavior import BehaviorView
from core.divergence import Estimator, Kind, softmax_stats
from core.masks import Mask, ratio_moves_away, trust_region


@dataclass(frozen=True)
class PolicyLossOutput:
    loss: Tensor  # scalar, differentiable
    keep: Tensor  # (N,) bool: the trust-region mask
    log_ratio: Tensor  # (N,) log pi(a) - log mu(a), detached
    stats: dict[str, float]


def _mean(values: Tensor, where: Tensor) -> float:
    count = where.sum()
    return float((values.float() * where).sum() / count) if count > 0 else 0.0


def policy_loss(
    logits: Tensor,
    tokens: Tensor,
    behavior: BehaviorView,
    advantages: Tensor,
    response_mask: Tensor | None = None,
    mask: Mask = "predictive",
    kind: Kind = "tv",
    estimator: Estimator = "topk",
    delta_low: float = 0.15,
    delta_high: float = 0.15,
    is_cap: float = 1e4,
) -> PolicyLossOutput:
    """Loss and statistics for N response tokens (logits (N, V) with grad, any float dtype).

    Statistics (fractions over response tokens):
    masked_fraction[_pos|_neg]: tokens whose gradient the mask removed (all, A > 0, A < 0);
    divergence_mean/max: the estimator's D(mu, pi); direction_disagreement: tokens with A != 0
    where DPPO's ratio direction and the predictive direction (sign of the predicted change of D,
    same estimator) disagree; ratio_mean: pi(a)/mu(a); entropy: H(pi) in nats.
    """
    if is_cap <= 0:
        raise ValueError(f"is_cap must be > 0, got {is_cap}")
    n = tokens.shape[0]
    rmask = (
        torch.ones(n, dtype=torch.bool, device=tokens.device)
        if response_mask is None
        else response_mask.bool()
    )
    if rmask.shape != (n,):
        raise ValueError(f"response_mask must be (N={n},), got {tuple(rmask.shape)}")
    advantages = advantages.float()

    detached = logits.detach()
    stats = softmax_stats(detached, entropy=True)
    region = trust_region(
        detached,
        behavior,
        tokens,
        advantages,
        mask,
        kind,
        estimator,
        delta_low,
        delta_high,
        always_estimate=True,
        stats=stats,
    )
    logp_a = -F.cross_entropy(logits.float(), tokens, reduction="none")  # (N,) with grad
    is_weight = region.log_ratio.exp().clamp(max=is_cap)
    weight = advantages * is_weight * region.keep * rmask
    loss = -(weight * logp_a).sum() / rmask.sum().clamp_min(1)

    assert region.divergence is not None and region.change is not None and stats.entropy is not None
    masked = ~region.keep & rmask
    pos, neg = (advantages > 0) & rmask, (advantages < 0) & rmask
    signed = pos | neg
    disagree = ratio_moves_away(region.log_ratio, advantages) != (region.change > 0)
    d_resp = region.divergence[rmask]
    out = {
        "masked_fraction": _mean(masked, rmask),
        "masked_fraction_pos": _mean(masked, pos),
        "masked_fraction_neg": _mean(masked, neg),
        "divergence_mean": float(d_resp.mean()) if d_resp.numel() else 0.0,
        "divergence_max": float(d_resp.max()) if d_resp.numel() else 0.0,
        "direction_disagreement": _mean(disagree, signed),
        "ratio_mean": _mean(region.log_ratio.exp(), rmask),
        "entropy": _mean(stats.entropy, rmask),
    }
    return PolicyLossOutput(loss=loss, keep=region.keep, log_ratio=region.log_ratio, stats=out)
