"""The full-vocabulary divergence terms of one chunk of rows: the `exact` and `topk_tail` pass of
`core.objective.estimators`, from probabilities held in three reused scratch buffers.

The straightforward pass (a `log_softmax`, then about twenty op-by-op expressions, each into a
fresh (C, V) tensor) cost 8-11 log_softmaxes: most of it was faulting in new pages for every
intermediate and a `where`/`exp` per term. Here pi comes from ATen's fused softmax kernel into
a scratch buffer (`core.objective.row_sums`), mu from one `exp` into another, and every term is
an in-place op on those buffers followed by a row `sum`: TV needs `|p - m|`, `sign(p - m) p`
and the squares, never a log. The KL kinds need log-probabilities, built (clamped at the floor)
in the third buffer. All row sums are `sum`s (cascaded), over the terms themselves: no total
minus a part, so the sampled token's own rate near pi_a = 1 keeps the cancellation-free forms
of `core.objective.estimators`'s docstring.

Imports: torch only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from core.objective.row_sums import log_of_sum

# Rows x vocabulary elements per chunk: 4 MiB per fp32 buffer, so that a chunk's three buffers
# and its logits stay in L3 while a dozen in-place ops run over them, and each op's fixed cost
# is spread over several rows at 152k columns. Measured against a log_softmax (1 thread, 2-core
# EPYC, 2 MiB L2): 1 MiB chunks (one row at 152k) 1.46x, 2 MiB 1.25x, 4 MiB 1.24x, 8 MiB 1.55x.
FULL_CHUNK_ELEMENTS = 1 << 20
_LOG_FLOOR = -69.07755278982137  # log(1e-30), divergence.LOG_FLOOR (not imported: no circle)


@dataclass(frozen=True)
class Scratch:
    """Three (rows, V) fp32 buffers reused by every chunk (narrowed to a chunk's rows)."""

    p: Tensor
    m: Tensor
    t: Tensor

    @staticmethod
    def make(rows: int, v: int, device: torch.device) -> Scratch:
        return Scratch(*(torch.empty(rows, v, device=device) for _ in range(3)))

    def rows(self, c: int) -> Scratch:
        return Scratch(self.p.narrow(0, 0, c), self.m.narrow(0, 0, c), self.t.narrow(0, 0, c))


def chunk_rows(v: int) -> int:
    return max(1, FULL_CHUNK_ELEMENTS // max(v, 1))


def probs_into(z: Tensor, p: Tensor) -> None:
    """`p` = softmax(z) (C, V), normalised by its own cascaded row sum (the kernel's running
    sum is up to 1e-5 off at 152k entries)."""
    torch.ops.aten._softmax.out(z, -1, False, out=p)
    p.div_(p.sum(dim=-1, keepdim=True))


def log_probs_into(z: Tensor, p: Tensor, out: Tensor) -> Tensor:
    """log pi = (z - max z) - log sum_j exp(z_j - max z), clamped at the floor, into `out`:
    the log-partition below the row's maximum is -log max p (the largest entry is exp(0) / the
    sum), never `z - lse`, which at logits of magnitude 60 rounds at 4e-6."""
    zmax = z.amax(dim=-1, keepdim=True)
    zmax = torch.where(torch.isfinite(zmax), zmax, 0.0)
    log_norm = log_of_sum(1.0 / p.amax(dim=-1, keepdim=True))
    return torch.sub(z, zmax, out=out).sub_(log_norm).clamp_min_(_LOG_FLOOR)


@dataclass(frozen=True)
class Rates:
    """What the step's log-probability rates need per row: dlogp_i = A (-(pi_i + c)), i != a,
    and dlogp_a = A * own."""

    c: Tensor  # (C, 1)
    own: Tensor  # (C, 1)
    p_a: Tensor  # (C, 1)


def _rates(p: Tensor, a: Tensor, t: Tensor) -> Rates:
    """c and the sampled token's rate from the others' mass and squares, summed over them (a's
    column zeroed in a copy in `t`, `p` left as it is)."""
    p_a = p.gather(-1, a)
    torch.mul(p, p, out=t)
    t.scatter_(-1, a, 0.0)
    rest_sq = t.sum(-1, keepdim=True)
    near_one = p_a > 0.5
    plain_c = p_a - (rest_sq + p_a * p_a)
    if bool(near_one.any()):
        rest = p.sum(-1, keepdim=True) - p_a  # replaced below where it matters (near one)
        t.copy_(p).scatter_(-1, a, 0.0)
        rest = torch.where(near_one, t.sum(-1, keepdim=True), rest)
        c = torch.where(near_one, p_a * rest - rest_sq, plain_c)  # pi_a - q
        own = torch.where(near_one, rest * rest + rest_sq, 1.0 - p_a - plain_c)
    else:  # 1 - pi_a >= 1/2: exact enough, as the straightforward pass had it
        c, own = plain_c, 1.0 - p_a - plain_c
    return Rates(c, own, p_a)


def tv_terms(s: Scratch, a: Tensor, adv: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """TV's D = 1/2 sum |p - m| and g = 1/2 sum sign(p - m) p dlogp, given p in `s.p` and m in
    `s.m` (both overwritten but `s.p`). `a` (C, 1) the tokens, `adv` (C, 1) or None."""
    rates = None if adv is None else _rates(s.p, a, s.t)
    diff = torch.sub(s.p, s.m, out=s.t)
    sign = torch.sign(diff, out=s.m)
    d = 0.5 * diff.mul_(sign).sum(-1)
    if adv is None or rates is None:
        return d, None
    s_a = sign.gather(-1, a)
    sp = sign.mul_(s.p).scatter_(-1, a, 0.0)  # sign(p - m) p, a's own term apart
    s1 = sp.sum(-1, keepdim=True)
    s2 = sp.mul_(s.p).sum(-1, keepdim=True)
    g = 0.5 * adv * (s_a * rates.p_a * rates.own - (s2 + rates.c * s1))
    return d, g.squeeze(-1)


def kl_terms(
    s: Scratch, z: Tensor, logm: Tensor, a: Tensor, adv: Tensor | None, *, kind: str
) -> tuple[Tensor, Tensor | None]:
    """KL(mu || pi) (`kl`) or KL(pi || mu) (`kl_reverse`) and its change, given p in `s.p` and
    m = exp(logm) in `s.m` (both overwritten): log-probs clamped at the floor as the
    straightforward pass had them. Where pi is floored KL(mu || pi)'s term -m dlogp is dropped
    (`estimators._category_terms`)."""
    rates = None if adv is None else _rates(s.p, a, s.t)
    logp = log_probs_into(z, s.p, s.t)
    if kind == "kl":
        g = None
        if adv is not None and rates is not None:
            # -m dlogp summed: A (sum_{i != a} m_i p_i + c sum_{i != a, unfloored} m_i
            # - [a unfloored] m_a own); m_i p_i of a floored p is below 1e-30
            mp = torch.mul(s.m, s.p, out=s.p).scatter_(-1, a, 0.0).sum(-1, keepdim=True)
            if bool((logp.amin(dim=-1) <= _LOG_FLOOR).any()):  # some pi floored: mask them
                unfloored = torch.mul(s.m, logp > _LOG_FLOOR, out=s.p)
            else:  # nothing floored (the usual chunk): m itself, without a mask's two passes
                unfloored = s.p.copy_(s.m)
            m_a = unfloored.gather(-1, a)
            m_rest = unfloored.scatter_(-1, a, 0.0).sum(-1, keepdim=True)
            g = (adv * (mp + rates.c * m_rest - m_a * rates.own)).squeeze(-1)
        # D = sum m (clamp(log m) - log pi)
        terms = torch.clamp_min(logm, _LOG_FLOOR, out=s.p).sub_(logp).mul_(s.m)
        return terms.sum(-1), g
    # kl_reverse: D = sum p (log pi - clamp(log m)), g = sum p dlogp (log pi - clamp(log m))
    ratio = logp.sub_(torch.clamp_min(logm, _LOG_FLOOR, out=s.m))
    pr = ratio.mul_(s.p)
    d = pr.sum(-1)
    if adv is None or rates is None:
        return d, None
    pr_a = pr.gather(-1, a)
    pr.scatter_(-1, a, 0.0)
    s1 = pr.sum(-1, keepdim=True)
    s2 = pr.mul_(s.p).sum(-1, keepdim=True)
    g = adv * (pr_a * rates.own - (s2 + rates.c * s1))
    return d, g.squeeze(-1)
