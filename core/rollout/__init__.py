"""The rollout engine: batched sampling with a KV cache that records what an engine would expose.

The package: this engine (`generate`, `RolloutBatch`) here; `prefix`: a prompt's keys and values
shared by its group's rows; `vllm_engine`: the same batches sampled by vLLM; `server`: this engine
in a process of its own, sampling while the trainer updates (`rollout.mode: async`); `episodes`:
multi-turn episodes with a `core.environments` environment, its tokens inserted between the
sampled turns and masked out of the loss. Imports: `core.objective` (the behavior view),
`core.models`, `core.config`, `core.parallel` (vLLM's ranks), `core.process` (the server dies
with its parent), `core.environments` and `core.tasks` (episodes and their task rows); not the
training loop.

For every generated token it keeps the `BehaviorView` a production engine returns (vLLM
`logprobs=K`): the sampled token's log-prob and the top-K ids and log-probs of the sampling
distribution, with the sampled token forced into the top-K row when it is missing. Full log-probs
are kept only on request (the `exact` estimator). `mu` is the distribution actually sampled from:
temperature applied, top-p truncated and renormalized, computed from the rollout model's logits in
its own dtype (a bf16 rollout copy gives a genuinely different `mu`).

Layout shared with the trainer: prompts left-padded to P, responses right-padded to T, so response
token t of every row sits at column P + t and is predicted by the logits at column P + t - 1.

What a step costs (issue 11, bench/step_breakdown.py): the `group_size` rows of a prompt share it,
so `generate` prefills each distinct prompt once and the training forward (`response_logits`)
runs it once per minibatch (`core.rollout.prefix`); decoding writes one column per token into a
preallocated cache, drops finished rows, reads nothing back from a GPU but every `SYNC_EVERY`
tokens, and samples by inverse CDF (`sample_tokens`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor

from core.models.base import CausalLM
from core.objective.behavior import BehaviorView
from core.objective.lazy_logits import ProjectedLogits
from core.rollout.prefix import distinct_rows, shared_prefix_logits

if TYPE_CHECKING:
    from core.config import TrainConfig


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

    @classmethod
    def assemble(
        cls,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        responses: Tensor,
        response_mask: Tensor,
        behavior: BehaviorView,
        eos: int,
    ) -> RolloutBatch:
        """The batch of left-padded prompts (B, P) and right-padded responses (B, T), whichever
        engine sampled them; each row's completion is its response up to EOS, EOS excluded."""
        completions = []
        for row, alive in zip(responses.tolist(), response_mask.tolist(), strict=True):
            gen = [tok for tok, keep in zip(row, alive, strict=True) if keep]
            completions.append(gen[:-1] if gen and gen[-1] == eos else gen)
        return cls(
            input_ids=torch.cat([prompt_ids, responses], dim=1),
            attention_mask=torch.cat([prompt_mask, response_mask], dim=1),
            prompt_len=prompt_ids.shape[1],
            response_mask=response_mask,
            behavior=behavior,
            completions=completions,
        )

    def select(self, rows: Tensor) -> RolloutBatch:
        """The sub-batch of sequences `rows` (int64 indices), with its behavior rows."""
        token_row = torch.arange(len(self.response_mask), device=rows.device)[:, None]
        token_row = token_row.expand_as(self.response_mask)[self.response_mask]  # (N,)
        keep = torch.isin(token_row, rows)
        # rows must be sorted so that behavior rows stay in row-major order
        rows = rows.sort().values
        return RolloutBatch(
            input_ids=self.input_ids[rows],
            attention_mask=self.attention_mask[rows],
            prompt_len=self.prompt_len,
            response_mask=self.response_mask[rows],
            behavior=self.behavior.select(keep),
            completions=[self.completions[int(i)] for i in rows],
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
    """Top-K ids and log-probs of each row of `logp` (B, V), the sampled token forced in (as
    the K-th entry when it is missing). No boolean indexing: nothing waits for the GPU."""
    vals, ids = logp.topk(min(k, logp.shape[-1]), dim=-1)  # (B, K)
    present = (ids == sampled[:, None]).any(-1)  # (B,)
    sampled_lp = logp.gather(-1, sampled[:, None])[:, 0]
    last_id = torch.where(present, ids[:, -1], sampled)
    last_lp = torch.where(present, vals[:, -1], sampled_lp)
    ids = torch.cat([ids[:, :-1], last_id[:, None]], dim=1)
    vals = torch.cat([vals[:, :-1], last_lp[:, None]], dim=1)
    return ids, vals


def sample_tokens(logp: Tensor, u: Tensor) -> Tensor:
    """One token per row of `logp` (B, V) fp32 log-probs, by inverse CDF from uniforms `u` (B,)
    in [0, 1): the first token whose cumulative probability exceeds u times the row's total.

    Exactly the distribution exp(logp) up to fp32 rounding of the cumulative sums, like
    `torch.multinomial` (which costs 1.0 ms a token where this costs 0.06, issue 11). A token of
    probability 0 (-inf, cut by top-p) is never drawn: its step of the cumulative sum is empty,
    and the target is kept below the total (u = 1, which torch.rand never draws, would
    otherwise run past the last token)."""
    cdf = logp.exp().cumsum(-1)  # (B, V)
    total = cdf[:, -1:]  # (B, 1)
    below = torch.nextafter(total, torch.zeros_like(total))
    target = torch.minimum(u[:, None].to(cdf.dtype) * total, below)  # (B, 1)
    return torch.searchsorted(cdf, target, right=True)[:, 0]


SYNC_EVERY = 8
"""On a GPU, tokens decoded between two looks at which rows have finished (a host sync): the
loop ends when all have, and finished rows leave decoding. On CPU the look is free: every token."""

DROP_FRACTION = 0.25
"""Finished rows leave decoding (one copy of the cache) once they are this share of those still
decoded: a copy per few finished rows, not one per row."""


@dataclass(frozen=True)
class SamplingOptions:
    """How a rollout samples (`generate`'s sampling arguments), read from the config at each
    step or request, so that a steered temperature or length applies from the next one on."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 20
    keep_full: bool = False

    @classmethod
    def of(cls, cfg: TrainConfig) -> SamplingOptions:
        r = cfg.rollout
        return cls(
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=cfg.algorithm.top_k,
            keep_full=cfg.algorithm.estimator == "exact",
        )


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

    Each distinct prompt is prefilled once and its cache expanded to the rows that hold it
    (`CausalLM.shares_prefix`; rows need not be consecutive); decoding writes into a cache
    preallocated for `max_new_tokens` and drops finished rows from it (`DROP_FRACTION`). Every
    token draws one uniform per row, decoded or not, so a row's completion depends on its own
    draws only, not on when other rows finish or how often the loop looks (`SYNC_EVERY`).

    `should_stop` is asked before every token; True raises `StopRequested` (nothing is kept).
    `greedy=True` takes the argmax of the logits instead (evaluation): nothing is sampled, so
    no generator is drawn from, and no behavior is recorded (the view has no rows; a greedy
    batch is scored, never trained on)."""
    device = lm.device
    tok = lm.tokenizer
    ids, mask = left_pad(prompts, tok.pad_id, device)  # (B, P)
    b, p = ids.shape
    pos = position_ids(mask)
    logits, cache, droppable = _prefill(lm, prompts, ids, mask=mask, pos=pos, room=max_new_tokens)
    record_full = keep_full and not greedy
    rec = _Record(
        b=b,
        t=max_new_tokens,
        vocab=logits.shape[-1],
        top_k=top_k,
        keep_full=record_full,
        pad=tok.pad_id,
        device=device,
    )
    finished = torch.zeros(b, dtype=torch.bool, device=device)
    active: Tensor | None = None  # rows still decoded, None: all of them
    dec_mask = torch.zeros((b, p + max_new_tokens), dtype=torch.bool, device=device)
    dec_mask[:, :p] = mask  # attention mask of the decoded rows
    next_pos = pos[:, -1] + 1  # (A,)
    look_every = SYNC_EVERY if device.type == "cuda" else 1
    steps = 0
    for t in range(max_new_tokens):
        if should_stop is not None and should_stop():
            raise StopRequested("stopped during generation")
        last = logits[:, -1]  # (A, V)
        done = finished if active is None else finished[active]  # (A,)
        logp = None
        if greedy:
            a = last.argmax(dim=-1)  # (A,)
        else:
            u = torch.rand(b, generator=generator, device=device)  # (B,): every row draws
            logp = sampling_logprobs(last, temperature, top_p)  # (A, V) fp32
            a = sample_tokens(logp, u if active is None else u[active])
        a = torch.where(done, torch.full_like(a, tok.pad_id), a)
        alive = ~done  # this token is real (EOS included), a key for the next ones
        rec.write(t, active, a, alive=alive, logp=logp, top_k=top_k)
        dec_mask[:, p + t] = alive
        done = done | (a == tok.eos_id)
        if active is None:
            finished = done
        else:
            finished[active] = done
        steps = t + 1
        if steps == max_new_tokens:
            break
        if steps % look_every == 0:
            n_done = int(done.sum())
            if n_done == len(done):
                break
            if droppable and n_done >= DROP_FRACTION * len(done):
                keep = (~done).nonzero()[:, 0]
                active = keep if active is None else active[keep]
                cache = lm.select_cache(cache, keep)
                dec_mask, a, next_pos = dec_mask[keep], a[keep], next_pos[keep]
        logits, cache = lm.forward(
            a[:, None], dec_mask[:, : p + t + 1], next_pos[:, None], cache, keep_last=1
        )
        next_pos = next_pos + 1
    return rec.batch(ids, mask, steps, tok.eos_id, greedy)


def _prefill(
    lm: CausalLM,
    prompts: list[list[int]],
    ids: Tensor,
    mask: Tensor,
    pos: Tensor,
    room: int,
) -> tuple[Tensor, Any, bool]:
    """(B, 1, V) logits of every row's last prompt position, the cache to decode from, and
    whether rows can leave it. Each distinct prompt runs once where the model shares prefixes;
    otherwise every row runs, into the model's own cache."""
    if not lm.shares_prefix:
        logits, cache = lm.forward(ids, mask, pos, keep_last=1)
        return logits, cache, False
    by_object: dict[int, int] = {}  # the trainer hands a group one list: no need to hash it
    by_value: dict[tuple[int, ...], int] = {}
    first: list[int] = []
    rows: list[int] = []
    for i, prompt in enumerate(prompts):
        j = by_object.get(id(prompt))
        if j is None:
            j = by_value.setdefault(tuple(prompt), len(first))
            by_object[id(prompt)] = j
            if j == len(first):
                first.append(i)
        rows.append(j)
    first_t = torch.tensor(first, dtype=torch.long, device=ids.device)
    rows_t = torch.tensor(rows, dtype=torch.long, device=ids.device)
    logits, cache = lm.forward(ids[first_t], mask[first_t], pos[first_t], keep_last=1)
    return logits[rows_t], lm.expand_cache(cache, rows_t, room=room), True


class _Record:
    """What `generate` keeps per row and token, preallocated (B, T_max, ...): rows that left
    decoding keep padding, not alive."""

    def __init__(
        self,
        b: int,
        t: int,
        vocab: int,
        top_k: int,
        keep_full: bool,
        pad: int,
        device: torch.device,
    ) -> None:
        k = min(top_k, vocab)
        self.tokens = torch.full((b, t), pad, dtype=torch.long, device=device)
        self.alive = torch.zeros((b, t), dtype=torch.bool, device=device)
        self.token_lp = torch.zeros((b, t), device=device)
        self.top_ids = torch.zeros((b, t, k), dtype=torch.long, device=device)
        self.top_lp = torch.zeros((b, t, k), device=device)
        self.full = torch.zeros((b, t, vocab), device=device) if keep_full else None

    def write(
        self,
        t: int,
        active: Tensor | None,
        a: Tensor,
        alive: Tensor,
        logp: Tensor | None,
        top_k: int,
    ) -> None:
        """Token column `t` of the decoded rows `active` (None: all)."""
        rows: Tensor | slice = slice(None) if active is None else active
        self.tokens[rows, t] = a
        self.alive[rows, t] = alive
        if logp is None:
            return
        self.token_lp[rows, t] = logp.gather(-1, a[:, None])[:, 0]
        ti, tl = topk_view(logp, a, top_k)
        self.top_ids[rows, t] = ti
        self.top_lp[rows, t] = tl
        if self.full is not None:
            self.full[rows, t] = logp

    def batch(self, ids: Tensor, mask: Tensor, steps: int, eos: int, greedy: bool) -> RolloutBatch:
        """The rollout of `steps` decoded columns, cut after the last one any row is alive in
        (a GPU looks at finished rows every `SYNC_EVERY` tokens only)."""
        used = self.alive[:, :steps].any(0).nonzero()
        t = int(used[-1]) + 1 if len(used) else 1
        resp = self.tokens[:, :t]  # (B, T): pad where not alive
        rmask = self.alive[:, :t]  # (B, T)
        if greedy:
            device = ids.device
            view = BehaviorView(
                torch.zeros(0, device=device),
                torch.zeros((0, 1), dtype=torch.long, device=device),
                torch.zeros((0, 1), device=device),
            )
        else:
            view = BehaviorView(
                self.token_lp[:, :t][rmask],
                self.top_ids[:, :t][rmask],
                self.top_lp[:, :t][rmask],
                None if self.full is None else self.full[:, :t][rmask],
            )
        return RolloutBatch.assemble(ids, mask, resp, response_mask=rmask, behavior=view, eos=eos)


def response_logits(
    lm: CausalLM,
    batch: RolloutBatch,
    temperature: float,
    *,
    prefix: Literal["auto", "shared", "full"] = "auto",
) -> Tensor:
    """The trained policy's fp32 logits (N, V) at the response tokens, scaled like sampling.

    `prefix="full"` runs every row whole (the reference, and the path of models that cannot
    share); `"shared"` runs each distinct prompt once for the rows that hold it
    (`core.rollout.prefix`: the same logits and gradients up to fp32 rounding); `"auto"` shares
    whenever the model can, even in a batch of distinct prompts (no slower there), so that every
    minibatch and micro-batch of a step takes the same path and rounds the same way."""
    return _response_outputs(lm, batch, prefix, hidden=False).float() / temperature


def response_projection(
    lm: CausalLM,
    batch: RolloutBatch,
    temperature: float,
    *,
    prefix: Literal["auto", "shared", "full"] = "auto",
) -> ProjectedLogits | None:
    """`response_logits` left as the final hidden states (N, H) and the output projection,
    never multiplied out (the fused loss, `core.objective.fused`); None where the model has no plain
    output projection (`CausalLM.output_projection`): the caller takes the logits then."""
    if lm.output_projection() is None:
        return None
    hidden = _response_outputs(lm, batch, prefix, hidden=True)
    # read after the forward: a sharded model (`core.parallel.sharding`) gathers the layer for it
    projection = lm.output_projection()
    assert projection is not None
    return ProjectedLogits(hidden, projection[0], projection[1], temperature)


def _response_outputs(
    lm: CausalLM, batch: RolloutBatch, prefix: Literal["auto", "shared", "full"], hidden: bool
) -> Tensor:
    """The logits (N, V), or with `hidden` the final hidden states (N, H), at the response
    tokens, in the module's dtype."""
    p, t = batch.prompt_len, batch.response_mask.shape[1]
    if prefix == "shared" or (prefix == "auto" and lm.shares_prefix):
        first, rows = distinct_rows(batch.input_ids[:, :p], batch.attention_mask[:, :p])
        return shared_prefix_logits(
            lm,
            batch.input_ids,
            batch.attention_mask,
            prompt_len=p,
            response_mask=batch.response_mask,
            first=first,
            rows=rows,
            hidden=hidden,
        )
    # column P - 1 + j predicts response token j: the last response token predicts nothing
    width = p + t - 1
    run = lm.forward_hidden if hidden else lm.forward
    out, _ = run(
        batch.input_ids[:, :width],
        batch.attention_mask[:, :width],
        batch.position_ids()[:, :width],
        keep_last=t,
        use_cache=False,
    )  # (B, T, V) or (B, T, H)
    return out[batch.response_mask]
