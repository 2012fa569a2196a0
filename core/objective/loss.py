"""The policy-gradient loss under a trust-region mask, and the per-step statistics behind it.

    loss = - A * sg(min(pi(a) / mu(a), c)) * m * log pi(a)      (DESIGN.md §1, as in DPPO)
         + beta * k3(pi_ref(a), pi(a))                          (optional KL to a reference)

summed over the response tokens and divided by a normalizer the caller picks
(`algorithm.loss_agg`, `core.training.update`; by default this piece's own token count). The mask
`m` and every logged statistic come from one no-grad pass over the detached logits; the only pass
with a gradient is the fused cross-entropy that yields log pi(a).

The KL penalty is GRPO's (and TRL's): per sampled token the k3 estimator of KL(pi || pi_ref),
`exp(d) - d - 1` with `d = log pi_ref(a) - log pi(a)`, non-negative, 0 where the two agree, and
unbiased for the KL since the tokens come from (nearly) pi. It is averaged over the same tokens
and with the same denominator as the policy term, and the trust-region mask does not touch it:
the mask limits how far one step moves from the behavior policy, the penalty how far the run
drifts from where it started.

`normalizer` lets a caller split one minibatch into micro-batches (gradient accumulation): each
piece divides by the token count of the whole minibatch, so the summed gradients equal the
unsplit one. A (N,) normalizer divides each token by its own entry (a per-sequence mean).

With `ProjectedLogits` instead of logits the loss is `core.objective.fused`'s, which never holds
the (N, V) logits; the arithmetic both share, from log pi(a) on, and the telemetry are in
`core.objective.loss_terms`.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from core.objective.behavior import BehaviorView
from core.objective.divergence import estimator_stats
from core.objective.fused import fused_policy_loss
from core.objective.lazy_logits import ProjectedLogits

# DIRECTION_TOLERANCE and PolicyLossOutput are this loss's: read here (README, tests, core)
from core.objective.loss_terms import DIRECTION_TOLERANCE as DIRECTION_TOLERANCE
from core.objective.loss_terms import PolicyLossOutput as PolicyLossOutput
from core.objective.loss_terms import check_loss_inputs, loss_from_logprobs
from core.objective.masks import DEFAULT_TRUST_REGION, TrustRegion, trust_region


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
    a (N,) tensor, each token's term by its own entry.

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
    ranks lower); kl_ref (with `ref_logprobs`): the mean k3 estimate of KL(pi || pi_ref).
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
        )
    rmask = check_loss_inputs(
        tokens,
        region,
        response_mask=response_mask,
        ref_logprobs=ref_logprobs,
        normalizer=normalizer,
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
    return loss_from_logprobs(
        logp_a,
        decision,
        stats,
        advantages,
        rmask,
        region=region,
        ref_logprobs=ref_logprobs,
        normalizer=normalizer,
        outside=outside,
    )
