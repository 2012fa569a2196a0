"""The vLLM engine against the trainer, on CPU: what it returns is the distribution it sampled
from (processed log-probs at the rollout's temperature), in the trainer's layout, and after
`load_weights` it samples from the trainer's new weights.

The model is a Llama built here (`make_chat_hf`: heads of 64 dimensions, which vLLM's CPU
attention kernels need), no download. Measured here: the engine's log-probs of its sampled
tokens and the trainer's own, both fp32, differ by at most 5e-7 (mean 1.4e-7); the bound
asserted is 1e-4."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from core.config import LoraConfig, TrainConfig
from core.models.hf import HFLM
from core.models.local_hf import make_chat_hf
from core.rollout import RolloutBatch, StopRequested, response_logits, sampling_logprobs
from core.rollout.vllm_engine import VLLMEngine

TEMPERATURE = 0.7
TOP_K = 5
PRECISION = 1e-4  # fp32 engine vs fp32 trainer: 5e-7 measured


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_chat_hf(tmp_path_factory.mktemp("vllm") / "chat-llama")


def config(model_dir: Path) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "model": {"name": f"hf:{model_dir}"},
            "rollout": {"engine": "vllm", "vllm_memory": 0.1, "temperature": TEMPERATURE},
            "algorithm": {"top_k": TOP_K},
        }
    )


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Iterator[VLLMEngine]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    cfg = config(model_dir)
    yield VLLMEngine(str(model_dir), cfg, max_model_len=256)


@pytest.fixture
def lm(model_dir: Path) -> HFLM:
    return HFLM(config(model_dir).model)


PROMPTS = [[1, 25, 18, 25, 36], [1, 40, 41, 42], [1, 70, 71]]


def sample(
    engine: VLLMEngine,
    lm: HFLM,
    seed: int = 7,
    prompts: list[list[int]] = PROMPTS,
    **kw: object,
) -> RolloutBatch:
    args: dict[str, object] = {
        "group_size": 4,
        "max_new_tokens": 12,
        "temperature": TEMPERATURE,
        "top_p": 1.0,
        "top_k": TOP_K,
        "seed": seed,
        "eos_id": lm.tokenizer.eos_id,
        "pad_id": lm.tokenizer.pad_id,
        "device": torch.device("cpu"),
    }
    args.update(kw)
    return engine.sample(prompts, **args)  # type: ignore[arg-type]


def trainer_logprobs(lm: HFLM, batch: RolloutBatch) -> torch.Tensor:
    """log pi of every vocabulary entry at each response token (N, V), at the temperature."""
    with torch.no_grad():
        return torch.log_softmax(response_logits(lm, batch, TEMPERATURE), dim=-1)


def gap(lm: HFLM, batch: RolloutBatch) -> float:
    lp = trainer_logprobs(lm, batch)
    mine = lp.gather(-1, batch.tokens[:, None])[:, 0]
    return float((mine - batch.behavior.token_logprobs).abs().max())


def test_the_view_is_the_sampled_distribution_in_the_trainers_layout(
    engine: VLLMEngine, lm: HFLM
) -> None:
    batch = sample(engine, lm)
    b = len(PROMPTS) * 4
    assert batch.input_ids.shape[0] == b and batch.prompt_len == max(map(len, PROMPTS))
    for row in range(b):  # prompts left-padded, group after group
        prompt = PROMPTS[row // 4]
        assert batch.input_ids[row, batch.prompt_len - len(prompt) : batch.prompt_len].tolist() == (
            prompt
        )
    view = batch.behavior
    n = int(batch.response_mask.sum())
    assert len(view) == n and view.k == TOP_K
    tokens = batch.tokens
    assert bool((view.topk_ids == tokens[:, None]).any(-1).all())  # the sampled token is kept
    where = (view.topk_ids == tokens[:, None]).long().argmax(-1)  # (N,) the sampled's column
    assert torch.equal(view.topk_logprobs.gather(-1, where[:, None])[:, 0], view.token_logprobs)
    # the trainer's log-probs at the rollout's temperature: the sampled token and the top-K
    lp = trainer_logprobs(lm, batch)
    assert gap(lm, batch) < PRECISION
    assert float((lp.gather(-1, view.topk_ids) - view.topk_logprobs).abs().max()) < PRECISION
    # the top-K are the trainer's top-K (but where the sampled token took the K-th place)
    top = lp.topk(TOP_K - 1, dim=-1).indices
    assert torch.equal(view.topk_ids[:, : TOP_K - 1], top)
    # completions: the response up to EOS, EOS excluded; no two rows drew the same stream
    eos = lm.tokenizer.eos_id
    for row, completion in enumerate(batch.completions):
        response = batch.responses[row][batch.response_mask[row]].tolist()
        assert completion == (response[:-1] if response[-1] == eos else response)
    assert len({tuple(c) for c in batch.completions}) == b


def test_same_seed_same_rollout_other_seed_other(engine: VLLMEngine, lm: HFLM) -> None:
    first, again, other = sample(engine, lm), sample(engine, lm), sample(engine, lm, seed=8)
    assert first.completions == again.completions
    assert torch.equal(first.behavior.token_logprobs, again.behavior.token_logprobs)
    assert first.completions != other.completions
    # a prompt drawn twice in a step: its two groups draw from streams of their own
    twice = sample(engine, lm, prompts=[PROMPTS[0], PROMPTS[0]])
    assert twice.completions[:4] != twice.completions[4:]
    assert len({tuple(c) for c in twice.completions}) == 8


def test_after_load_weights_the_engine_samples_from_the_new_weights(
    engine: VLLMEngine, lm: HFLM
) -> None:
    torch.manual_seed(0)
    with torch.no_grad():
        for _, p in lm.trainable():
            p.add_(0.05 * torch.randn_like(p))
    stale = sample(engine, lm)
    assert gap(lm, stale) > 0.1  # the engine still holds the weights it loaded from disk
    took = engine.load_weights(lm.trainable())
    assert 0 < took < 10
    synced = sample(engine, lm)
    assert gap(lm, synced) < PRECISION
    engine.load_weights(HFLM(config(Path(lm.source)).model).trainable())  # back, for the others


def test_with_top_p_the_view_is_the_renormalized_nucleus(engine: VLLMEngine, lm: HFLM) -> None:
    """Processed log-probs with top-p are those of the truncated, renormalized distribution
    vLLM sampled from: pdppo's own `sampling_logprobs` (temperature, then the nucleus) of the
    trainer's logits gives them to 1e-4 (1.4e-6 measured on a sharper model)."""
    batch = sample(engine, lm, top_p=0.7)
    with torch.no_grad():
        raw = response_logits(lm, batch, 1.0)
    lp = sampling_logprobs(raw, TEMPERATURE, 0.7)
    view = batch.behavior
    sampled = lp.gather(-1, batch.tokens[:, None])[:, 0]
    assert float((sampled - view.token_logprobs).abs().max()) < PRECISION
    assert float((lp.gather(-1, view.topk_ids) - view.topk_logprobs).abs().max()) < PRECISION
    untruncated = trainer_logprobs(lm, batch).gather(-1, batch.tokens[:, None])[:, 0]
    assert float((untruncated - view.token_logprobs).abs().min()) > 1e-3  # the nucleus shows


def test_lora_adapters_merged_into_the_engine_give_the_trained_policy(
    engine: VLLMEngine, model_dir: Path, lm: HFLM
) -> None:
    """The engine knows nothing of LoRA: it is given every adapted weight with its adapters
    merged in, under the base model's names, and samples what the adapted model would."""
    cfg = config(model_dir).model.model_copy(update={"lora": LoraConfig(r=4, alpha=8)})
    adapted = HFLM(cfg)
    torch.manual_seed(1)
    with torch.no_grad():
        for _, p in adapted.trainable():  # lora_B starts at 0: give the adapters a say
            p.add_(0.2 * torch.randn_like(p))
    weights = adapted.inference_weights()
    assert sorted(n for n, _ in weights) == sorted(n for n, _ in lm.inference_weights())
    engine.load_weights(weights)
    batch = sample(engine, adapted)
    assert gap(adapted, batch) < PRECISION
    assert gap(lm, batch) > 0.1  # the adapters changed the policy the engine samples
    engine.load_weights(lm.inference_weights())  # back, for the others


def test_a_stop_aborts_the_rollout_and_leaves_the_engine_usable(
    engine: VLLMEngine, lm: HFLM
) -> None:
    asked = 0

    def stop_at_third() -> bool:
        nonlocal asked
        asked += 1
        return asked >= 3

    with pytest.raises(StopRequested):
        sample(engine, lm, max_new_tokens=64, should_stop=stop_at_third)
    assert asked == 3
    assert not engine.llm.llm_engine.has_unfinished_requests()
    batch = sample(engine, lm)
    assert gap(lm, batch) < PRECISION


def test_a_batch_over_one_engine_steps_token_budget_samples(engine: VLLMEngine, lm: HFLM) -> None:
    """32 prompts of 200 tokens, two completions each: more prompt tokens than vLLM schedules
    in one engine step (4096 on CPU). vLLM then split a prompt's prefill over two steps, and
    a seeded request's split prefill failed on CPU ("CPU Generator does not use offset": it
    rewinds the request's generator, which only CUDA generators can)."""
    prompts = [[1, *((7 * i + j) % 70 + 20 for j in range(199))] for i in range(32)]
    batch = sample(engine, lm, prompts=prompts, group_size=2, max_new_tokens=4)
    assert batch.input_ids.shape[0] == 64
    assert gap(lm, batch) < PRECISION
