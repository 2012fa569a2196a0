"""The supervised warm-up before RL, run once at the start of a run when the task asks.

Apart from the RL loop (`core.training.run`) because it shares nothing with it but the model:
its own optimizer, its own RNG stream (seed + 3). A stop between two of its steps is checkpointed by
the run (`core.training.run`) as step 0, with this optimizer in the RL optimizer's place and
`state()` (the steps done, the RNG) in the run state, so that a resumed run continues the warm-up
where it stopped, bit for bit, and one whose warm-up had finished never runs it again.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from typing import Any

import torch

from core.config import TrainConfig
from core.models import CausalLM
from core.models.base import encode_example
from core.objective.behavior import BehaviorView
from core.objective.fused import projected_token_logprobs
from core.rollout import RolloutBatch, left_pad, response_logits, response_projection
from core.tasks import Task
from core.training.callbacks import TrainerCallback


class Warmup:
    """The warm-up's progress: its optimizer, its RNG and the number of steps done."""

    def __init__(self, cfg: TrainConfig, lm: CausalLM) -> None:
        self.total = cfg.task.warmup_steps
        self.done = 0
        self.rng = random.Random(cfg.seed + 3)
        self.optimizer = torch.optim.AdamW([p for _, p in lm.trainable()], lr=cfg.task.warmup_lr)

    @property
    def finished(self) -> bool:
        return self.done >= self.total

    def state(self) -> dict[str, Any]:
        return {"done": self.done, "total": self.total, "rng": self.rng.getstate()}

    def restore(self, state: dict[str, Any] | None) -> None:
        """The progress a checkpoint saved; None (a checkpoint from before warm-ups were
        checkpointed, written only once the warm-up was over): finished."""
        if state is None:
            self.done = self.total
            return
        self.done = int(state["done"])
        version, internal, gauss = state["rng"]  # torch.load gives lists; setstate wants tuples
        self.rng.setstate((version, tuple(internal), gauss))

    def run(
        self,
        cfg: TrainConfig,
        lm: CausalLM,
        task: Task,
        cb: TrainerCallback,
        device: torch.device,
        should_stop: Callable[[], bool],
    ) -> bool:
        """The remaining supervised steps: on right-shaped, random-content completions
        (`format`: the task is left for RL to learn), or on the true answers (`answer`: a head
        start that RL improves, the only kind a dataset has). Prompts are encoded as the
        rollout encodes them (chat turns through the model's chat template), and every target
        ends with EOS so the model learns where to stop, unless it is cut at
        `rollout.max_new_tokens` tokens. With `algorithm.fused_loss` the cross-entropy is
        computed without the logits where the model allows it
        (`core.objective.fused.projected_token_logprobs`).

        False when `should_stop` (asked before every step; the ranks of a data-parallel run
        agree on it) said True: `done` steps are done, and the caller checkpoints them."""
        t = cfg.task
        start = self.done
        t0 = time.perf_counter()
        loss = torch.tensor(0.0)
        while self.done < self.total:
            cb.on_phase("warm-up", self.done, self.total)
            if should_stop():
                return False
            exs = [task.sample(self.rng) for _ in range(t.warmup_batch_size)]
            if t.name == "jsonl":
                # a dataset record without a reference has nothing to imitate (graders may
                # score records without one, so the task itself does not require it)
                missing = next((e for e in exs if "answer" not in e.record), None)
                if missing is not None:
                    raise ValueError(
                        "task.warmup_target='answer' trains on the records' 'answer', but a "
                        f"record has none: {json.dumps(dict(missing.record))[:200]}"
                    )
            prompts = [encode_example(lm.tokenizer, e) for e in exs]
            texts = [
                e.answer if t.warmup_target == "answer" else task.warmup_completion(e, self.rng)
                for e in exs
            ]
            loss = _step(cfg, lm, prompts, texts=texts, opt=self.optimizer, device=device)
            self.done += 1
        cb.on_phase("warm-up", self.total, self.total)
        # its moments (twice the trainable weights) are not needed again: RL has its own
        self.optimizer.state.clear()
        resumed = f" ({start} of them before the resume)" if start else ""
        cb.on_log(
            f"{t.warmup_target} warm-up: {self.total} steps{resumed}, "
            f"final loss {float(loss.detach()):.3f}, "
            f"{time.perf_counter() - t0:.1f}s"
        )
        return True


def _step(
    cfg: TrainConfig,
    lm: CausalLM,
    prompts: list[list[int]],
    texts: list[str],
    opt: torch.optim.Optimizer,
    device: torch.device,
) -> torch.Tensor:
    """One supervised step on the prompts' target texts; returns its loss."""
    tok = lm.tokenizer
    # cut to a rollout's length: a dataset's answer may be as long as its line, which would
    # make sequences longer than any the job is sized for, to teach text no rollout produces
    comps = [[*tok.encode(text), tok.eos_id][: cfg.rollout.max_new_tokens] for text in texts]
    batch = _pack(prompts, comps, tok.pad_id, device)
    # (not sharded: FSDP does not gather the output layer outside its forward)
    fused = cfg.algorithm.fused_loss and cfg.sharding != "fsdp"
    proj = response_projection(lm, batch, 1.0) if fused else None
    if proj is not None:  # cross-entropy without the logits (core.objective.fused)
        loss = projected_token_logprobs(proj, batch.tokens).mean().neg()
    else:
        logits = response_logits(lm, batch, 1.0)
        loss = torch.nn.functional.cross_entropy(logits, batch.tokens)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


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
