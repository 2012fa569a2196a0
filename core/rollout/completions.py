"""A few completions of one prompt, for trying a trained model (`workers.sampling`): the same
`generate` the trainer samples its rollouts with, so a completion is what the policy would have
sampled at that temperature and top-p, plus what a caller asks of a completion API (`n`, `seed`,
`stop` strings, the reason each one ended)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from core.models.base import CausalLM
from core.rollout import generate


class PromptTooLong(ValueError):
    """The prompt leaves the model no room for a single new token."""


@dataclass(frozen=True)
class Choice:
    text: str
    tokens: int  # generated, EOS excluded, up to the stop string when one cut it
    finish_reason: str  # "stop" (EOS or a stop string) or "length" (max_tokens ran out)


@dataclass(frozen=True)
class Completions:
    choices: list[Choice]
    prompt_tokens: int
    max_tokens: int  # what the model's length allowed of the tokens asked for
    generate_ms: float


def _cut(text: str, stop: list[str]) -> str | None:
    """`text` up to the first stop string, or None when none occurs."""
    cuts = [text.find(s) for s in stop if s and s in text]
    return text[: min(cuts)] if cuts else None


@torch.no_grad()
def complete(
    lm: CausalLM,
    prompt_ids: list[int],
    *,
    max_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    n: int = 1,
    seed: int | None = None,
    stop: list[str] | None = None,
) -> Completions:
    """`n` completions of `prompt_ids`. Temperature 0 is greedy (every choice the same). A model
    of bounded length (`max_seq_len`) generates at most what fits after the prompt; the
    choice says `length` when that bound, or `max_tokens`, cut it. `seed` makes the draws
    repeatable (same seed, same prompt and settings: the same texts)."""
    room = max_tokens
    if lm.max_seq_len is not None:
        room = min(room, lm.max_seq_len - len(prompt_ids))
    if room < 1 or not prompt_ids:
        raise PromptTooLong(
            f"the prompt is {len(prompt_ids)} tokens and the model's context is "
            f"{lm.max_seq_len} tokens: no room for a completion"
        )
    generator = None
    if seed is not None:
        generator = torch.Generator(device=lm.device).manual_seed(seed)
    started = time.perf_counter()
    batch = generate(
        lm,
        [prompt_ids] * n,
        max_new_tokens=room,
        temperature=temperature if temperature > 0 else 1.0,
        top_p=top_p,
        generator=generator,
        greedy=temperature == 0,
    )
    took = (time.perf_counter() - started) * 1000
    tok = lm.tokenizer
    eos = tok.eos_id
    choices = []
    for row, ids in zip(batch.responses.tolist(), batch.completions, strict=True):
        ended = eos in row[: len(ids) + 1]
        text = tok.decode(ids)
        cut = _cut(text, stop or [])
        if cut is not None:
            choices.append(Choice(cut, len(tok.encode(cut)), "stop"))
        else:
            choices.append(Choice(text, len(ids), "stop" if ended else "length"))
    return Completions(choices, len(prompt_ids), room, took)
