"""The training forward with each distinct prompt computed once for all the rows that share it.

A GRPO batch holds `group_size` completions of every prompt, and a minibatch all or part of a
group: running every row in full computes each prompt's positions once per completion (two thirds
of the positions with 16-token prompts and 8-token answers, far more with long prompts). Here the
U distinct prompts of a minibatch run once, with grad, with a KV cache; their keys and values are
indexed out to the B rows (`CausalLM.expand_cache`: an index, so the rows' gradients add up in the
prompt positions, exactly as the full forward's do); then the response positions run against
[prompt keys, own keys]. Only the logits the loss reads are computed: the last prompt position's
(it predicts response token 0) and response positions 0 .. T - 2, T columns in all.

Same logits and gradients as the full forward up to fp32 rounding (tests/core/test_shared_prefix.py:
1e-5 relative, left padding, groups split across minibatches, responses ending early).
Leading columns that are padding in every distinct prompt, and trailing response columns that no
row reaches, are not computed: positions come from the attention mask, so nothing else moves.

Not padding-free: rows of a minibatch are still padded to its longest prompt and response.
Packing them into one ragged sequence would need a varlen attention kernel (flash-attn's, on GPU
only) or a block-diagonal mask whose cost grows with the square of the packed length on CPU; with
the prompts shared the padding left is a response's tail, small next to what sharing removes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from core.models.base import CausalLM


def distinct_rows(ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(first, rows) for left-padded prompts `ids`/`mask` (B, P): `first` (U,) the index of one
    row per distinct prompt, `rows` (B,) the index into `first` of each row's prompt. Rows are
    equal when their real tokens are; the layout of the batch (groups in a row or not) does not
    matter."""
    key = torch.where(mask.bool(), ids, torch.full_like(ids, -1))  # padding equals no token
    _, rows = torch.unique(key, dim=0, return_inverse=True)
    n_distinct = int(rows.max()) + 1 if len(rows) else 0
    order = torch.arange(len(rows), device=ids.device)
    first = torch.full((n_distinct,), len(rows), dtype=torch.long, device=ids.device)
    first = first.scatter_reduce(0, rows, order, reduce="amin")
    return first, rows


def shared_prefix_logits(
    lm: CausalLM,
    input_ids: Tensor,  # (B, P + T) prompt left-padded, response right-padded
    attention_mask: Tensor,  # (B, P + T)
    prompt_len: int,  # P
    response_mask: Tensor,  # (B, T)
    first: Tensor,  # (U,) from `distinct_rows` over the prompt part
    rows: Tensor,  # (B,)
    *,
    hidden: bool = False,
) -> Tensor:
    """(N, V) logits, in the module's dtype, of the response tokens in row-major order of
    `response_mask`: the logits `lm.forward` gives over whole rows at the same columns.
    `hidden`: the final hidden states (N, H) there instead (`lm.forward_hidden`)."""
    if not lm.shares_prefix:
        raise ValueError(f"{type(lm).__name__} cannot share prompts across rows (shares_prefix)")
    p = prompt_len
    used = response_mask.any(0).nonzero()
    t = int(used[-1]) + 1 if len(used) else 1  # response columns some row reaches
    mask = attention_mask[:, : p + t].bool()
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)  # as `core.rollout.position_ids`
    prompt_mask = mask[first, :p]  # (U, P)
    real = prompt_mask.any(0).nonzero()
    start = int(real[0]) if len(real) else 0  # columns before it are padding in every prompt
    run = lm.forward_hidden if hidden else lm.forward
    head, cache = run(
        input_ids[first, start:p], prompt_mask[:, start:], pos[first, start:p], keep_last=1
    )  # (U, 1, V): the last prompt position predicts response token 0
    logits = head[rows]  # (B, 1, V)
    if t > 1:
        cache = lm.expand_cache(cache, rows)  # (B, ...) keys and values, with grad
        tail, _ = run(
            input_ids[:, p : p + t - 1],
            mask[:, start : p + t - 1],
            pos[:, p : p + t - 1],
            cache,
            use_cache=False,
        )  # (B, T - 1, V): response position j predicts response token j + 1
        logits = torch.cat([logits, tail], dim=1)
    return logits[response_mask[:, :t]]
