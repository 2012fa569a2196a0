"""The policy-gradient loss under a trust-region mask, and the per-step statistics behind it.

    loss = - A * sg(w) * m * log pi(a)      w = min(pi(a) / mu(a), c) as in DPPO, or a correction's
         + beta * k3(pi_ref(a), pi(a))                          (optional KL to a reference)

summed over the response tokens and divided by a normalizer the caller picks
(`algorithm.loss_agg`, `core.training.update`; by default this piece's own token count). The mask
`m` and every logged statistic come from one no-grad pass over the detached logits; the only pass
with a gradient is the fused cross-entropy that yields log pi(a). The design:
docs/developers/design.md#the-policy-loss.

The KL penalty is GRPO's (and TRL's): per sampled token the k3 estimator of KL(pi || pi_ref),
`exp(d) - d - 1` with `d = log pi_ref(a) - log pi(a)`, non-negative, 0 where the two agree, and
unbiased for the KL since the tokens come from (nearly) pi. It is averaged over the same tokens
and with the same denominator as the policy term, and the trust-region mask does not touch it:
the mask limits how far one step moves from the behavior policy, the penalty how far the run
drifts from where it started.

`normalizer` lets a caller split one minibatch into micro-batches (gradient accumulation): each
piece divides by the token count of the whole minibatch, so the summed gradients equal the
unsplit one. A (N,) normalizer divides each token by its own entry (a per-sequence mean).

With `ProjectedLogits` instead of logits the loss is `fused_policy_loss`: the same loss from the
hidden states and the output projection, whose passes over the vocabulary (`core.objective.fused`)
never hold the (N, V) logits. The two differ only in how they get log pi(a), the mask's decision
and the softmax statistics; the checks of their inputs, the loss from log pi(a) on and every
logged statistic are shared.

Telemetry that can be trusted on-policy: the two direction rules (DPPO's sampled ratio and the
sign of the predicted change of D) are only compared where D exceeds `DIRECTION_TOLERANCE`, below
which both signs are fp32 rounding; the comparison past delta, where the two masks actually
decide differently, is a metric of its own, and so are the two set differences of the masks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from core.objective import fused
from core.objective.behavior import BehaviorView
from core.objective.corrections import correction_weights
from core.objective.estimators import SoftmaxStats, estimator_stats
from core.objective.lazy_logits import ProjectedLogits
from core.objective.masks import (
    DEFAULT_TRUST_REGION,
    MaskDecision,
    TrustRegion,
    far_from_behavior,
    ratio_moves_away,
    trust_region,
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


def _check_inputs(
    tokens: Tensor,
    region: TrustRegion,
    *,
    response_mask: Tensor | None,
    ref_logprobs: Tensor | None,
    normalizer: float | Tensor | None,
    sequence_ids: Tensor | None = None,
) -> Tensor:
    """The checks both loss paths make before any pass over the vocabulary; the (N,) bool
    response mask."""
    if region.correction.per_sequence and sequence_ids is None:
        raise ValueError(
            f"correction {region.correction.type!r} at sequence level needs sequence_ids, the "
            "(N,) sequence index of every token"
        )
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
    if sequence_ids is not None and sequence_ids.shape != (n,):
        raise ValueError(f"sequence_ids must be (N={n},), got {tuple(sequence_ids.shape)}")
    return rmask


def _loss_from_logprobs(
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
    sequence_ids: Tensor | None = None,
) -> PolicyLossOutput:
    """The loss from log pi(a) (N,), the only term with a gradient, and the statistics from
    the mask's pass: shared by the unfused and the fused path, which differ only in how they
    get `logp_a`, `decision` and `stats`. `outside` (N,): whether each sampled token lies outside
    pi's top-K (K of the behavior view), for `outside_topk`. `sequence_ids` (N,): each token's
    sequence, for the sequence-level corrections."""
    corrected = correction_weights(
        decision.log_ratio,
        region.correction,
        is_cap=region.is_cap,
        response_mask=rmask,
        sequence_ids=sequence_ids,
    )
    weight = advantages * corrected.weight * decision.keep * rmask
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
        "correction_masked_fraction": _mean(corrected.dropped, rmask),
        "correction_clipped_fraction": _mean(corrected.clipped, rmask),
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


def policy_loss(
    logits: Tensor | ProjectedLogits,
    tokens: Tensor,
    behavior: BehaviorView,
    advantages: Tensor,
    region: TrustRegion = DEFAULT_TRUST_REGION,
    *,
    response_mask: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    normalizer: float | Tensor | None = None,
    sequence_ids: Tensor | None = None,
) -> PolicyLossOutput:
    """Loss and statistics for N response tokens (logits (N, V) with grad, any float dtype)
    under the trust region `region` (its mask, divergence, thresholds, IS cap and KL weight).

    `logits` may also be a `ProjectedLogits`, the hidden states and the output projection that
    make them: the fused path (`core.objective.fused.fused_policy_loss`) then gives the same loss,
    gradients and statistics without ever holding the (N, V) logits (estimators `binary` and
    `topk` only).

    `ref_logprobs` (N,): log pi_ref(a) of the reference policy; with `region.kl_beta` > 0 the
    k3 penalty is added (β = 0 adds nothing: the loss is bit for bit the unpenalized one).
    `normalizer`: divide the token sums by this count instead of the response tokens here, or,
    a (N,) tensor, each token's term by its own entry. `sequence_ids` (N,) int64: the sequence
    each token belongs to, needed by the sequence-level corrections (`region.correction`,
    `core.objective.corrections`), whose weight replaces sg(min(pi/mu, c)).

    Statistics (fractions over response tokens unless said otherwise):
    masked_fraction[_pos|_neg]: tokens whose gradient the mask removed (all, A > 0, A < 0);
    divergence_mean/max: the estimator's D(mu, pi); direction_disagreement: among tokens with
    A != 0, the share with D > DIRECTION_TOLERANCE where DPPO's ratio direction and the
    predictive direction (sign of the predicted change of D, same estimator) disagree;
    direction_disagreement_far: the same, counting only tokens with D past delta (where the two
    masks decide differently); masked_only_predictive / masked_only_dppo: tokens the predictive
    rule masks and DPPO's does not, and the reverse, whatever mask is configured (same D, same
    deltas); ratio_mean: pi(a)/mu(a); entropy: H(pi) in nats; outside_topk: sampled tokens
    outside pi's top-K (K of the behavior view: how often the sampler picks what the trainer
    ranks lower); kl_ref (with `ref_logprobs`): the mean k3 estimate of KL(pi || pi_ref);
    correction_masked_fraction: tokens the correction dropped (IcePop's band, MIS's cap, Geo-RS's
    sequences), whatever the mask did to them; correction_clipped_fraction: kept tokens whose IS
    weight the correction truncated (past TIS's cap or is_cap, outside CISPO's band).
    """
    if isinstance(logits, ProjectedLogits):
        return fused_policy_loss(
            logits,
            tokens,
            behavior,
            advantages,
            region,
            response_mask=response_mask,
            ref_logprobs=ref_logprobs,
            normalizer=normalizer,
            sequence_ids=sequence_ids,
        )
    rmask = _check_inputs(
        tokens,
        region,
        response_mask=response_mask,
        ref_logprobs=ref_logprobs,
        normalizer=normalizer,
        sequence_ids=sequence_ids,
    )
    advantages = advantages.float()
    detached = logits.detach()
    stats = estimator_stats(detached, behavior, tokens, region.estimator, entropy=True)
    decision = trust_region(
        detached, behavior, tokens, advantages, region, always_estimate=True, stats=stats
    )
    logp_a = -F.cross_entropy(logits.float(), tokens, reduction="none")  # (N,) with grad
    z = detached.float()
    kth = z.topk(min(behavior.k, z.shape[-1]), dim=-1).values[:, -1]
    outside = z.gather(-1, tokens[:, None])[:, 0] < kth  # (N,) a outside pi's top-K
    return _loss_from_logprobs(
        logp_a,
        decision,
        stats,
        advantages,
        rmask,
        region=region,
        ref_logprobs=ref_logprobs,
        normalizer=normalizer,
        outside=outside,
        sequence_ids=sequence_ids,
    )


def fused_policy_loss(
    logits: ProjectedLogits,
    tokens: Tensor,
    behavior: BehaviorView,
    advantages: Tensor,
    region: TrustRegion = DEFAULT_TRUST_REGION,
    *,
    response_mask: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    normalizer: float | Tensor | None = None,
    sequence_ids: Tensor | None = None,
) -> PolicyLossOutput:
    """`core.objective.loss.policy_loss` of the projected logits
    `(hidden @ weight.T + bias) / temperature`, hidden states (N, H) and the output projection
    (V, H) (bias (V,) or None), none of which need be fp32: the same loss, statistics and
    gradients (in the hidden states, the weight and the bias, where they require one), without
    ever holding the (N, V) logits.

    Estimators `binary` and `topk` only: `exact` and `topk_tail` raise ValueError (use
    `policy_loss` with the logits)."""
    estimator = region.estimator
    covered = fused.FUSED_ESTIMATORS
    if estimator not in covered:
        raise ValueError(
            f"the fused loss covers the estimators {covered}, not {estimator!r}, which "
            "needs the whole distribution: use the unfused path (policy_loss with the logits)"
        )
    proj = logits
    if proj.hidden.shape[0] != tokens.shape[0]:
        raise ValueError(f"hidden has {proj.hidden.shape[0]} rows, tokens {tokens.shape[0]}")
    rmask = _check_inputs(
        tokens,
        region,
        response_mask=response_mask,
        ref_logprobs=ref_logprobs,
        normalizer=normalizer,
        sequence_ids=sequence_ids,
    )
    advantages = advantages.float()
    view_ids = behavior.topk_ids if estimator == "topk" else None
    stats, columns = fused.projected_stats(proj, tokens, view_ids, entropy=True, top_k=behavior.k)
    assert stats.kth_logit is not None
    outside = columns.values[:, -1] < stats.kth_logit  # (N,) a outside pi's top-K
    decision = trust_region(
        columns, behavior, tokens, advantages, region, always_estimate=True, stats=stats
    )
    logp_a = fused.token_logprob(proj, tokens, stats, columns)  # (N,) with grad
    return _loss_from_logprobs(
        logp_a,
        decision,
        stats,
        advantages,
        rmask,
        region=region,
        ref_logprobs=ref_logprobs,
        normalizer=normalizer,
        outside=outside,
        sequence_ids=sequence_ids,
    )
