"""The trained policy under the sampler's top-p truncation.

With `rollout.top_p < 1` the sampler draws from `mu`, the nucleus of the rollout policy
renormalised (`core.rollout.sampling_logprobs`). Comparing that `mu` with the untruncated policy
`pi` measures the truncation, not drift: on-policy, `pi(a) / mu(a)` is the nucleus mass (0.85 at
top_p 0.8), D(mu, pi) is the mass outside it, and the trust region masks tokens that never moved.

The decision (README, "Top-p sampling"): the policy being trained is the sampler the user
deploys, `pi` under the same truncation,

    pi_p = softmax(z restricted to N),      N = nucleus(pi, top_p) ∪ {a},

where the nucleus is computed exactly as the sampler computes it (sort by probability, keep the
smallest prefix whose mass reaches top_p) and the sampled token `a` is added so that
`log pi_p(a)` stays finite when `pi` has drifted and `a` fell out of its own nucleus. The trust
region, the importance weight, the loss's gradient (a softmax over N: tokens outside N get
none) and the KL reference (`core.training.reference`, the reference policy under the same rule) all
see `pi_p`. On-policy the nucleus of `pi` is the sampler's, so `pi_p = mu`: ratio 1 and D = 0 for
any top_p. The membership of N is a discrete choice made on detached logits; no gradient flows
through it, as none flows through the sampler's.

Top-K sampling (vLLM's `top_k`) is not supported by the built-in sampler, so there is no top-K
truncation here; `algorithm.top_k` is the size of the behavior *view* (how many log-probs the
engine reports), not a sampling truncation.
"""

from __future__ import annotations

import torch
from torch import Tensor

from core.objective.estimators import CHUNK_ELEMENTS


@torch.no_grad()
def nucleus_keep(logits: Tensor, tokens: Tensor, top_p: float) -> Tensor:
    """(N, V) bool: the nucleus of softmax(logits) at `top_p`, plus each row's sampled token.

    `logits` (N, V) are already divided by the temperature (as `response_logits` returns them).
    The nucleus is the sampler's rule, computed with the same operations in the same order so
    that equal logits give an equal set: tokens sorted by log-probability, kept while the mass
    before them is below top_p. Rows are handled in chunks: the sort's scratch is a few
    chunks, not (N, V) values and indices."""
    n, v = logits.shape
    if tokens.shape != (n,):
        raise ValueError(f"tokens must be (N={n},), got {tuple(tokens.shape)}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    keep = torch.ones((n, v), dtype=torch.bool, device=logits.device)
    if top_p >= 1.0:
        return keep
    rows_per_chunk = max(1, CHUNK_ELEMENTS // max(v, 1))
    for start in range(0, n, rows_per_chunk):
        rows = slice(start, min(start + rows_per_chunk, n))
        logp = torch.log_softmax(logits[rows].float(), dim=-1)  # (C, V)
        sorted_lp, order = logp.sort(dim=-1, descending=True)
        cum = sorted_lp.exp().cumsum(-1)
        drop_sorted = (cum - sorted_lp.exp()) >= top_p  # the sampler's rule, verbatim
        keep[rows].scatter_(-1, order, ~drop_sorted)
    keep.scatter_(-1, tokens.unsqueeze(-1), True)
    return keep


def truncate_to_nucleus(logits: Tensor, tokens: Tensor, top_p: float) -> Tensor:
    """The logits of `pi_p`: -inf outside nucleus(pi, top_p) ∪ {a} (see the module docstring).

    Differentiable in the kept entries (a softmax or cross-entropy of the result has the
    truncated policy's gradient); top_p >= 1 returns `logits` itself, untouched."""
    if top_p >= 1.0:
        return logits
    keep = nucleus_keep(logits.detach(), tokens, top_p)
    return logits.masked_fill(~keep, float("-inf"))
