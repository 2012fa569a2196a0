"""Multi-turn episodes with an environment, sampled by the HF engine: token in, token out.

Each row of the batch is one episode (`core.environments`): the prompt, then the model's turns,
each sampled by `core.rollout.generate` with its behavior log-probs and top-K view, and between
them the environment's tokens (tool results, user turns) inserted exactly as given. The batch
the trainer gets is a `RolloutBatch` in the usual layout (prompts left-padded to P, the rest of
the episode right-padded to T) where
- `attention_mask` marks every real token, sampled or inserted: the policy reads them all;
- `response_mask` marks the sampled tokens only: it is the loss mask (the inserted tokens
  predict nothing and are predicted by nothing the loss sees), and the behavior view has one
  row per sampled token, in row-major order, as for one turn.
The trained ids are the sampled ids and the inserted ids, never a re-encoding of decoded text:
a turn is decoded only to be read by the environment (a tokenizer need not give back the ids it
decoded, tests/core/test_episodes.py shows one that does not).

Turns are sampled together for every episode still running (a batch per turn); each turn
re-reads its episode from the start (no cache kept across turns: simple, and the environment's
tokens are new to the cache anyway). Every call into the environment runs in a thread of its
own with a deadline (`EpisodeLimits.step_timeout`): one that raises or outlives it ends its
episode with reward 0 (`env_errors`, `env_timeouts`); the thread of one that hangs is left
behind (a daemon: it ends with the process). Isolation in a process of its own is issue 54,
item 4.

Imports: `core.environments`, `core.models` (the tokenizer, the prompt), `core.objective` (the
behavior view), `core.tasks` (the task row).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, Literal

import torch
from torch import Tensor

from core.environments.base import Done, Environment, Episode, EpisodeLimits, Observation, Turn
from core.models.base import CausalLM, encode_example
from core.objective.behavior import BehaviorView
from core.rollout import RolloutBatch, SamplingOptions, StopRequested, generate, left_pad
from core.tasks.base import Example, Message

Outcome = Literal["done", "error", "timeout", "turn_limit", "token_limit", "running"]
CallStatus = Literal["ok", "error", "timeout"]

CHAT_BASE: tuple[Message, ...] = (
    {"role": "user", "content": "."},
    {"role": "assistant", "content": "."},
)
"""The conversation an observation's messages are rendered after (`ChatDelta`): they follow an
assistant's turn, as in an episode."""


class ChatDelta:
    """Renders an observation's messages with the model's chat template as they continue a
    conversation after the assistant's turn, up to the assistant's next header: the template
    rendered with and without them, the difference tokenized alone. The sampled ids before it
    are never re-rendered."""

    def __init__(self, tokenizer: Any) -> None:
        hf = getattr(tokenizer, "tok", None)
        if hf is None or not getattr(hf, "chat_template", None):
            raise ValueError(
                "an environment task needs a model with a chat template (hf: models whose "
                "tokenizer defines one): observations are rendered with it"
            )
        self.tokenizer = tokenizer
        self.hf = hf
        self.prefix = str(hf.apply_chat_template([dict(m) for m in CHAT_BASE], tokenize=False))

    def ids(self, messages: Sequence[Message]) -> list[int]:
        full = str(
            self.hf.apply_chat_template(
                [*(dict(m) for m in CHAT_BASE), *(dict(m) for m in messages)],
                tokenize=False,
                add_generation_prompt=True,
            )
        )
        if not full.startswith(self.prefix):
            raise ValueError("the chat template renders the conversation's start differently")
        ids: list[int] = self.tokenizer.encode(full[len(self.prefix) :])
        return ids


@dataclass
class EpisodeRecord:
    """One episode as played: its token segments after the prompt (`(ids, sampled)`: the
    model's turns and the environment's insertions, in order), reward, turns and how it ended."""

    example: Example
    prompt: list[int]
    segments: list[tuple[list[int], bool]] = field(default_factory=list)
    reward: float = 0.0
    room: int = 0  # tokens it may hold after the prompt: `EpisodeLimits.max_tokens`, or fewer
    turns: int = 0
    outcome: Outcome = "running"
    info: dict[str, Any] = field(default_factory=dict)
    behavior: list[BehaviorView] = field(default_factory=list)  # one per sampled segment
    episode: Episode | None = None

    @property
    def used(self) -> int:
        return sum(len(ids) for ids, _ in self.segments)

    @property
    def ids(self) -> list[int]:
        """The ids after the prompt: what the trainer trains on, sampled and inserted."""
        return [i for ids, _ in self.segments for i in ids]

    @property
    def loss_mask(self) -> list[int]:
        """1 on each sampled token of `ids`, 0 on each inserted one."""
        return [int(sampled) for ids, sampled in self.segments for _ in ids]

    @property
    def sampled_turns(self) -> list[list[int]]:
        return [ids for ids, sampled in self.segments if sampled]

    def end(self, outcome: Outcome, reward: float = 0.0) -> None:
        self.outcome, self.reward = outcome, reward


@dataclass
class EpisodeBatch:
    """A step's episodes: the batch to train on, their rewards and the step's metrics."""

    batch: RolloutBatch
    rewards: list[float]
    metrics: dict[str, float]
    episodes: list[EpisodeRecord]


def run_episodes(
    lm: CausalLM,
    environment: Environment,
    examples: Sequence[Example],
    *,
    limits: EpisodeLimits,
    sampling: SamplingOptions,
    generator: torch.Generator | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> EpisodeBatch:
    """One episode per example (a GRPO group: the same example `group_size` times in a row),
    played to the end or a limit; never raises for what the environment does."""
    tok = lm.tokenizer
    delta = ChatDelta(tok)
    by_id: dict[int, list[int]] = {}
    records = [EpisodeRecord(e, by_id.setdefault(id(e), encode_example(tok, e))) for e in examples]
    for r in records:  # the episode's tokens after its prompt: its limit, and the model's
        room = limits.max_tokens
        if lm.max_seq_len is not None:
            room = min(room, lm.max_seq_len - len(r.prompt))
        r.room = max(room, 0)
    started = _call_all([partial(environment.start, r.example) for r in records], limits)
    for rec, (status, value) in zip(records, started, strict=True):
        if status == "ok":
            rec.episode = value
        else:
            _failed(rec, status, value)
    for turn in range(limits.max_turns):
        if should_stop is not None and should_stop():
            raise StopRequested("stopped between turns")
        for r in records:
            if r.outcome == "running" and r.used >= r.room:  # a prompt as long as the model's
                r.end("token_limit")
        running = [r for r in records if r.outcome == "running"]
        if not running:
            break
        budgets = [r.room - r.used for r in running]
        _take_turn(lm, running, sampling, budgets, generator=generator, should_stop=should_stop)
        for r in running:
            r.turns += 1
        answers = _call_all([_stepper(r, turn, tok) for r in running], limits)
        for rec, (status, value) in zip(running, answers, strict=True):
            last = turn + 1 == limits.max_turns
            _answer(rec, status, value, delta=delta, eos=tok.eos_id, last=last)
    for r in records:
        if r.outcome == "running":  # no turn left: the last answer was an observation
            r.end("turn_limit")
    return EpisodeBatch(
        _assemble(records, tok.pad_id, tok.eos_id, lm.device),
        [r.reward for r in records],
        episode_metrics(records),
        records,
    )


def _take_turn(
    lm: CausalLM,
    running: list[EpisodeRecord],
    sampling: SamplingOptions,
    budgets: list[int],
    *,
    generator: torch.Generator | None,
    should_stop: Callable[[], bool] | None,
) -> None:
    """Samples every running episode's next turn in one batch, each cut to its own budget (a
    prefix of a sample is a sample: its tokens and their view stay exact)."""
    n = min(sampling.max_new_tokens, max(budgets))
    contexts = [r.prompt + r.ids for r in running]
    batch = generate(
        lm,
        contexts,
        **{**asdict(sampling), "max_new_tokens": max(n, 1)},
        generator=generator,
        should_stop=should_stop,
    )
    counts = batch.response_mask.sum(1).tolist()
    start = 0
    for r, count, budget, row, alive in zip(
        running,
        counts,
        budgets,
        batch.responses.tolist(),
        batch.response_mask.tolist(),
        strict=True,
    ):
        ids = [t for t, keep in zip(row, alive, strict=True) if keep][:budget]
        rows = torch.arange(start, start + len(ids), device=batch.behavior.token_logprobs.device)
        r.behavior.append(_rows(batch.behavior, rows))
        r.segments.append((ids, True))
        start += count


def _rows(view: BehaviorView, rows: Tensor) -> BehaviorView:
    full = view.full_logprobs
    return BehaviorView(
        view.token_logprobs[rows],
        view.topk_ids[rows],
        view.topk_logprobs[rows],
        None if full is None else full[rows],
    )


def _stepper(rec: EpisodeRecord, index: int, tok: Any) -> Callable[[], Observation | Done]:
    """The environment's call on the episode's latest turn: its ids as sampled, and their text
    (EOS excluded) for the environment to read."""
    ids = rec.segments[-1][0]
    complete = bool(ids) and ids[-1] == tok.eos_id
    turn = Turn(tuple(ids), tok.decode(ids[:-1] if complete else ids), complete, index)
    episode = rec.episode
    assert episode is not None
    return lambda: episode.step(turn)


def _failed(rec: EpisodeRecord, status: CallStatus, value: Any) -> None:
    """The end of an episode whose environment raised (`value`) or ran out of time."""
    if status == "error":
        rec.end("error")
        rec.info["error"] = repr(value)[:300]
    else:
        rec.end("timeout")


def _answer(
    rec: EpisodeRecord,
    status: CallStatus,
    value: Any,
    *,
    delta: ChatDelta,
    eos: int,
    last: bool,
) -> None:
    """Applies the environment's answer to `rec`: the end, or the observation inserted."""
    if status != "ok":
        _failed(rec, status, value)
        return
    if isinstance(value, Done):
        reward = float(value.reward)
        if not 0.0 <= reward <= 1.0:  # NaN included
            rec.end("error")
            rec.info["error"] = f"reward {reward!r} outside [0, 1]"
            return
        rec.end("done", reward)
        rec.info.update(value.info)
        return
    if not isinstance(value, Observation):
        rec.end("error")
        rec.info["error"] = f"step returned {type(value).__name__}, not Observation or Done"
        return
    if last:
        rec.end("turn_limit")
        return
    try:
        ids = list(value.ids) if value.ids is not None else delta.ids(value.messages or ())
    except (ValueError, TypeError) as e:  # a template that refuses the messages
        rec.end("error")
        rec.info["error"] = repr(e)[:300]
        return
    turn = rec.segments[-1][0]
    if not turn or turn[-1] != eos:
        ids = [eos, *ids]  # a turn cut short is closed, by an inserted (masked) EOS
    if rec.used + len(ids) >= rec.room:  # no room for another sampled token
        rec.end("token_limit")
        return
    rec.segments.append((ids, False))


def _call_all(
    calls: Sequence[Callable[[], Any]], limits: EpisodeLimits
) -> list[tuple[CallStatus, Any]]:
    """Runs `calls` at once, each in a daemon thread, all within `limits.step_timeout`:
    ("ok", result), ("error", the exception) or ("timeout", None) for each."""
    results: list[tuple[CallStatus, Any]] = [("timeout", None)] * len(calls)

    def run(i: int, call: Callable[[], Any]) -> None:
        try:
            results[i] = ("ok", call())
        except Exception as e:  # the environment's failure is its episode's, not the job's
            results[i] = ("error", e)

    threads = [
        threading.Thread(target=run, args=(i, c), daemon=True, name=f"env-step-{i}")
        for i, c in enumerate(calls)
    ]
    deadline = time.monotonic() + limits.step_timeout
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    # a thread still running is a timeout; whatever it writes later is not read
    return [("timeout", None) if t.is_alive() else results[i] for i, t in enumerate(threads)]


def _assemble(
    records: list[EpisodeRecord], pad: int, eos: int, device: torch.device
) -> RolloutBatch:
    """The batch of every episode: prompts left-padded, the rest right-padded; the loss mask
    (`response_mask`) on the sampled tokens alone, the behavior rows theirs, row after row."""
    prompt_ids, prompt_mask = left_pad([r.prompt for r in records], pad, device)
    width = max(1, max(r.used for r in records))
    resp = torch.full((len(records), width), pad, dtype=torch.long)
    real = torch.zeros((len(records), width), dtype=torch.bool)
    sampled = torch.zeros((len(records), width), dtype=torch.bool)
    views: list[BehaviorView] = []
    completions = []
    for i, r in enumerate(records):
        ids, mask = r.ids, r.loss_mask
        resp[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        real[i, : len(ids)] = True
        sampled[i, : len(ids)] = torch.tensor(mask, dtype=torch.bool)
        views.extend(r.behavior)
        completions.append(ids[:-1] if ids and ids[-1] == eos else ids)
    behavior = _concat(views, device)
    return RolloutBatch(
        input_ids=torch.cat([prompt_ids, resp.to(device)], dim=1),
        attention_mask=torch.cat([prompt_mask, real.to(device)], dim=1),
        prompt_len=prompt_ids.shape[1],
        response_mask=sampled.to(device),
        behavior=behavior,
        completions=completions,
    )


def _concat(views: list[BehaviorView], device: torch.device) -> BehaviorView:
    if not views:
        return BehaviorView(
            torch.zeros(0, device=device),
            torch.zeros((0, 1), dtype=torch.long, device=device),
            torch.zeros((0, 1), device=device),
        )
    fulls = [v.full_logprobs for v in views]
    return BehaviorView(
        torch.cat([v.token_logprobs for v in views]),
        torch.cat([v.topk_ids for v in views]),
        torch.cat([v.topk_logprobs for v in views]),
        None if any(f is None for f in fulls) else torch.cat([f for f in fulls if f is not None]),
    )


OUTCOME_METRICS = {
    "error": "env_errors",
    "timeout": "env_timeouts",
    "turn_limit": "env_turn_limits",
    "token_limit": "env_token_limits",
}
"""The metric that counts each way an episode ends without the environment's reward: a fraction
of the step's episodes (like `grader_errors`)."""


def episode_metrics(records: Sequence[EpisodeRecord]) -> dict[str, float]:
    """The step's episode metrics: how many ended on each limit or failure (fractions of its
    episodes), turns per episode, inserted tokens per episode."""
    n = max(len(records), 1)
    out = {
        name: sum(r.outcome == outcome for r in records) / n
        for outcome, name in OUTCOME_METRICS.items()
    }
    out["episode_turns_mean"] = sum(r.turns for r in records) / n
    out["episode_env_tokens_mean"] = sum(r.used - sum(r.loss_mask) for r in records) / n
    return out


def format_episode(record: EpisodeRecord, tokenizer: Any) -> str:
    """One episode's ids after the prompt, a line per token: position, loss mask (1: sampled,
    trained on; 0: inserted by the environment), id and the token's text."""
    hf = getattr(tokenizer, "tok", None)
    lines = [f"reward {record.reward:g}, {record.turns} turns, ended: {record.outcome}"]
    lines.append(" pos mask    id  token")
    for pos, (i, m) in enumerate(zip(record.ids, record.loss_mask, strict=True)):
        text = hf.convert_ids_to_tokens(i) if hf is not None else tokenizer.decode([i])
        lines.append(f"{pos:4d} {m:4d} {i:5d}  {text!r}")
    return "\n".join(lines)
