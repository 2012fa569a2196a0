"""Divergences between the behavior policy and the current one, and their predicted change.

For every generated token we estimate `D(mu, pi)` and the directional derivative
`g = d/de D(mu, softmax(z + e * v))` at e = 0 along the token's own policy-gradient step
`v = A * (onehot(a) - pi)` (docs/developers/design.md#the-predicted-direction). The trust-region
masks in `core.objective.masks` use both.

All estimators share one fact of softmax calculus: along `v`, the log-probability of any token `i`
moves at the rate

    dlogp_i = A * ([i == a] - pi_i - c),      c = pi_a - q,   q = sum_j pi_j^2,

so the only full-vocabulary quantities a truncated (top-K) view needs are the log-partition
function and sums of masses and squares; they come out of one chunked pass over the logits
(`softmax_stats`). Near pi_a = 1 those sums must be taken without cancellation: the sampled
token's own rate `1 - pi_a - c = 1 - 2 pi_a + q` is rounding noise in fp32 when written that way
(at pi_a = 0.9994 its sign comes out wrong), so it is computed as `(1 - pi_a)^2 + q_a` with
`1 - pi_a` and `q_a = sum_{j != a} pi_j^2` summed over the other tokens directly, and
`c = pi_a (1 - pi_a) - q_a`; the bucket R's mass and sum of squares are likewise summed over R
itself rather than taken as 1 (or `q`) minus the explicit categories', and mu's `1 - sum_S mu`
goes through log1p/expm1. Log-probabilities are `(z - max z) - log sum exp(z - max z)`, never
`z - lse`, which at logits of magnitude 60 rounds at 4e-6. The estimators then differ only in
the categories they compare:

- `exact`: the whole vocabulary, with the full `mu` (chunked over rows: O(chunk * V) memory).
- `binary`: {a, rest}. On two categories every kind's `g` has the sign of `A * (pi_a - mu_a)`,
  which is DPPO's ratio rule.
- `topk`: the top-K ids plus `a`, and one bucket R for everything else.
- `topk_tail`: the full vocabulary with `mu` imputed inside R as `pi_i * mu_R / pi_R`. Because
  the imputed ratio mu_i / pi_i is constant on R, every kind here (all f-divergences) and its
  first derivative coincide with `topk`'s lumped values; it is kept as an independent full-vocab
  computation so tests and benchmarks can check that identity rather than assume it.

Everything is computed in fp32 whatever the logits' dtype, and probabilities are floored at
1e-30 (log-probs at `LOG_FLOOR`), so -inf behavior log-probs (top-p rollouts) and 1e-30 masses
stay finite.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

from core.objective import full_vocab
from core.objective.behavior import BehaviorView
from core.objective.lazy_logits import GatheredLogits
from core.objective.row_sums import chunk_sums, log_of_sum

Kind = Literal["tv", "kl", "kl_reverse"]
Estimator = Literal["exact", "binary", "topk", "topk_tail"]
KINDS: tuple[str, ...] = get_args(Kind)
ESTIMATORS: tuple[str, ...] = get_args(Estimator)

PROB_FLOOR = 1e-30
LOG_FLOOR = math.log(PROB_FLOOR)
# Rows x vocab elements handled at once by full-vocabulary passes: bounds their scratch memory to
# a few chunks (8 MiB each in fp32, cache-friendly) instead of whole (N, V) tensors.
CHUNK_ELEMENTS = 1 << 21
# The bucket R's mass is 1 - (a sum of fp32 probabilities), so below ~1e-6 it is rounding noise:
# both pi_R and mu_R are floored there, or noise against a true zero would read as divergence.
BUCKET_FLOOR = 1e-6


@dataclass(frozen=True)
class SoftmaxStats:
    """Per-row reductions of the current policy that every estimator needs.

    The log-partition function is kept as its two parts, the row's largest logit and the log of
    the sum of exponentials below it, so that a log-probability is `(z - zmax) - log_norm`:
    with logits of magnitude 30-60 (language models), `z - (zmax + log_norm)` would round at
    ulp(60) = 4e-6 and so would every probability and ratio built on it.
    """

    zmax: Tensor  # (N,) each row's largest finite logit (0 where there is none)
    log_norm: Tensor  # (N,) log sum_i exp(z_i - zmax)
    sum_sq: Tensor  # (N,) q = sum_i pi_i^2
    entropy: Tensor | None  # (N,) H(pi), when asked for
    rest_mass: Tensor | None = None  # (N,) 1 - pi_a = sum_{j != a} pi_j, given the tokens
    rest_sq: Tensor | None = None  # (N,) q_a = sum_{j != a} pi_j^2, given the tokens
    tail_mass: Tensor | None = None  # (N,) pi_R: the mass outside the view's ids and a
    tail_sq: Tensor | None = None  # (N,) sum of pi_j^2 over R
    kth_logit: Tensor | None = None  # (N,) the K-th largest logit, when a K is given

    @property
    def lse(self) -> Tensor:
        """(N,) the log-partition function of the fp32 logits."""
        return self.zmax + self.log_norm

    def log_probs(self, logits: Tensor | GatheredLogits, ids: Tensor) -> Tensor:
        """(N, S) fp32 log pi at the columns `ids` (N, S) of `logits` (or of the columns the
        fused loss gathered)."""
        z = logits.at(ids) if isinstance(logits, GatheredLogits) else logits.gather(-1, ids).float()
        return (z - self.zmax.unsqueeze(-1)) - self.log_norm.unsqueeze(-1)


def _row_chunks(n: int, v: int) -> Iterator[slice]:
    rows = max(1, CHUNK_ELEMENTS // max(v, 1))
    for start in range(0, n, rows):
        yield slice(start, min(start + rows, n))


@torch.no_grad()
def softmax_stats(
    logits: Tensor,
    *,
    entropy: bool = False,
    tokens: Tensor | None = None,
    view_ids: Tensor | None = None,
) -> SoftmaxStats:
    """One chunked pass over the logits: log-partition, sum of squared probabilities, entropy.

    Given the sampled `tokens` (N,) it also sums the mass and squares of every other token
    (`rest_mass`, `rest_sq`), and given `view_ids` (N, K) the mass and squares outside the view
    and the token (`tail_mass`, `tail_sq`, the bucket R): each summed directly, never as a total
    minus a part, which near pi_a = 1 (or with a view holding nearly all the mass) would be all
    rounding (module docstring; `core.objective.row_sums`).

    Under half a `log_softmax`: nothing of size (N, V) is written back, and each chunk costs
    one fused softmax into a reused scratch (no fresh pages faulted in per chunk), two maxima
    and two reductions, each over a chunk that stays in cache.
    """
    n, v = logits.shape
    if view_ids is not None and tokens is None:
        raise ValueError("softmax_stats: view_ids needs the sampled tokens too")
    zmax_out = torch.empty(n, dtype=torch.float32, device=logits.device)
    log_norm = torch.empty_like(zmax_out)
    sum_sq = torch.empty_like(zmax_out)
    ent = torch.empty_like(zmax_out) if entropy else None
    with_rest = tokens is not None
    with_tail = view_ids is not None
    rest_mass = torch.empty_like(zmax_out) if with_rest else None
    rest_sq = torch.empty_like(zmax_out) if with_rest else None
    tail_mass = torch.empty_like(zmax_out) if with_tail else None
    tail_sq = torch.empty_like(zmax_out) if with_tail else None
    chunks = list(_row_chunks(n, v))
    rows_max = chunks[0].stop if chunks else 0
    scratch = torch.empty(rows_max, v, device=logits.device)
    scratch_z = torch.empty(rows_max, v, device=logits.device) if entropy else None
    for rows in chunks:
        z = logits[rows].float()
        c = z.shape[0]
        sums = chunk_sums(
            z,
            scratch.narrow(0, 0, c),  # fails, where a slice would resize: never too small
            None if tokens is None else tokens[rows].unsqueeze(-1),
            None if view_ids is None else view_ids[rows],
            None if scratch_z is None else scratch_z.narrow(0, 0, c),
        )
        s1 = sums.total
        s2 = s1 * s1
        log_s1 = log_of_sum(s1)
        zmax_out[rows] = sums.zmax
        log_norm[rows] = log_s1
        sum_sq[rows] = sums.sum_sq / s2
        if ent is not None and sums.ez is not None:
            # H = log s1 - sum_i pi_i (z_i - zmax): taken from the row's maximum like the
            # log-partition (as lse - sum_i pi_i z_i, logits in the thousands lost 6e-4 nats to
            # cancellation)
            ent[rows] = log_s1 - sums.ez / s1
        if rest_mass is not None and rest_sq is not None:
            assert sums.rest is not None and sums.rest_sq is not None
            rest_mass[rows] = sums.rest / s1
            rest_sq[rows] = sums.rest_sq / s2
        if tail_mass is not None and tail_sq is not None:
            assert sums.tail is not None and sums.tail_sq is not None
            tail_mass[rows] = sums.tail / s1
            tail_sq[rows] = sums.tail_sq / s2
    return SoftmaxStats(
        zmax=zmax_out,
        log_norm=log_norm,
        sum_sq=sum_sq,
        entropy=ent,
        rest_mass=rest_mass,
        rest_sq=rest_sq,
        tail_mass=tail_mass,
        tail_sq=tail_sq,
    )


def estimator_stats(
    logits: Tensor,
    behavior: BehaviorView,
    tokens: Tensor,
    estimator: str,
    *,
    entropy: bool = False,
) -> SoftmaxStats:
    """The `softmax_stats` an estimator needs (`binary`: the sums over everything but `a`;
    `topk`: also the bucket R's mass and squares), for callers that share one pass between the
    loss and the trust region."""
    if estimator not in ("binary", "topk"):  # the full-vocabulary estimators sum their own
        return softmax_stats(logits, entropy=entropy)
    view_ids = behavior.topk_ids if estimator == "topk" else None
    return softmax_stats(logits, entropy=entropy, tokens=tokens, view_ids=view_ids)


def _check(
    logits: Tensor | GatheredLogits,
    behavior: BehaviorView,
    tokens: Tensor,
    advantages: Tensor | None,
    *,
    kind: str,
    estimator: str,
) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
    if len(logits.shape) != 2:
        raise ValueError(f"logits must be (N, V), got {tuple(logits.shape)}")
    n = logits.shape[0]
    if tokens.shape != (n,):
        raise ValueError(f"tokens must be (N={n},), got {tuple(tokens.shape)}")
    if len(behavior) != n:
        raise ValueError(f"behavior has {len(behavior)} rows, logits have {n}")
    if advantages is not None and advantages.shape != (n,):
        raise ValueError(f"advantages must be (N={n},), got {tuple(advantages.shape)}")
    if estimator == "exact":
        if behavior.full_logprobs is None:
            raise ValueError("estimator 'exact' needs behavior.full_logprobs")
        if behavior.full_logprobs.shape != logits.shape:
            raise ValueError(
                f"full_logprobs {tuple(behavior.full_logprobs.shape)} must match "
                f"logits {tuple(logits.shape)}"
            )


def _category_terms(
    logp: Tensor, logm: Tensor, dlogp: Tensor | None, weight: Tensor | None, kind: str
) -> tuple[Tensor, Tensor | None]:
    """D and its derivative summed over the last dim's categories, given each one's log-probs
    under pi and mu and the rate `dlogp` at which log pi moves along the step.

    Where pi is floored (below 1e-30; 0 outside a top-p nucleus) its term of D is a constant,
    so it adds nothing to the change: TV's and reverse KL's terms carry a factor pi there
    already, KL(mu || pi)'s term -mu_i dlogp_i is dropped explicitly."""
    floored = logp < LOG_FLOOR if kind == "kl" and dlogp is not None else None
    logp = logp.clamp_min(LOG_FLOOR)
    logm = logm.clamp_min(LOG_FLOOR)
    p, m = logp.exp(), logm.exp()
    if kind == "tv":
        d_terms = 0.5 * (p - m).abs()
        g_terms = None if dlogp is None else 0.5 * torch.sign(p - m) * p * dlogp
    elif kind == "kl":
        d_terms = m * (logm - logp)
        g_terms = None
        if dlogp is not None and floored is not None:
            g_terms = torch.where(floored, 0.0, -m * dlogp)
    else:  # kl_reverse
        ratio = logp - logm
        d_terms = p * ratio
        g_terms = None if dlogp is None else p * dlogp * ratio
    if weight is not None:
        d_terms = d_terms * weight
        g_terms = None if g_terms is None else g_terms * weight
    return d_terms.sum(-1), None if g_terms is None else g_terms.sum(-1)


def _view_categories(
    behavior: BehaviorView, tokens: Tensor, estimator: str
) -> tuple[Tensor, Tensor, Tensor]:
    """The explicit categories S of a truncated view: ids (N, S), log mu (N, S), weight (N, S).

    The sampled token is appended so that S always holds it; duplicates (the sampled token
    already in the top-K, or padding ids) get weight 0 so no mass is counted twice.
    """
    a = tokens.unsqueeze(-1)
    if estimator == "binary":
        ids, logm = a, behavior.token_logprobs.unsqueeze(-1).float()
        return ids, logm, torch.ones_like(logm)
    ids = torch.cat([behavior.topk_ids, a], dim=-1)
    logm = torch.cat([behavior.topk_logprobs, behavior.token_logprobs.unsqueeze(-1)], dim=-1)
    sorted_ids, order = ids.sort(dim=-1, stable=True)
    first = torch.ones_like(sorted_ids, dtype=torch.bool)
    first[:, 1:] = sorted_ids[:, 1:] != sorted_ids[:, :-1]
    weight = torch.empty_like(first).scatter_(-1, order, first)
    return ids, logm.float(), weight.float()


@dataclass(frozen=True)
class _Bucketed:
    """Probabilities of the explicit categories S (weighted, duplicates zeroed) and of R."""

    p_s: Tensor  # (N, S)
    m_s: Tensor  # (N, S)
    p_r: Tensor  # (N,)
    m_r: Tensor  # (N,)


def _bucket(logp_s: Tensor, logm_s: Tensor, w: Tensor, p_tail: Tensor) -> _Bucketed:
    """S's weighted probabilities and R's masses: pi_R as summed over R (`p_tail`), mu_R from
    the view alone as 1 - sum_S mu through log1p/expm1, so neither is a difference of nearly
    equal numbers."""
    p_s = logp_s.clamp_min(LOG_FLOOR).exp() * w
    m_s = logm_s.clamp_min(LOG_FLOOR).exp() * w
    p_r = p_tail.clamp_min(BUCKET_FLOOR)
    m_r = _mass_outside(logm_s, w).clamp_min(BUCKET_FLOOR)
    return _Bucketed(p_s, m_s, p_r, m_r)


def _mass_outside(logm_s: Tensor, w: Tensor) -> Tensor:
    """1 - sum_i w_i exp(logm_i) per row, as -expm1(log sum): the largest term is factored out
    and the rest enters through log1p, exact to rounding however close the sum is to 1."""
    lm = torch.where(w > 0, logm_s.clamp_min(LOG_FLOOR), float("-inf"))  # (N, S)
    top, arg = lm.max(dim=-1, keepdim=True)
    others = (lm - top).exp().scatter(-1, arg, 0.0).sum(-1)
    return -torch.expm1(top.squeeze(-1) + torch.log1p(others))


def _lumped(
    logits: Tensor | GatheredLogits,
    behavior: BehaviorView,
    tokens: Tensor,
    advantages: Tensor | None,
    stats: SoftmaxStats,
    *,
    kind: str,
    estimator: str,
) -> tuple[Tensor, Tensor | None]:
    """`binary` and `topk`: categories S (explicit) plus one bucket R for the rest."""
    if stats.rest_mass is None or (estimator == "topk" and stats.tail_mass is None):
        if isinstance(logits, GatheredLogits):
            raise ValueError("gathered logits need stats with the estimator's sums")
        stats = estimator_stats(logits, behavior, tokens, estimator)
    assert stats.rest_mass is not None and stats.rest_sq is not None
    binary = estimator == "binary"  # R is everything but a
    p_tail = stats.rest_mass if binary else stats.tail_mass
    assert p_tail is not None
    ids, logm_s, w = _view_categories(behavior, tokens, estimator)
    logp_s = stats.log_probs(logits, ids)  # (N, S)
    b = _bucket(logp_s, logm_s, w, p_tail)
    p_s, p_r, m_r = b.p_s, b.p_r, b.m_r
    log_ratio_r = p_r.log() - m_r.log()

    dlogp_s = None
    dp_r = None
    if advantages is not None:
        adv = advantages.float()
        p_a = stats.log_probs(logits, tokens.unsqueeze(-1)).squeeze(-1).exp()
        rest, rest_sq = stats.rest_mass, stats.rest_sq
        c = p_a * rest - rest_sq  # pi_a - q, with no cancellation near pi_a = 1
        is_a = ids == tokens.unsqueeze(-1)
        own = rest * rest + rest_sq  # 1 - pi_a - c, the sampled token's rate, as a sum of squares
        dlogp_s = adv.unsqueeze(-1) * torch.where(is_a, own.unsqueeze(-1), -p_s - c.unsqueeze(-1))
        # Mass leaving R: dp_R = -A (sum_{i in R} pi_i^2 + c pi_R), the tail's squares summed over
        # R itself (binary: R is everything but a) and clamped into [0, pi_R^2] against rounding.
        tail_sq = rest_sq if binary else stats.tail_sq
        assert tail_sq is not None
        tail_sq = torch.minimum(tail_sq, p_r * p_r)
        dp_r = -adv * (tail_sq + c * p_r)

    d_s, g_s = _category_terms(logp_s, logm_s, dlogp_s, w, kind)
    # R's terms written so that no 1 - x cancellation enters TV: pi_R - mu_R = M - P exactly.
    if kind == "tv":
        diff_r = b.m_s.sum(-1) - p_s.sum(-1)
        d_r = 0.5 * diff_r.abs()
        g_r = None if dp_r is None else 0.5 * torch.sign(diff_r) * dp_r
    elif kind == "kl":
        d_r = -m_r * log_ratio_r
        g_r = None if dp_r is None else -m_r * dp_r / p_r
    else:
        d_r = p_r * log_ratio_r
        g_r = None if dp_r is None else dp_r * log_ratio_r
    d = d_s + d_r
    g = None if g_s is None or g_r is None else g_s + g_r
    return d, g


def _full_vocab(
    logits: Tensor,
    behavior: BehaviorView,
    tokens: Tensor,
    advantages: Tensor | None,
    *,
    kind: str,
    estimator: str,
) -> tuple[Tensor, Tensor | None]:
    """`exact` (full mu) and `topk_tail` (mu imputed on the tail), chunked over rows into
    reused scratch (`core.objective.full_vocab`): about twice a log_softmax, not ten."""
    n, v = logits.shape
    d_out = torch.empty(n, dtype=torch.float32, device=logits.device)
    g_out = torch.empty_like(d_out) if advantages is not None else None
    if estimator == "topk_tail":
        ids, logm_s, w = _view_categories(behavior, tokens, estimator)
    step = max(1, min(n, full_vocab.chunk_rows(v)))  # no rows: no chunk, and no zero step
    scratch = full_vocab.Scratch.make(step, v, logits.device)
    tail_logm = None
    if estimator == "topk_tail" and kind != "tv":  # the KL kinds read log mu itself
        tail_logm = torch.empty(step, v, device=logits.device)
    for start in range(0, n, step):
        rows = slice(start, min(start + step, n))
        z = logits[rows].float()
        s = scratch.rows(z.shape[0])
        a = tokens[rows].unsqueeze(-1)
        adv = None if advantages is None else advantages[rows].float().unsqueeze(-1)
        full_vocab.probs_into(z, s.p)
        if estimator == "exact":
            assert behavior.full_logprobs is not None
            logm = behavior.full_logprobs[rows].float()
            if kind != "kl_reverse":
                torch.exp(logm, out=s.m)
        else:
            ids_c = ids[rows]
            p_ids = s.p.gather(-1, ids_c)
            p_tail = s.p.scatter_(-1, ids_c, 0.0).sum(-1)  # pi_R, summed over R
            s.p.scatter_(-1, ids_c, p_ids)
            b = _bucket(p_ids.log(), logm_s[rows], w[rows], p_tail)
            log_ratio = (b.m_r.log() - b.p_r.log()).unsqueeze(-1)  # mu_i / pi_i on R
            torch.mul(s.p, log_ratio.exp(), out=s.m)
            s.m.scatter_(-1, ids_c, logm_s[rows].clamp_min(LOG_FLOOR).exp())
            logm = s.m  # unused by TV
            if tail_logm is not None:
                logm = tail_logm.narrow(0, 0, z.shape[0])
                full_vocab.log_probs_into(z, s.p, logm).add_(log_ratio)
                logm.scatter_(-1, ids_c, logm_s[rows])
        if kind == "tv":
            d, g = full_vocab.tv_terms(s, a, adv)
        else:
            d, g = full_vocab.kl_terms(s, z, logm, a, adv, kind=kind)
        d_out[rows] = d
        if g_out is not None and g is not None:
            g_out[rows] = g
    return d_out, g_out


@torch.no_grad()
def divergence_and_change(
    logits: Tensor | GatheredLogits,
    behavior: BehaviorView,
    tokens: Tensor,
    advantages: Tensor | None,
    *,
    kind: str,
    estimator: str,
    stats: SoftmaxStats | None = None,
) -> tuple[Tensor, Tensor | None]:
    """D (N,) and, when advantages are given, its predicted change g (N,) in one pass.

    `stats` lets a caller that already ran `estimator_stats` (the loss, for entropy) share it;
    stats without the sums the estimator needs are completed by a pass of their own.
    """
    _check(logits, behavior, tokens, advantages, kind=kind, estimator=estimator)
    if isinstance(logits, GatheredLogits):  # the fused loss: its own pass made the stats
        if estimator not in ("binary", "topk") or stats is None:
            raise ValueError("gathered logits serve the binary and topk estimators, with stats")
        return _lumped(logits, behavior, tokens, advantages, stats, kind=kind, estimator=estimator)
    if estimator in ("exact", "topk_tail"):
        return _full_vocab(logits, behavior, tokens, advantages, kind=kind, estimator=estimator)
    if stats is None:
        stats = estimator_stats(logits, behavior, tokens, estimator)
    return _lumped(logits, behavior, tokens, advantages, stats, kind=kind, estimator=estimator)


def divergence(
    logits: Tensor,
    behavior: BehaviorView,
    tokens: Tensor,
    *,
    kind: Kind = "tv",
    estimator: Estimator = "topk",
) -> Tensor:
    """D(mu, pi) per token (N,), fp32, from the estimator's view of mu."""
    d, _ = divergence_and_change(logits, behavior, tokens, None, kind=kind, estimator=estimator)
    return d


def predicted_change(
    logits: Tensor,
    behavior: BehaviorView,
    tokens: Tensor,
    advantages: Tensor,
    *,
    kind: Kind = "tv",
    estimator: Estimator = "topk",
) -> Tensor:
    """d/de D(mu, softmax(z + e A (onehot(a) - pi))) at e = 0 per token (N,), in closed form.

    Positive means this token's own gradient step would take pi further from mu.
    """
    _, g = divergence_and_change(
        logits, behavior, tokens, advantages, kind=kind, estimator=estimator
    )
    assert g is not None
    return g
