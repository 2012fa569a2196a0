"""Trust-region masks: which tokens keep their policy-gradient contribution.

Every mask asks two questions of a token and drops it only when both answer yes
(docs/developers/design.md#trust-region-masks): has pi moved too far from mu (proximity), and would
this token's step move it further (direction)?

| mask         | proximity                              | direction                              |
|--------------|----------------------------------------|----------------------------------------|
| `ppo_clip`   | ratio r outside [1-delta_low, 1+delta_high] | sign(r - 1) against sign(A)       |
| `dppo`       | D(mu, pi) > delta                      | sign(pi_a - mu_a) against sign(A)      |
| `predictive` | D(mu, pi) > delta                      | sign of the predicted change of D      |
| `none`       | never                                  | never                                  |

`delta_high` applies to tokens with A > 0, `delta_low` to A < 0; tokens with A = 0 always keep
their (zero) gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

from core.objective.behavior import BehaviorView
from core.objective.divergence import (
    Estimator,
    Kind,
    SoftmaxStats,
    divergence_and_change,
    estimator_stats,
    softmax_stats,
)
from core.objective.lazy_logits import GatheredLogits

Mask = Literal["ppo_clip", "dppo", "predictive", "none"]
MASKS: tuple[str, ...] = get_args(Mask)


def ratio_moves_away(log_ratio: Tensor, advantages: Tensor) -> Tensor:
    """DPPO's direction rule: the token's step pushes pi(a) further from mu(a)."""
    return ((advantages > 0) & (log_ratio > 0)) | ((advantages < 0) & (log_ratio < 0))


def far_from_behavior(
    divergence: Tensor, advantages: Tensor, delta_low: float, delta_high: float
) -> Tensor:
    """The proximity question of `dppo` and `predictive`: D past the threshold of A's sign
    (tokens with A = 0 are never far: their gradient is zero anyway)."""
    pos, neg = advantages > 0, advantages < 0
    return (pos & (divergence > delta_high)) | (neg & (divergence > delta_low))


@dataclass(frozen=True)
class TrustRegion:
    """A mask decision with the quantities behind it, for logging."""

    keep: Tensor  # (N,) bool: True where the token keeps its gradient
    log_ratio: Tensor  # (N,) log pi(a) - log mu(a)
    divergence: Tensor | None  # (N,) D(mu, pi), when computed
    change: Tensor | None  # (N,) predicted change of D along the token's step, when computed


@torch.no_grad()
def trust_region(
    logits: Tensor | GatheredLogits,
    behavior: BehaviorView,
    tokens: Tensor,
    advantages: Tensor,
    mask: Mask,
    kind: Kind = "tv",
    estimator: Estimator = "topk",
    delta_low: float = 0.15,
    delta_high: float = 0.15,
    *,
    always_estimate: bool = False,
    stats: SoftmaxStats | None = None,
) -> TrustRegion:
    """The mask and its ingredients. `always_estimate` computes D and its change even for masks
    that do not need them, so a trainer can log them under every mask. `logits` may be the
    columns the fused loss gathered (`core.objective.fused`), with the `stats` of its own pass."""
    if mask not in MASKS:
        raise ValueError(f"mask must be one of {MASKS}, got {mask!r}")
    if delta_low < 0 or delta_high < 0:
        raise ValueError(f"deltas must be >= 0, got delta_low={delta_low}, delta_high={delta_high}")
    if advantages.shape != tokens.shape:
        raise ValueError(
            f"advantages {tuple(advantages.shape)} must match tokens {tuple(tokens.shape)}"
        )
    estimate = mask in ("dppo", "predictive") or always_estimate
    if stats is None:
        if isinstance(logits, GatheredLogits):
            raise ValueError("trust_region: gathered logits need the stats of their pass")
        stats = (
            estimator_stats(logits, behavior, tokens, estimator)
            if estimate
            else softmax_stats(logits)  # the ratio alone
        )
    logp_a = stats.log_probs(logits, tokens.unsqueeze(-1)).squeeze(-1)
    log_ratio = logp_a - behavior.token_logprobs.float()

    d = g = None
    if estimate:
        d, g = divergence_and_change(
            logits, behavior, tokens, advantages, kind, estimator, stats=stats
        )

    pos, neg = advantages > 0, advantages < 0
    if mask == "ppo_clip":
        ratio = log_ratio.exp()
        masked = (pos & (ratio > 1.0 + delta_high)) | (neg & (ratio < 1.0 - delta_low))
    elif mask == "none":
        masked = torch.zeros_like(pos)
    else:
        assert d is not None and g is not None
        far = far_from_behavior(d, advantages, delta_low, delta_high)
        away = ratio_moves_away(log_ratio, advantages) if mask == "dppo" else g > 0
        masked = far & away
    return TrustRegion(keep=~masked, log_ratio=log_ratio, divergence=d, change=g)


def trust_region_mask(
    logits: Tensor,
    behavior: BehaviorView,
    tokens: Tensor,
    advantages: Tensor,
    mask: Mask,
    kind: Kind = "tv",
    estimator: Estimator = "topk",
    delta_low: float = 0.15,
    delta_high: float = 0.15,
) -> Tensor:
    """(N,) bool, True where the token keeps its gradient under `mask`."""
    return trust_region(
        logits, behavior, tokens, advantages, mask, kind, estimator, delta_low, delta_high
    ).keep
