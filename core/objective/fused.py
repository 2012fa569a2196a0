"""The fused loss's passes over the vocabulary: from hidden states and the output projection, one
chunk of logits at a time (`core.objective.loss.fused_policy_loss` is the loss they make).

At the vocabularies of current models (128k-152k) the fp32 logits of a minibatch, with their
gradient and cross-entropy's log-softmax, are the largest tensors of an RL update. The loss needs
far less of them (`core.objective.estimators`): per row the log-partition function, the entropy, the
mass and squares of everything but the sampled token (and but the behavior view's ids), and the
logits of those few ids. All of it accumulates over vocabulary chunks of `hidden @ weight.T`, so
the fused loss never holds more than one (rows x columns) chunk, `CHUNK_ELEMENTS` entries:

1. one no-grad pass over the chunks (`projected_stats`) with an online maximum: running sums
   are rescaled by exp(old max - new max), squares by its square, and the sums that exclude
   columns (the sampled token's, the view's) are summed directly over the rest with those
   columns zeroed in the chunk, never as a total minus a part (the precision traps of
   `core.objective.estimators`, kept here); the same chunks give the logits of the columns the
   estimators read (`GatheredLogits`);
2. the trust region from those (`core.objective.masks.trust_region`, unchanged);
3. log pi(a) through `TokenLogProb`, an autograd function whose backward recomputes each chunk
   of logits and accumulates the gradients of the hidden states and of the projection,
   G = grad * (onehot(a) - pi) / T per row: grad_hidden += G @ W_c, grad_W[c] = G^T @ hidden;
   gradients whose input does not need one (a frozen projection, as under LoRA) are skipped.
   The token's own entry 1 - pi_a is the stats pass's sum over the other tokens: written as
   1 - pi_a it is rounding near pi_a = 1 (1e-3 relative at 0.9999, in cross-entropy's
   gradient too), and the most confident tokens are most of a language model's;
4. the loss arithmetic from log pi(a) on, shared with `core.objective.loss.policy_loss`.

Everything is fp32 whatever the dtype of the hidden states and the projection (a bf16 model's):
each chunk of the projection is cast before its matmul, and its gradient accumulated in fp32
before it is cast back. The cost is one more matmul of the logits' size than the unfused loss
(the backward recomputes what the stats pass computed) and none of its (N, V) memory.

The `exact` and `topk_tail` estimators need the full behavior distribution or the whole pi row
at once: they keep the unfused path (`policy_loss` with logits), and so does top-p truncation,
which needs every row's sorted probabilities (`core.objective.truncation`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from core.objective.estimators import SoftmaxStats
from core.objective.lazy_logits import GatheredLogits, ProjectedLogits

CHUNK_ELEMENTS = 1 << 22
"""Most logits (rows x columns) held at once: 16 MiB in fp32, a few such buffers in all."""

VOCAB_CHUNK = 4096
"""Widest vocabulary chunk; rows per chunk follow (`CHUNK_ELEMENTS // columns`, 1024 at this
width). Matmuls of 1024 x H by H x 4096 run near peak on CPU and GPU alike."""

FUSED_ESTIMATORS = ("binary", "topk")


def _spans(n: int, size: int) -> list[slice]:
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]


def _chunking(n: int, v: int) -> tuple[list[slice], list[slice]]:
    """(row chunks, column chunks) of the (N, V) logits."""
    cols = max(1, min(v, VOCAB_CHUNK))
    return _spans(n, max(1, CHUNK_ELEMENTS // cols)), _spans(v, cols)


def _local(ids: Tensor, cols: slice) -> Tensor:
    """Column `ids` (..., S) as indices into a chunk of columns `cols` padded with one spare
    column: ids outside the chunk point at the spare (index `width`), which is never summed,
    so that scatters and gathers need no branch on where an id lies."""
    width = cols.stop - cols.start
    local = ids - cols.start
    return torch.where((local >= 0) & (local < width), local, width)


def _logits_chunk(
    out: Tensor, hidden: Tensor, w_c: Tensor, b_c: Tensor | None, temperature: float
) -> Tensor:
    """(hidden @ w_c.T + b_c) / temperature into `out` (R, C), fp32; `hidden` is fp32."""
    torch.mm(hidden, w_c.T, out=out)
    if b_c is not None:
        out.add_(b_c)
    if temperature != 1.0:
        out.div_(temperature)
    return out


@dataclass(frozen=True)
class _Casts:
    """The fp32 views of a projection, chunk by chunk (casts only what is not fp32)."""

    hidden: Tensor  # (N, H) fp32
    weight: Tensor
    bias: Tensor | None

    def chunk(self, cols: slice) -> tuple[Tensor, Tensor | None]:
        w_c = self.weight[cols].float()
        return w_c, None if self.bias is None else self.bias[cols].float()


@torch.no_grad()
def projected_stats(
    proj: ProjectedLogits,
    tokens: Tensor,
    view_ids: Tensor | None = None,
    *,
    entropy: bool = False,
    sums: bool = True,
    top_k: int | None = None,
) -> tuple[SoftmaxStats, GatheredLogits]:
    """`core.objective.estimators.softmax_stats` of the projected logits, chunk by chunk, given the
    sampled `tokens` (N,) (and the view's `view_ids` (N, K): the bucket R's sums), plus the logits
    at the view's ids and the token (`GatheredLogits`, the token's column last).

    `sums=False` stops at the log-partition function and `rest_mass` (no squares: `sum_sq`
    is then left at 0), all that log pi(a) and its gradient need (the reference policy, the
    warm-up). `top_k`: also each row's K-th largest logit (`kth_logit`), from a running top-K
    merged chunk by chunk (whether the sampled token is in pi's top-K: how far the sampler
    strays from the trainer)."""
    n, v = proj.shape
    if tokens.shape != (n,):
        raise ValueError(f"tokens must be (N={n},), got {tuple(tokens.shape)}")
    dev = proj.hidden.device
    a = tokens.unsqueeze(-1)
    ids = a if view_ids is None else torch.cat([view_ids, a], dim=-1)  # (N, S)
    values = torch.zeros(ids.shape, dtype=torch.float32, device=dev)

    def acc() -> Tensor:
        return torch.zeros(n, dtype=torch.float32, device=dev)

    run_max = torch.full((n,), float("-inf"), device=dev)
    s1, rest, others_sq = acc(), acc(), acc()
    ent = acc() if entropy else None
    run_top = None if top_k is None else torch.full((n, top_k), float("-inf"), device=dev)
    tail, tail_sq = (acc(), acc()) if view_ids is not None else (None, None)
    casts = _Casts(proj.hidden.float(), proj.weight, proj.bias)
    row_spans, col_spans = _chunking(n, v)
    size = row_spans[0].stop * (col_spans[0].stop + 1)
    zbuf = torch.empty(size, device=dev)
    ebuf = torch.empty(size, device=dev)
    for cols in col_spans:
        w_c, b_c = casts.chunk(cols)
        width = cols.stop - cols.start
        for rows in row_spans:
            r = rows.stop - rows.start
            z = zbuf[: r * width].view(r, width)
            _logits_chunk(z, casts.hidden[rows], w_c, b_c, proj.temperature)
            if run_top is not None and top_k is not None:
                best = z.topk(min(top_k, width), dim=-1).values  # before z is shifted below
                run_top[rows] = torch.cat([run_top[rows], best], -1).topk(top_k, dim=-1).values
            local = _local(ids[rows], cols)  # (R, S)
            got = z.gather(-1, local.clamp(max=width - 1))
            values[rows] = torch.where(local < width, got, values[rows])
            # online maximum: sums so far were taken relative to the old one
            old = run_max[rows].clone()  # a copy: the slice is overwritten next
            new = torch.maximum(old, z.amax(dim=-1))
            run_max[rows] = new
            off = torch.where(torch.isfinite(new), new, 0.0)
            old_off = torch.where(torch.isfinite(old), old, 0.0)
            alpha = torch.where(torch.isfinite(old), torch.exp(old - off), 0.0)
            z.sub_(off.unsqueeze(-1))  # z - max: the exponent, exact in fp32
            padded = ebuf[: r * (width + 1)].view(r, width + 1)
            e = torch.exp(z, out=padded[:, :width])  # (R, C), the spare column after it
            s1_old = s1[rows].clone()
            s1[rows] = s1_old * alpha + e.sum(dim=-1)
            if ent is not None:
                # sum_j e_j (z_j - max), moved to the new maximum; -inf logits contribute 0
                ez = torch.mul(z, e, out=z).nan_to_num_(nan=0.0).sum(dim=-1)
                ent[rows] = alpha * (ent[rows] + (old_off - off) * s1_old) + ez
            a_col = _local(a[rows], cols)
            padded.scatter_(-1, a_col, 0.0)  # everything but the sampled token
            rest[rows] = rest[rows] * alpha + e.sum(dim=-1)
            if not sums:
                continue
            alpha2 = alpha * alpha
            if view_ids is not None and tail is not None and tail_sq is not None:
                v_col = _local(view_ids[rows], cols)
                e_ids = padded.gather(-1, v_col)  # the view's entries (a's is 0 by now)
                padded.scatter_(-1, v_col, 0.0)  # the bucket R alone
                tail[rows] = tail[rows] * alpha + e.sum(dim=-1)
                tail_sq[rows] = tail_sq[rows] * alpha2 + e.square_().sum(dim=-1)
                padded.scatter_(-1, v_col, e_ids * e_ids)  # back to everything but a, squared
            else:
                e.square_()
            others_sq[rows] = others_sq[rows] * alpha2 + e.sum(dim=-1)
    zmax = torch.where(torch.isfinite(run_max), run_max, 0.0)
    s2 = s1 * s1
    e_a = torch.exp(values[:, -1] - zmax)
    stats = SoftmaxStats(
        zmax=zmax,
        log_norm=s1.log(),
        sum_sq=(others_sq + e_a * e_a) / s2 if sums else acc(),
        entropy=None if ent is None else s1.log() - ent / s1,
        rest_mass=rest / s1,
        rest_sq=others_sq / s2 if sums else None,
        tail_mass=None if tail is None else tail / s1,
        tail_sq=None if tail_sq is None else tail_sq / s2,
        kth_logit=None if run_top is None else run_top[:, -1],
    )
    return stats, GatheredLogits(ids, values, v)


class TokenLogProb(torch.autograd.Function):
    """log pi(a) (N,) of the projected logits, from the log-partition function of the stats
    pass; the backward recomputes the logits chunk by chunk (module docstring, step 3)."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        tokens: Tensor,
        z_a: Tensor,
        zmax: Tensor,
        log_norm: Tensor,
        rest_mass: Tensor,
        temperature: float,
    ) -> Tensor:
        ctx.save_for_backward(hidden, weight, bias, tokens, zmax, log_norm, rest_mass)
        ctx.temperature = temperature
        return (z_a - zmax) - log_norm  # as SoftmaxStats.log_probs: no z - lse rounding

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        hidden, weight, bias, tokens, zmax, log_norm, rest_mass = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        temperature: float = ctx.temperature
        n, v = hidden.shape[0], weight.shape[0]
        dev = hidden.device
        g = grad_out.float() / temperature  # d log pi(a) / d raw logit = (onehot - pi) / T
        own = g * rest_mass  # the token's own entry g (1 - pi_a), without its cancellation
        casts = _Casts(hidden.float(), weight, bias)
        grad_h = torch.zeros(hidden.shape, dtype=torch.float32, device=dev) if need_h else None
        grad_w = torch.empty_like(weight) if need_w else None
        grad_b = torch.empty_like(bias) if need_b and bias is not None else None
        row_spans, col_spans = _chunking(n, v)
        zbuf = torch.empty(row_spans[0].stop * (col_spans[0].stop + 1), device=dev)
        a = tokens.unsqueeze(-1)
        for cols in col_spans:
            w_c, b_c = casts.chunk(cols)
            width = cols.stop - cols.start
            gw = None
            direct = grad_w is not None and grad_w.dtype == torch.float32  # accumulate in place
            if grad_w is not None:
                gw = grad_w[cols].zero_() if direct else torch.zeros(w_c.shape, device=dev)
            gb = torch.zeros(width, device=dev) if grad_b is not None else None
            for rows in row_spans:
                r = rows.stop - rows.start
                padded = zbuf[: r * (width + 1)].view(r, width + 1)
                z = _logits_chunk(padded[:, :width], casts.hidden[rows], w_c, b_c, temperature)
                pi = z.sub_(zmax[rows].unsqueeze(-1)).sub_(log_norm[rows].unsqueeze(-1)).exp_()
                grad_z = pi.mul_(-g[rows].unsqueeze(-1))  # -g pi, but at a's column:
                padded.scatter_(-1, _local(a[rows], cols), own[rows].unsqueeze(-1))
                if grad_h is not None:
                    grad_h[rows].addmm_(grad_z, w_c)
                if gw is not None:
                    gw.addmm_(grad_z.T, casts.hidden[rows])
                if gb is not None:
                    gb += grad_z.sum(dim=0)
            if grad_w is not None and gw is not None and not direct:
                grad_w[cols] = gw
            if grad_b is not None and gb is not None:
                grad_b[cols] = gb
        grad_hidden = None if grad_h is None else grad_h.to(hidden.dtype)
        return grad_hidden, grad_w, grad_b, None, None, None, None, None, None


def projected_token_logprobs(proj: ProjectedLogits, tokens: Tensor) -> Tensor:
    """(N,) log pi(a) of the projected logits, differentiable in the hidden states and the
    projection: cross-entropy's `-F.cross_entropy(logits, tokens, reduction="none")` without
    the logits (the warm-up's loss; the reference policy's log-probs under no_grad)."""
    stats, columns = projected_stats(proj, tokens, sums=False)
    return token_logprob(proj, tokens, stats, columns)


def token_logprob(
    proj: ProjectedLogits, tokens: Tensor, stats: SoftmaxStats, columns: GatheredLogits
) -> Tensor:
    assert stats.rest_mass is not None
    out = TokenLogProb.apply(
        proj.hidden,
        proj.weight,
        proj.bias,
        tokens,
        columns.values[:, -1],
        stats.zmax,
        stats.log_norm,
        stats.rest_mass,
        proj.temperature,
    )
    assert isinstance(out, Tensor)
    return out
