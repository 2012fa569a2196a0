"""The rollout engine: batched sampling with a KV cache that records what an engine would expose.

For every generated token it keeps the `BehaviorView` a production engine returns (vLLM
`logprobs=K`): the sampled token's log-prob and the top-K ids and log-probs of the sampling
distribution, with the sampled token forced into the top-K row when it is missing. Full log-probs
are kept only on request (the `exact` estimator). `mu` is the distribution actually sampled from:
temperature applied, top-p truncated and renormalized, computed from the rollout model's logits in
its own dtype (a bf16 rollout copy gives a genuinely different `mu`).

Layout shared with the trainer: prompts left-padded to P, responses right-padded to T, so response
token t of every row sits at column P + t and is predicted by the logits at column P + t - 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from core.behavior import BehaviorView
from core.models.base import CausalLM


class StopRequested(Exception):
    """Raised from inside a long step when the caller asked to stop: a rollout of thousands of
    rows or tokens can take minutes, and a cancel must not wait for it to finish."""


@dataclass
class RolloutBatch:
    input_ids: Tensor  # (B, P + T) prompt left-padded, response right-padded
    attention_mask: Tensor  # (B, P + T) bool, True = real token
    prompt_len: int  # P
    response_mask: Tensor  # (B, T) bool: generated tokens up to and including EOS
    behavior: BehaviorView  # rows: response tokens in row-major order of response_mask
    completions: list[list[int]]  # generated ids per row, EOS excluded

    @property
    def responses(self) -> Tensor:  # (B, T)
        return self.input_ids[:, self.prompt_len :]

    @property
    def tokens(self) -> Tensor:  # (N,) sampled tokens, same order as behavior rows
        return self.responses[self.response_mask]

    def position_ids(self) -> Tensor:
        return position_ids(self.attention_mask)

    def select(self, rows: Tensor) -> RolloutBatch:
        """The sub-batch of sequences `rows` (int64 indices), with its behavior rows."""
        token_row = torch.arange(len(self.response_mask), device=rows.device)[:, None]
        token_row = token_row.expand_as(self.response_mask)[self.response_mask]  # (N,)
        keep = torch.isin(token_row, rows)
        # rows must be sorted so that behavior rows stay in row-major order
        rows = rows.sort().values
        return RolloutBatch(
            self.input_ids[rows],
            self.attention_mask[rows],
            self.prompt_len,
            self.response_mask[rows],
            self.behavior.select(keep),
            [self.completions[int(i)] for i in rows],
        )


def position_ids(attention_mask: Tensor) -> Tensor:
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def left_pad(seqs: list[list[int]], pad: int, device: torch.device) -> tuple[Tensor, Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s) :] = True
    return ids.to(device), mask.to(device)


def sampling_logprobs(logits: Tensor, temperature: float, top_p: float) -> Tensor:
    """log mu over the vocabulary (fp32): temperature, then top-p truncation (-inf outside)."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    if top_p >= 1.0:
        return logp
    sorted_lp, order = logp.sort(dim=-1, descending=True)
    cum = sorted_lp.exp().cumsum(-1)
    drop_sorted = (cum - sorted_lp.exp()) >= top_p  # keep the smallest prefix reaching top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)


def topk_view(logp: Tensor, sampled: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Top-K ids and log-probs of each row of `logp` (B, V), the sampled token forced in."""
    vals, ids = logp.topk(min(k, logp.shape[-1]), dim=-1)  # (B, K)
    present = (ids == sampled[:, None]).any(-1)  # (B,)
    ids[~present, -1] = sampled[~present]
    vals[~present, -1] = logp.gather(-1, sampled[:, None])[~present, 0]
    return ids, vals


@torch.no_grad()
def generate(
    lm: CausalLM,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 20,
    keep_full: bool = False,
    generator: torch.Generator | None = None,
    should_stop: Callable[[], bool] | None = None,
    greedy: bool = False,
) -> RolloutBatch:
    """Sample one completion per prompt, stopping each row at EOS.

    `should_stop` is asked before every token; True raises `StopRequested` (nothing is kept).
    `greedy=True` takes the argmax of the logits instead (evaluation): nothing is sampled, so
    no generator is drawn from, and no behavior is recorded (the view has no rows; a greedy
    batch is scored, never trained on)."""
    device = lm.device
    tok = lm.tokenizer
    ids, mask = left_pad(prompts, tok.pad_id, device)  # (B, P)
    b, p = ids.shape
    pos = position_ids(mask)
    finished = torch.zeros(b, dtype=torch.bool, device=device)
    out_tokens, out_alive, tok_lp, top_ids, top_lp, full = [], [], [], [], [], []
    logits, cache = lm.forward(ids, mask, pos, keep_last=1)
    next_pos = pos[:, -1] + 1
    for _ in range(max_new_tokens):
        if should_stop is not None and should_stop():
            raise StopRequested("stopped during generation")
        if greedy:
            a = logits[:, -1].argmax(dim=-1)  # (B,)
        else:
            logp = sampling_logprobs(logits[:, -1], temperature, top_p)  # (B, V) fp32
            a = torch.multinomial(logp.exp(), 1, generator=generator)[:, 0]  # (B,)
        a = torch.where(finished, torch.full_like(a, tok.pad_id), a)
        alive = ~finished
        out_tokens.append(a)
        out_alive.append(alive)
        if not greedy:
            tok_lp.append(logp.gather(-1, a[:, None])[:, 0])
            ti, tl = topk_view(logp, a, top_k)
            top_ids.append(ti)
            top_lp.append(tl)
            if keep_full:
                full.append(logp)
        finished = finished | (a == tok.eos_id)
        mask = torch.cat([mask, alive[:, None]], dim=1)
        if bool(finished.all()):
            break
        logits, cache = lm.forward(a[:, None], mask, next_pos[:, None], cache, keep_last=1)
        next_pos = next_pos + 1
    resp = torch.stack(out_tokens, 1)  # (B, T)
    rmask = torch.stack(out_alive, 1)  # (B, T)
    if greedy:
        view = BehaviorView(
            torch.zeros(0, device=device),
            torch.zeros((0, 1), dtype=torch.long, device=device),
            torch.zeros((0, 1), device=device),
        )
    else:
        view = BehaviorView(
            torch.stack(tok_lp, 1)[rmask],
            torch.stack(top_ids, 1)[rmask],
            torch.stack(top_lp, 1)[rmask],
            torch.stack(full, 1)[rmask] if keep_full else None,
        )
    completions = []
    for row, alive in zip(resp.tolist(), rmask.tolist(), strict=True):
        gen = [t for t, keep in zip(row, alive, strict=True) if keep]
        completions.append(gen[:-1] if gen and gen[-1] == tok.eos_id else gen)
    return RolloutBatch(
        input_ids=torch.cat([ids, resp], dim=1),
        attention_mask=mask,
        prompt_len=p,
        response_mask=rmask,
        behavior=view,
        completions=completions,
    )


def response_logits(lm: CausalLM, batch: RolloutBatch, temperature: float) -> Tensor:
    """The trained policy's fp32 logits (N, V) at the response tokens, scaled like sampling."""
    t = batch.response_mask.shape[1]
    logits, _ = lm.forward(
        batch.input_ids, batch.attention_mask, batch.position_ids(), keep_last=t + 1
    )  # (B, T + 1, V): columns P - 1 .. P + T - 1
    at = logits[:, :t]  # column P - 1 + t predicts response token t
    return at[batch.response_mask].float() / temperature
