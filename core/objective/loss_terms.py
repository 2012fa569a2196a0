"""The policy loss from log pi(a) on, and its statistics: what both paths of the loss share.

`core.objective.loss.policy_loss` takes the logits; `core.objective.fused.fused_policy_loss` the
hidden states and the output projection, one vocabulary chunk at a time. They differ only in how
they get log pi(a), the trust region and the softmax statistics; the checks of their inputs, the
loss itself and every logged statistic are here. Apart from both so that `policy_loss` can hand a
`ProjectedLogits` to the fused path and the fused path can use this, neither importing the other.

Telemetry that can be trusted on-policy: the two direction rules (DPPO's sampled ratio and the
sign of the predicted change of D) are only compared where D exceeds `DIRECTION_TOLERANCE`, below
which both signs are fp32 rounding; the comparison past delta, where the two masks actually
decide differently, is a metric of its own, and so are the two set differences of the masks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from core.objective.divergence import SoftmaxStats
from core.objective.masks import (
    MaskDecision,
    TrustRegion,
    far_from_behavior,
    ratio_moves_away,
)

DIRECTION_TOLERANCE = 1e-4
"""D below which `direction_disagreement` does not compare the two direction rules.

On-policy in fp32 the estimated D is rounding, of the same size for TV and both KLs (each a sum
of first-order terms m_i * relative rounding): at most 9e-7 over 512 synthetic positions of a
2000-token vocabulary for every kind and estimator, with logits shifted by up to 60 (the
magnitude of language-model logits) alike, and 3e-7 in the trainer's on-policy runs
(tests/core/test_on_policy.py). Neither the ratio's sign nor the predicted change's means
anything there. 1e-4 is 100 times that and 500 to 1500 times below the thresholds the masks use
(published delta 0.05 for KL, 0.15 for TV), so every token that could come near a mask decision
is still compared. A real model's cached decode and its training forward can differ by more
than rounding (other kernels, other reduction orders); past 1e-4 that is a genuine pi/mu
difference and is counted."""


@dataclass(frozen=True)
class PolicyLossOutput:
    loss: Tensor  # scalar, differentiable
    keep: Tensor  # (N,) bool: the trust-region mask
    log_ratio: Tensor  # (N,) log pi(a) - log mu(a), detached
    stats: dict[str, float]
    # the tokens a stat is a mean over, where not all the response tokens (the A > 0 ones for
    # masked_fraction_pos, ...): pieces, minibatches and ranks add up each stat by its own count
    counts: dict[str, float] = field(default_factory=dict)


def _aggregate(terms: Tensor, rmask: Tensor, normalizer: float | Tensor | None) -> Tensor:
    """The sum of the response tokens' `terms` (N,) over the normalizer (see `policy_loss`)."""
    if normalizer is None:
        return (terms * rmask).sum() / rmask.sum().clamp_min(1)
    if isinstance(normalizer, Tensor):
        return (terms * rmask / normalizer).sum()
    return (terms * rmask).sum() / normalizer


def _mean(values: Tensor, where: Tensor) -> float:
    count = where.sum()
    return float((values.float() * where).sum() / count) if count > 0 else 0.0


def check_loss_inputs(
    tokens: Tensor,
    region: TrustRegion,
    *,
    response_mask: Tensor | None,
    ref_logprobs: Tensor | None,
    normalizer: float | Tensor | None,
) -> Tensor:
    """The checks both loss paths make before any pass over the vocabulary; the (N,) bool
    response mask."""
    if region.kl_beta > 0 and ref_logprobs is None:
        raise ValueError("kl_beta > 0 needs ref_logprobs, the reference policy's log-probs")
    n = tokens.shape[0]
    rmask = (
        torch.ones(n, dtype=torch.bool, device=tokens.device)
        if response_mask is None
        else response_mask.bool()
    )
    if rmask.shape != (n,):
        raise ValueError(f"response_mask must be (N={n},), got {tuple(rmask.shape)}")
    if isinstance(normalizer, Tensor) and normalizer.shape != (n,):
        raise ValueError(f"a tensor normalizer must be (N={n},), got {tuple(normalizer.shape)}")
    if ref_logprobs is not None and ref_logprobs.shape != (n,):
        raise ValueError(f"ref_logprobs must be (N={n},), got {tuple(ref_logprobs.shape)}")
    return rmask


def loss_from_logprobs(
    logp_a: Tensor,
    decision: MaskDecision,
    stats: SoftmaxStats,
    advantages: Tensor,
    rmask: Tensor,
    *,
    region: TrustRegion,
    ref_logprobs: Tensor | None,
    normalizer: float | Tensor | None,
    outside: Tensor | None = None,
) -> PolicyLossOutput:
    """The loss from log pi(a) (N,), the only term with a gradient, and the statistics from
    the mask's pass: shared by the unfused and the fused path, which differ only in how they
    get `logp_a`, `decision` and `stats`. `outside` (N,): whether each sampled token lies outside
    pi's top-K (K of the behavior view), for `outside_topk`."""
    is_weight = decision.log_ratio.exp().clamp(max=region.is_cap)
    weight = advantages * is_weight * decision.keep * rmask
    loss = _aggregate(weight * logp_a, rmask, normalizer).neg()
    k3: Tensor | None = None
    if ref_logprobs is not None:
        d = ref_logprobs.float() - logp_a  # (N,) with grad through log pi(a)
        k3 = torch.where(rmask, torch.expm1(d) - d, 0.0)  # expm1: no cancellation near d = 0
        if region.kl_beta > 0:
            loss = loss + region.kl_beta * _aggregate(k3, rmask, normalizer)

    assert decision.divergence is not None and decision.change is not None
    assert stats.entropy is not None
    masked = ~decision.keep & rmask
    pos, neg = (advantages > 0) & rmask, (advantages < 0) & rmask
    signed = pos | neg
    # the two direction rules and the two masks, from the same D, g and ratio as the mask itself
    ratio_away = ratio_moves_away(decision.log_ratio, advantages)
    change_away = decision.change > 0
    disagree = ratio_away != change_away
    far = far_from_behavior(decision.divergence, advantages, region) & rmask
    judged = decision.divergence > DIRECTION_TOLERANCE
    d_resp = decision.divergence[rmask]
    out = {
        "masked_fraction": _mean(masked, rmask),
        "masked_fraction_pos": _mean(masked, pos),
        "masked_fraction_neg": _mean(masked, neg),
        "divergence_mean": float(d_resp.mean()) if d_resp.numel() else 0.0,
        "divergence_max": float(d_resp.max()) if d_resp.numel() else 0.0,
        "direction_disagreement": _mean(disagree & judged, signed),
        "direction_disagreement_far": _mean(disagree & far, signed),
        "masked_only_predictive": _mean(far & change_away & ~ratio_away, rmask),
        "masked_only_dppo": _mean(far & ratio_away & ~change_away, rmask),
        "ratio_mean": _mean(decision.log_ratio.exp(), rmask),
        "entropy": _mean(stats.entropy, rmask),
    }
    if outside is not None:
        out["outside_topk"] = _mean(outside, rmask)
    if k3 is not None:
        out["kl_ref"] = _mean(k3.detach(), rmask)
    n_pos, n_neg, n_signed = (float(m.sum()) for m in (pos, neg, signed))
    counts = {
        "masked_fraction_pos": n_pos,
        "masked_fraction_neg": n_neg,
        "direction_disagreement": n_signed,
        "direction_disagreement_far": n_signed,
    }
    return PolicyLossOutput(
        loss=loss, keep=decision.keep, log_ratio=decision.log_ratio, stats=out, counts=counts
    )
