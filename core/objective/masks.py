"""Trust-region masks: which tokens keep their policy-gradient contribution, and the one object
that says how the loss treats off-policy tokens (`TrustRegion`).

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

from dataclasses import dataclass, fields
from typing import Literal, get_args

import torch
from torch import Tensor

from core.objective.behavior import BehaviorView
from core.objective.corrections import NO_CORRECTION, Correction
from core.objective.estimators import (
    ESTIMATORS,
    KINDS,
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


@dataclass(frozen=True, kw_only=True)
class TrustRegion:
    """How the loss treats tokens that the behavior policy sampled: the mask, the divergence
    and estimator it reads, its thresholds, the truncated-IS cap and the KL penalty's weight.

    Built once from the algorithm config (`from_config`, again after a steering change) and
    handed whole to the mask, the loss and its statistics, so that no two of these settings can
    trade places in a call. A new correction (TIS, MIS, IcePop, ...) is a field here, with its
    check in `__post_init__` and a config field of the same name, read where the loss uses it.
    The off-policy corrections of the field (TIS, MIS, IcePop, Geo-RS, CISPO) are `correction`
    (`core.objective.corrections`), whose weight multiplies the mask.
    Defaults: the published ones (DPPO's TV threshold 0.15, the top-20 view, the cap off)."""

    mask: Mask = "predictive"
    kind: Kind = "tv"  # the divergence D of `dppo` and `predictive`
    estimator: Estimator = "topk"  # how D is read from the behavior view
    delta_low: float = 0.15  # threshold for A < 0 (eps_low for `ppo_clip`)
    delta_high: float = 0.15  # threshold for A > 0 (eps_high for `ppo_clip`)
    is_cap: float = 1e4  # c of sg(min(pi/mu, c)): truncated importance sampling
    kl_beta: float = 0.0  # weight of the k3 penalty to the reference policy (0: none)
    top_k: int = 20  # log-probs the rollout keeps per token (the loss reads K off the view)
    correction: Correction = NO_CORRECTION  # the IS weight and its drops (none: min(r, is_cap))

    def __post_init__(self) -> None:
        if self.mask not in MASKS:
            raise ValueError(f"mask must be one of {MASKS}, got {self.mask!r}")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {ESTIMATORS}, got {self.estimator!r}")
        if self.delta_low < 0 or self.delta_high < 0:
            raise ValueError(
                f"deltas must be >= 0, got delta_low={self.delta_low}, delta_high={self.delta_high}"
            )
        if self.is_cap <= 0:
            raise ValueError(f"is_cap must be > 0, got {self.is_cap}")
        if self.kl_beta < 0:
            raise ValueError(f"kl_beta must be >= 0, got {self.kl_beta}")
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")

    @classmethod
    def from_config(cls, algorithm: object) -> TrustRegion:
        """The trust region of an `algorithm` config (`core.config.AlgorithmConfig`, read by
        field name: this package imports nothing else of `core`)."""
        args = {f.name: getattr(algorithm, f.name) for f in fields(cls) if f.name != "correction"}
        correction = getattr(algorithm, "correction", None)
        if correction is not None:
            args["correction"] = Correction.from_config(correction)
        return cls(**args)


DEFAULT_TRUST_REGION = TrustRegion()


def ratio_moves_away(log_ratio: Tensor, advantages: Tensor) -> Tensor:
    """DPPO's direction rule: the token's step pushes pi(a) further from mu(a)."""
    return ((advantages > 0) & (log_ratio > 0)) | ((advantages < 0) & (log_ratio < 0))


def far_from_behavior(divergence: Tensor, advantages: Tensor, region: TrustRegion) -> Tensor:
    """The proximity question of `dppo` and `predictive`: D past the threshold of A's sign
    (tokens with A = 0 are never far: their gradient is zero anyway)."""
    pos, neg = advantages > 0, advantages < 0
    return (pos & (divergence > region.delta_high)) | (neg & (divergence > region.delta_low))


@dataclass(frozen=True)
class MaskDecision:
    """A mask's decision with the quantities behind it, for logging."""

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
    region: TrustRegion,
    *,
    always_estimate: bool = False,
    stats: SoftmaxStats | None = None,
) -> MaskDecision:
    """The mask and its ingredients. `always_estimate` computes D and its change even for masks
    that do not need them, so a trainer can log them under every mask. `logits` may be the
    columns the fused loss gathered (`core.objective.fused`), with the `stats` of its own pass."""
    if advantages.shape != tokens.shape:
        raise ValueError(
            f"advantages {tuple(advantages.shape)} must match tokens {tuple(tokens.shape)}"
        )
    mask = region.mask
    estimate = mask in ("dppo", "predictive") or always_estimate
    if stats is None:
        if isinstance(logits, GatheredLogits):
            raise ValueError("trust_region: gathered logits need the stats of their pass")
        stats = (
            estimator_stats(logits, behavior, tokens, region.estimator)
            if estimate
            else softmax_stats(logits)  # the ratio alone
        )
    logp_a = stats.log_probs(logits, tokens.unsqueeze(-1)).squeeze(-1)
    log_ratio = logp_a - behavior.token_logprobs.float()

    d = g = None
    if estimate:
        d, g = divergence_and_change(
            logits,
            behavior,
            tokens,
            advantages,
            kind=region.kind,
            estimator=region.estimator,
            stats=stats,
        )

    pos, neg = advantages > 0, advantages < 0
    if mask == "ppo_clip":
        ratio = log_ratio.exp()
        masked = (pos & (ratio > 1.0 + region.delta_high)) | (
            neg & (ratio < 1.0 - region.delta_low)
        )
    elif mask == "none":
        masked = torch.zeros_like(pos)
    else:
        assert d is not None and g is not None
        far = far_from_behavior(d, advantages, region)
        away = ratio_moves_away(log_ratio, advantages) if mask == "dppo" else g > 0
        masked = far & away
    return MaskDecision(keep=~masked, log_ratio=log_ratio, divergence=d, change=g)


def trust_region_mask(
    logits: Tensor,
    behavior: BehaviorView,
    tokens: Tensor,
    advantages: Tensor,
    region: TrustRegion,
) -> Tensor:
    """(N,) bool, True where the token keeps its gradient under `region.mask`."""
    return trust_region(logits, behavior, tokens, advantages, region).keep
