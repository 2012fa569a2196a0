"""Independent float64 references for the trust-region core: direct formulas and autograd.

Written from the definitions in docs/developers/design.md#the-divergence-kinds and
docs/developers/design.md#the-predicted-direction without reusing any code under test, so a mistake
in `core.objective.estimators` cannot hide in a shared helper.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from core.objective.behavior import BehaviorView
from core.objective.estimators import BUCKET_FLOOR

Float64Fn = Callable[[Tensor], Tensor]  # (N, V) logits -> (N,) divergence


def _kind_terms(p: Tensor, m: Tensor, kind: str) -> Tensor:
    """Per-category divergence terms (..., C) from probabilities (float64, strictly positive)."""
    if kind == "tv":
        return 0.5 * (p - m).abs()
    if kind == "kl":
        return m * (m.log() - p.log())
    return p * (p.log() - m.log())


def exact_divergence_fn(behavior: BehaviorView, kind: str) -> Float64Fn:
    assert behavior.full_logprobs is not None
    m = behavior.full_logprobs.double().exp().clamp_min(1e-30)

    def fn(z: Tensor) -> Tensor:
        p = torch.softmax(z, dim=-1).clamp_min(1e-30)
        return _kind_terms(p, m, kind).sum(-1)

    return fn


def lumped_divergence_fn(
    behavior: BehaviorView, tokens: Tensor, kind: str, estimator: str
) -> Float64Fn:
    """D on the categories {explicit ids} + R, mu from the view only (binary: ids = {a})."""
    rows = []
    for i in range(len(behavior)):
        a = int(tokens[i])
        if estimator == "binary":
            pairs = {a: float(behavior.token_logprobs[i])}
        else:
            pairs = dict(
                zip(behavior.topk_ids[i].tolist(), behavior.topk_logprobs[i].tolist(), strict=True)
            )
            pairs.setdefault(a, float(behavior.token_logprobs[i]))
        rows.append(pairs)

    def fn(z: Tensor) -> Tensor:
        p_full = torch.softmax(z, dim=-1)
        out = []
        for i, pairs in enumerate(rows):
            ids = torch.tensor(list(pairs))
            p_s = p_full[i, ids].clamp_min(1e-30)
            m_s = torch.tensor(list(pairs.values()), dtype=torch.float64).exp().clamp_min(1e-30)
            # the rest bucket is floored where its mass is fp32 rounding noise (see core)
            p_r = (1 - p_full[i, ids].sum()).clamp_min(BUCKET_FLOOR)
            m_r = (1 - m_s.sum()).clamp_min(BUCKET_FLOOR)
            p = torch.cat([p_s, p_r.reshape(1)])
            m = torch.cat([m_s, m_r.reshape(1)])
            out.append(_kind_terms(p, m, kind).sum())
        return torch.stack(out)

    return fn


def step_direction(z: Tensor, tokens: Tensor, advantages: Tensor) -> Tensor:
    """v = A (onehot(a) - pi): the ascent direction of A log pi(a) in logit space."""
    p = torch.softmax(z, dim=-1)
    onehot = torch.nn.functional.one_hot(tokens, z.shape[-1]).to(z.dtype)
    return advantages.to(z.dtype).unsqueeze(-1) * (onehot - p)


def autograd_change(fn: Float64Fn, logits: Tensor, tokens: Tensor, advantages: Tensor) -> Tensor:
    """<grad_z D, v> per row, by autograd in float64."""
    z = logits.double().requires_grad_()
    (grad,) = torch.autograd.grad(fn(z).sum(), z)
    v = step_direction(logits.double(), tokens, advantages)
    return (grad * v).sum(-1)


def finite_step_change(
    fn: Float64Fn, logits: Tensor, tokens: Tensor, advantages: Tensor, eps: float
) -> Tensor:
    """D(z + eps v) - D(z): the actual change of D after a small gradient step."""
    z = logits.double()
    v = step_direction(z, tokens, advantages)
    return fn(z + eps * v) - fn(z)
