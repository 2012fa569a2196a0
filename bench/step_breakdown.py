"""Where one training step's time goes, phase by phase, for the code as it was and as it is.

A step of `rollout.prompts_per_step` prompts x `group_size` completions, one minibatch, on one
CPU thread, split into the phases the trainer runs: tokenizing the prompts, prefilling them,
decoding the completions, the training forward (`response_logits`), its backward and the AdamW
step. Two models, both built on this machine (no download): `builtin:tiny` in its default shape
and a Llama made by `core.models.local_hf.make_chat_hf` (hidden 128, 2 layers); two tasks: short
prompts (about twice the completion) and long ones (at least 4x the completion, the usual RL
shape: a question and a short answer). Prompts differ in length, so left padding is exercised.

`before` is the step as of commit 1acceb8, frozen in this file: every row's prompt tokenized,
`generate_before` (every row prefilled, the KV cache concatenated per token, `torch.multinomial`),
the full-sequence training forward (a KV cache built, T + 1 logit columns), AdamW's single-tensor
loop. `after` is the library as it is: `core.rollout.generate`, `core.rollout.response_logits`,
`core.training.trainer.build_optimizer`, each distinct prompt tokenized once. Both run in one
process, interleaved repeat by repeat, so that they see the same machine; medians over the repeats.

Prefill is timed as `generate(max_new_tokens=1)` (a prefill and one sampled token), decode as the
rest of a full `generate` (all its other tokens). Times are CPU time of the main thread (one
torch thread: all the work runs there), so that other processes on a shared machine do not
count; `--clock wall` reads the wall clock instead. The backward is that of a surrogate
policy-gradient loss (`-sum(A * log pi(a)) / N`), so that the figure is the model's backward and
not the cost of whichever trust-region mask a run configures.

    python bench/step_breakdown.py                  # all four settings, 8 x 8, 8 new tokens
    python bench/step_breakdown.py --repeats 5 --models tiny --tasks long
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

from core.config import ModelConfig, OptimConfig
from core.models import CausalLM, load_model
from core.models.base import Tokenizer
from core.objective.behavior import BehaviorView
from core.rollout import (
    RolloutBatch,
    generate,
    left_pad,
    position_ids,
    response_logits,
    sampling_logprobs,
    topk_view,
)

T = TypeVar("T")

PHASES = ("tokenize", "prefill", "decode", "train_fwd", "backward", "optimizer")

SHORT_QUESTIONS = ["12+34=", "7*8=", "sort 4312=", "100-9=", "reverse 56=", "9+9=", "3*41=", "x="]
LONG_CONTEXT = "Add the numbers up and answer with digits only. "


def task_prompts(task: str, n: int) -> list[str]:
    """`n` distinct prompts: short ones (13 to 20 characters, about twice an 8-token answer) or
    long ones (61 to 68: 8x)."""
    k = len(SHORT_QUESTIONS)
    qs = [f"{SHORT_QUESTIONS[i % k]}{'?' * (i // k)}" for i in range(n)]
    if task == "short":
        return [f"Question: {q}" for q in qs]
    return [f"{LONG_CONTEXT}Question: {q}" for q in qs]


# -- the step as of commit 1acceb8 -----------------------------------------------------------


@torch.no_grad()
def generate_before(
    lm: CausalLM,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    top_k: int,
    generator: torch.Generator,
) -> RolloutBatch:
    """`core.rollout.generate` as it was (temperature 1, top-p 1, no full log-probs)."""
    device = lm.device
    tok = lm.tokenizer
    ids, mask = left_pad(prompts, tok.pad_id, device)
    b, p = ids.shape
    pos = position_ids(mask)
    finished = torch.zeros(b, dtype=torch.bool, device=device)
    out_tokens, out_alive, tok_lp, top_ids, top_lp = [], [], [], [], []
    logits, cache = lm.forward(ids, mask, pos, keep_last=1)
    next_pos = pos[:, -1] + 1
    for _ in range(max_new_tokens):
        logp = sampling_logprobs(logits[:, -1], 1.0, 1.0)
        a = torch.multinomial(logp.exp(), 1, generator=generator)[:, 0]
        a = torch.where(finished, torch.full_like(a, tok.pad_id), a)
        alive = ~finished
        out_tokens.append(a)
        out_alive.append(alive)
        tok_lp.append(logp.gather(-1, a[:, None])[:, 0])
        ti, tl = topk_view(logp, a, top_k)
        top_ids.append(ti)
        top_lp.append(tl)
        finished = finished | (a == tok.eos_id)
        mask = torch.cat([mask, alive[:, None]], dim=1)
        if bool(finished.all()):
            break
        logits, cache = lm.forward(a[:, None], mask, next_pos[:, None], cache, keep_last=1)
        next_pos = next_pos + 1
    resp = torch.stack(out_tokens, 1)
    rmask = torch.stack(out_alive, 1)
    view = BehaviorView(
        torch.stack(tok_lp, 1)[rmask], torch.stack(top_ids, 1)[rmask], torch.stack(top_lp, 1)[rmask]
    )
    completions = [
        [t for t, k in zip(r, m, strict=True) if k]
        for r, m in zip(resp.tolist(), rmask.tolist(), strict=True)
    ]
    return RolloutBatch(
        input_ids=torch.cat([ids, resp], 1),
        attention_mask=mask,
        prompt_len=p,
        response_mask=rmask,
        behavior=view,
        completions=completions,
    )


def response_logits_before(lm: CausalLM, batch: RolloutBatch, temperature: float) -> torch.Tensor:
    """`core.rollout.response_logits` as it was: every position of every row, T + 1 columns."""
    t = batch.response_mask.shape[1]
    logits, _ = lm.forward(
        batch.input_ids, batch.attention_mask, batch.position_ids(), keep_last=t + 1
    )
    return logits[:, :t][batch.response_mask].float() / temperature


def tokenize_before(tok: Tokenizer, texts: list[str], group: int) -> list[list[int]]:
    return [tok.encode_prompt(t) for t in texts for _ in range(group)]


def tokenize_after(tok: Tokenizer, texts: list[str], group: int) -> list[list[int]]:
    return [ids for ids in (tok.encode_prompt(t) for t in texts) for _ in range(group)]


# -- timing ----------------------------------------------------------------------------------


CLOCK: dict[str, Callable[[], float]] = {"cpu": time.thread_time, "wall": time.perf_counter}
clock = CLOCK["cpu"]


def _timed(fn: Callable[[], T]) -> tuple[float, T]:
    """Milliseconds `fn` took on `clock`, and what it returned."""
    start = clock()
    out = fn()
    return (clock() - start) * 1000.0, out


def one_step(
    lm: CausalLM,
    optimizer: torch.optim.Optimizer,
    texts: list[str],
    *,
    group: int,
    new_tokens: int,
    after: bool,
    seed: int,
) -> dict[str, float]:
    """Milliseconds per phase of one step; `after` picks the library, else the frozen copies."""
    tok = lm.tokenizer
    gen = torch.Generator().manual_seed(seed)
    ms: dict[str, float] = {}
    encode = tokenize_after if after else tokenize_before
    ms["tokenize"], prompts = _timed(lambda: encode(tok, texts, group))

    def sample(n: int) -> RolloutBatch:
        if after:
            return generate(lm, prompts, max_new_tokens=n, top_k=20, generator=gen)
        return generate_before(lm, prompts, max_new_tokens=n, top_k=20, generator=gen)

    ms["prefill"], _ = _timed(lambda: sample(1))
    full_ms, batch = _timed(lambda: sample(new_tokens))
    ms["decode"] = full_ms - ms["prefill"]
    forward = response_logits if after else response_logits_before
    ms["train_fwd"], logits = _timed(lambda: forward(lm, batch, 1.0))
    adv = torch.linspace(-1.0, 1.0, batch.input_ids.shape[0])[:, None]
    adv_tok = adv.expand_as(batch.response_mask)[batch.response_mask]
    logp = torch.log_softmax(logits, -1).gather(-1, batch.tokens[:, None])[:, 0]
    loss = -(adv_tok * logp).sum() / max(len(logp), 1)
    optimizer.zero_grad(set_to_none=True)
    ms["backward"], _ = _timed(loss.backward)
    ms["optimizer"], _ = _timed(optimizer.step)
    ms["total"] = sum(ms[p] for p in PHASES)
    ms["rows"] = float(batch.input_ids.shape[0])
    ms["prompt_len"] = float(batch.prompt_len)
    return ms


def build_model(kind: str, workdir: Path) -> CausalLM:
    torch.manual_seed(0)
    if kind == "tiny":
        return load_model(ModelConfig(), torch.device("cpu"))
    from core.models.local_hf import make_chat_hf

    path = make_chat_hf(workdir / "chat-llama")
    return load_model(ModelConfig(name=f"hf:{path}"), torch.device("cpu"))


def make_optimizer(lm: CausalLM, after: bool) -> torch.optim.Optimizer:
    params = [p for _, p in lm.trainable()]
    if after:
        from core.training.trainer import build_optimizer

        return build_optimizer(params, OptimConfig(lr=1e-6), lm.device)
    return torch.optim.AdamW(params, lr=1e-6)


def run_setting(
    kind: str, task: str, args: argparse.Namespace, workdir: Path
) -> dict[str, dict[str, float]]:
    """Median ms per phase for `before` and `after` on one model and task."""
    lm = build_model(kind, workdir)
    texts = task_prompts(task, args.prompts)
    opts = {"before": make_optimizer(lm, False), "after": make_optimizer(lm, True)}
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for rep in range(args.warmup + args.repeats):
        for name in ("before", "after") if rep % 2 == 0 else ("after", "before"):
            ms = one_step(
                lm,
                opts[name],
                texts,
                group=args.group,
                new_tokens=args.new_tokens,
                after=name == "after",
                seed=rep,
            )
            if rep >= args.warmup:
                runs[name].append(ms)
    return {
        name: {key: statistics.median(r[key] for r in rs) for key in rs[0]}
        for name, rs in runs.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "hf"], choices=["tiny", "hf"])
    parser.add_argument("--tasks", nargs="+", default=["short", "long"], choices=["short", "long"])
    parser.add_argument("--prompts", type=int, default=8, help="distinct prompts per step")
    parser.add_argument("--group", type=int, default=8, help="completions per prompt")
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=sorted(CLOCK), default="cpu")
    args = parser.parse_args()
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu reads the main thread's time: it needs --threads 1")
    global clock
    clock = CLOCK[args.clock]
    torch.set_num_threads(args.threads)
    header = f"{'model':6} {'task':6} {'path':7} " + " ".join(f"{p:>9}" for p in PHASES)
    print(
        f"ms per step (median of {args.repeats}), {args.prompts} prompts x {args.group}, "
        f"{args.new_tokens} new tokens, fp32, {args.threads} thread(s), {args.clock} time; "
        "decode = all tokens after the first"
    )
    print(header + f" {'total':>9}  prompt")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.models:
            for task in args.tasks:
                res = run_setting(kind, task, args, Path(tmp))
                for name in ("before", "after"):
                    r = res[name]
                    cells = " ".join(f"{r[p]:9.2f}" for p in PHASES)
                    print(
                        f"{kind:6} {task:6} {name:7} {cells} {r['total']:9.2f}  "
                        f"{int(r['prompt_len'])}"
                    )
                ratio = res["after"]["total"] / res["before"]["total"]
                print(f"{kind:6} {task:6} after/before total: {ratio:.2f}")


if __name__ == "__main__":
    main()
