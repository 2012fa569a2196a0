"""The supervised warm-up before RL, run once at the start of a fresh run when the task asks.

Apart from the RL loop (`core.trainer`) because it shares nothing with it but the model: its own
optimizer, its own RNG stream (seed + 3), no checkpoint of its own.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable

import torch

from core.behavior import BehaviorView
from core.callbacks import TrainerCallback
from core.config import TrainConfig
from core.fused import projected_token_logprobs
from core.models import CausalLM
from core.models.base import encode_example
from core.rollout import RolloutBatch, left_pad, response_logits, response_projection
from core.tasks import Task


def supervised_warmup(
    cfg: TrainConfig,
    lm: CausalLM,
    task: Task,
    cb: TrainerCallback,
    device: torch.device,
    should_stop: Callable[[], bool] | None = None,
) -> bool:
    """Supervised steps before RL: on right-shaped, random-content completions (`format`:
    the task is left for RL to learn), or on the true answers (`answer`: a head start that
    RL improves, the only kind a dataset has). Prompts are encoded as the rollout encodes
    them (chat turns through the model's chat template), and every target ends with EOS so
    the model learns where to stop, unless it is cut at `rollout.max_new_tokens` tokens.
    With `algorithm.fused_loss` the cross-entropy is computed without the logits where the
    model allows it (`core.fused.projected_token_logprobs`).

    False when the callback asked to stop midway: nothing is checkpointed then, so a
    resumed run finds no checkpoint and starts over, warm-up included. `should_stop`: asked in
    place of the callback's (the ranks of a data-parallel run agree on it)."""
    t = cfg.task
    if not t.warmup_steps:
        return True
    rng = random.Random(cfg.seed + 3)
    opt = torch.optim.AdamW([p for _, p in lm.trainable()], lr=t.warmup_lr)
    tok = lm.tokenizer
    t0 = time.perf_counter()
    loss = torch.tensor(0.0)
    for done in range(t.warmup_steps):
        cb.on_phase("warm-up", done, t.warmup_steps)
        if (should_stop or cb.should_stop)():
            cb.on_log("stopped during the warm-up")
            return False
        exs = [task.sample(rng) for _ in range(t.warmup_batch_size)]
        if t.name == "jsonl":
            # a dataset record without a reference has nothing to imitate (graders may
            # score records without one, so the task itself does not require it)
            missing = next((e for e in exs if "answer" not in e.record), None)
            if missing is not None:
                raise ValueError(
                    "task.warmup_target='answer' trains on the records' 'answer', but a "
                    f"record has none: {json.dumps(dict(missing.record))[:200]}"
                )
        prompts = [encode_example(tok, e) for e in exs]
        texts = [
            e.answer if t.warmup_target == "answer" else task.warmup_completion(e, rng) for e in exs
        ]
        # cut to a rollout's length: a dataset's answer may be as long as its line, which would
        # make sequences longer than any the job is sized for, to teach text no rollout produces
        comps = [[*tok.encode(text), tok.eos_id][: cfg.rollout.max_new_tokens] for text in texts]
        batch = _pack(prompts, comps, tok.pad_id, device)
        # (not sharded: FSDP does not gather the output layer outside its forward)
        fused = cfg.algorithm.fused_loss and cfg.sharding != "fsdp"
        proj = response_projection(lm, batch, 1.0) if fused else None
        if proj is not None:  # cross-entropy without the logits (core.fused)
            loss = projected_token_logprobs(proj, batch.tokens).mean().neg()
        else:
            logits = response_logits(lm, batch, 1.0)
            loss = torch.nn.functional.cross_entropy(logits, batch.tokens)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    cb.on_phase("warm-up", t.warmup_steps, t.warmup_steps)
    cb.on_log(
        f"{t.warmup_target} warm-up: {t.warmup_steps} steps, "
        f"final loss {float(loss.detach()):.3f}, "
        f"{time.perf_counter() - t0:.1f}s"
    )
    return True


def _pack(
    prompts: list[list[int]], completions: list[list[int]], pad: int, device: torch.device
) -> RolloutBatch:
    """Prompt + given completion in the rollout layout (for the supervised warm-up)."""
    ids, mask = left_pad(prompts, pad, device)
    t = max(len(c) for c in completions)
    resp = torch.full((len(prompts), t), pad, dtype=torch.long)
    rmask = torch.zeros((len(prompts), t), dtype=torch.bool)
    for i, c in enumerate(completions):
        resp[i, : len(c)] = torch.tensor(c)
        rmask[i, : len(c)] = True
    n = int(rmask.sum())
    empty = BehaviorView(torch.zeros(n), torch.zeros(n, 1, dtype=torch.long), torch.zeros(n, 1))
    return RolloutBatch(
        input_ids=torch.cat([ids, resp.to(device)], 1),
        attention_mask=torch.cat([mask, rmask.to(device)], 1),
        prompt_len=ids.shape[1],
        response_mask=rmask.to(device),
        behavior=empty,
        completions=completions,
    )
