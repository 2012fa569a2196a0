"""Per-row sums of one chunk of logits, from ATen's fused softmax kernel: the statistics pass of
`core.objective.estimators.softmax_stats` is made of these, one chunk of rows at a time.

The kernel (max, exponentials and their sum in one sweep over each row while it is in cache) is
three times cheaper than `exp` over a chunk taken op by op, and writing the probabilities into
a reused scratch costs none of `log_softmax`'s fresh (N, V) output. Its running sum is not
accurate enough to normalise by (1e-5 off at 152k entries), so its rows are taken only up to a
factor per row and every sum is the caller's own, cascaded.

Imports: torch only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def _softmax_into(z: Tensor, out: Tensor) -> None:
    """`out` = softmax(z) over the last dim by ATen's fused row kernel: each row's max, its
    exponentials and their sum in one sweep while the row is in cache, three times cheaper
    than `exp` over a chunk taken op by op. `out` must be contiguous (into a strided view the
    kernel writes wrong rows)."""
    torch.ops.aten._softmax.out(z, -1, False, out=out)


def _first_of_each(ids: Tensor) -> Tensor:
    """(C, K) bool: True at the first occurrence of each id in its row, so that a view listing
    an id twice (padding) counts its mass once."""
    sorted_ids, order = ids.sort(dim=-1, stable=True)
    first = torch.ones_like(sorted_ids, dtype=torch.bool)
    first[:, 1:] = sorted_ids[:, 1:] != sorted_ids[:, :-1]
    return torch.empty_like(first).scatter_(-1, order, first)


def _take_out(e: Tensor, ids: Tensor) -> Tensor:
    """e's entries at the columns `ids` (C, S), then zeroed in `e`."""
    taken = e.gather(-1, ids)
    e.scatter_(-1, ids, 0.0)
    return taken


def log_of_sum(s1: Tensor) -> Tensor:
    """The fp32 log of a row's sum of exponentials, taken in float64 so that it is rounded
    once: an ulp of the log-partition moves the loss's importance weights, whose sum cancels
    to 1e-5 of itself."""
    return s1.double().log().float()


@dataclass(frozen=True)
class ChunkSums:
    """One chunk of rows' sums, in units of e_j = exp(z_j - m), m each row's largest finite
    logit (rows with none: m = 0 and every sum 0)."""

    zmax: Tensor  # (C,) m
    total: Tensor  # (C,) sum_j e_j
    sum_sq: Tensor  # (C,) sum_j e_j^2
    ez: Tensor | None  # (C,) sum_j e_j (z_j - m), when the entropy is asked
    rest: Tensor | None  # (C,) sum_{j != a} e_j, given the tokens
    rest_sq: Tensor | None  # (C,) sum_{j != a} e_j^2, given the tokens
    tail: Tensor | None  # (C,) sum over R (neither a nor a view id) of e_j, given the view
    tail_sq: Tensor | None  # (C,) the same of e_j^2, given the view


def chunk_sums(
    z: Tensor,
    e: Tensor,
    tokens: Tensor | None,
    view_ids: Tensor | None,
    ez_scratch: Tensor | None,
) -> ChunkSums:
    """The sums of one chunk of rows `z` (C, V) fp32, left unchanged; `e` (C, V), contiguous,
    is overwritten. `tokens` (C, 1), `view_ids` (C, K); `ez_scratch` (C, V) asks for the
    entropy's sum.

    The fused softmax kernel (`_softmax_into`) writes `p_j = e_j * r`, `r` the reciprocal of
    its own running sum (up to 1e-5 off at 152k entries), so `r` is each row's largest entry:
    every sum is taken over the kernel's rows (cascaded `sum`s) and divided by `r` (`r^2`). The
    whole row's sum is taken before any column is zeroed, so the log-partition is the same to
    the bit whichever columns a caller excludes (a ppo_clip ratio, a binary or a top-K view).
    The sums that exclude columns are summed directly over the rest, with those columns zeroed
    in the scratch, and the larger ones assembled from those parts, all positive: never a
    total minus a part (`core.objective.estimators`'s docstring). (Row sums stay `sum`s: a
    batched-matmul dot product accumulated 3e-5 relative error over 32k entries, and
    `vector_norm` 1.4e-5 over 152k.)"""
    zmax = z.amax(dim=-1)
    finite = torch.isfinite(zmax)
    zmax = torch.where(finite, zmax, 0.0)
    _softmax_into(z, e)
    r = e.amax(dim=-1)
    inv, inv2 = torch.where(finite, 1.0 / r, 0.0), torch.where(finite, 1.0 / (r * r), 0.0)
    total = torch.where(finite, e.sum(dim=-1) * inv, 0.0)  # NaN rows (no finite logit): 0

    def units(x: Tensor, squared: bool = False) -> Tensor:
        return torch.where(finite, x * (inv2 if squared else inv), 0.0)

    ez = None
    if ez_scratch is not None:
        # entries with z = -inf have p = 0 and contribute nothing (0 * -inf is NaN, zeroed)
        shifted = torch.sub(z, zmax.unsqueeze(-1), out=ez_scratch)
        ez = units(shifted.mul_(e).nan_to_num_(nan=0.0).sum(dim=-1))
    if tokens is None:
        sum_sq = units(e.square_().sum(dim=-1), squared=True)
        return ChunkSums(
            zmax=zmax,
            total=total,
            sum_sq=sum_sq,
            ez=ez,
            rest=None,
            rest_sq=None,
            tail=None,
            tail_sq=None,
        )
    e_a = _take_out(e, tokens).squeeze(-1)  # everything but the sampled token is left
    tail = tail_sq = None
    if view_ids is not None:
        e_ids = _take_out(e, view_ids) * _first_of_each(view_ids)  # a's entry is 0 by now
        tail, tail_sq = e.sum(dim=-1), e.square_().sum(dim=-1)  # the bucket R alone
        rest = tail + e_ids.sum(dim=-1)
        rest_sq = tail_sq + e_ids.square_().sum(dim=-1)
    else:
        rest, rest_sq = e.sum(dim=-1), e.square_().sum(dim=-1)
    return ChunkSums(
        zmax=zmax,
        total=total,
        sum_sq=units(rest_sq + e_a * e_a, squared=True),
        ez=ez,
        rest=units(rest),
        rest_sq=units(rest_sq, squared=True),
        tail=None if tail is None else units(tail),
        tail_sq=None if tail_sq is None else units(tail_sq, squared=True),
    )
