"""Synthetic LLM-like token positions, for tests and benchmarks of the trust-region core.

Language-model next-token distributions are peaked with a heavy Zipf-like tail, and a rollout
engine's behavior policy differs from the trainer's by a perturbation of the logits (stale
weights, lower precision). `gap` scales that perturbation, so a benchmark can sweep from
on-policy (gap 0) to far off-policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from core.objective.behavior import BehaviorView


@dataclass(frozen=True)
class Positions:
    logits: Tensor  # (N, V) current policy logits
    behavior: BehaviorView  # top-K view and full log-probs of mu
    tokens: Tensor  # (N,) sampled from mu
    advantages: Tensor  # (N,)


def topk_view(logmu: Tensor, tokens: Tensor, k: int, *, keep_full: bool = True) -> BehaviorView:
    """The view an engine returns: top-K of mu, K-th entry replaced by the sampled token when
    it is missing (as vLLM and SGLang do)."""
    top = logmu.topk(k, dim=-1)
    ids, logprobs = top.indices.clone(), top.values.clone()
    token_logprobs = logmu.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    missing = ~(ids == tokens.unsqueeze(-1)).any(dim=-1)
    ids[missing, -1] = tokens[missing]
    logprobs[missing, -1] = token_logprobs[missing]
    return BehaviorView(token_logprobs, ids, logprobs, logmu if keep_full else None)


def llm_logits(n: int, vocab: int, *, peak: float = 1.0, generator: torch.Generator) -> Tensor:
    """(N, V) logits with a Zipf-like profile over a random token order, sharpened by `peak`."""
    ranks = torch.arange(1, vocab + 1, dtype=torch.float32)
    profile = -1.1 * ranks.log()  # (V,)
    order = torch.argsort(torch.rand(n, vocab, generator=generator), dim=-1)
    noise = torch.randn(n, vocab, generator=generator)
    return peak * (profile[order] + 1.5 * noise)


def positions(
    n: int,
    vocab: int,
    *,
    k: int = 20,
    gap: float = 0.5,
    peak: float = 1.0,
    seed: int = 0,
    keep_full: bool = True,
) -> Positions:
    """N positions where mu = softmax(z + gap * noise), tokens drawn from mu, A ~ N(0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    logits = llm_logits(n, vocab, peak=peak, generator=gen)
    logmu = torch.log_softmax(logits + gap * torch.randn(n, vocab, generator=gen), dim=-1)
    tokens = torch.multinomial(logmu.exp(), 1, generator=gen).squeeze(-1)
    advantages = torch.randn(n, generator=gen)
    view = topk_view(logmu, tokens, min(k, vocab), keep_full=keep_full)
    return Positions(logits, view, tokens, advantages)
