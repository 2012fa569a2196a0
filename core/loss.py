"""The policy-gradient loss under a trust-region mask, and the per-step statistics behind it.

    loss = - A * sg(min(pi(a) / mu(a), c)) * m * log pi(a)      (DESIGN.md §1, as in DPPO)
         + beta * k3(pi_ref(a), pi(a))                          (optional KL to a reference)

aggregated as a token mean over the response mask. The mask `m` and every logged statistic come
from one no-grad pass over the detached logits; the only pass with a gradient is the fused
cross-entropy that yields log pi(a).

The KL penalty is GRPO's (and TRL's): per sampled token the k3 estimator of KL(pi || pi_ref),
`exp(d) - d - 1` with `d = log pi_ref(a) - log pi(a)`, non-negative, 0 where the two agree, and
unbiased for the KL since the tokens come from (nearly) pi. It is averaged over the same tokens
and with the same denominator as the policy term, and the trust-region mask does not touch it:
the mask limits how far one step moves from the behavior policy, the penalty how far the run
drifts from where it started.

`normalizer` lets a caller split one minibatch into micro-batches (gradient accumulation): each
piece divides by the token count of the whole minibatch, so the summed gradients equal the
unsplit one.
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
    ref_logprobs: Tensor | None = None,
    kl_beta: float = 0.0,
    normalizer: float | None = None,
) -> PolicyLossOutput:
    """Loss and statistics for N response tokens (logits (N, V) with grad, any float dtype).

    `ref_logprobs` (N,): log pi_ref(a) of the reference policy; with `kl_beta` > 0 the k3
    penalty is added (β = 0 adds nothing: the loss is bit for bit the unpenalized one).
    `normalizer`: divide the token sums by this count instead of the response tokens here.

    Statistics (fractions over response tokens):
    masked_fraction[_pos|_neg]: tokens whose gradient the mask removed (all, A > 0, A < 0);
    divergence_mean/max: the estimator's D(mu, pi); direction_disagreement: tokens with A != 0
    where DPPO's ratio direction and the predictive direction (sign of the predicted change of D,
    same estimator) disagree; ratio_mean: pi(a)/mu(a); entropy: H(pi) in nats; kl_ref (with
    `ref_logprobs`): the mean k3 estimate of KL(pi || pi_ref).
    """
    if is_cap <= 0:
        raise ValueError(f"is_cap must be > 0, got {is_cap}")
    if kl_beta < 0:
        raise ValueError(f"kl_beta must be >= 0, got {kl_beta}")
    if kl_beta > 0 and ref_logprobs is None:
        raise ValueError("kl_beta > 0 needs ref_logprobs, the reference policy's log-probs")
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
    denom = rmask.sum().clamp_min(1) if normalizer is None else normalizer
    loss = -(weight * logp_a).sum() / denom
    k3: Tensor | None = None
    if ref_logprobs is not None:
        if ref_logprobs.shape != (n,):
            raise ValueError(f"ref_logprobs must be (N={n},), got {tuple(ref_logprobs.shape)}")
        d = ref_logprobs.float() - logp_a  # (N,) with grad through log pi(a)
        k3 = torch.where(rmask, torch.expm1(d) - d, 0.0)  # expm1: no cancellation near d = 0
        if kl_beta > 0:
            loss = loss + kl_beta * k3.sum() / denom

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
    if k3 is not None:
        out["kl_ref"] = _mean(k3.detach(), rmask)
    return PolicyLossOutput(loss=loss, keep=region.keep, log_ratio=region.log_ratio, stats=out)
