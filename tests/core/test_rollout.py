"""The rollout engine: what it records about the behavior policy is what it sampled from."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from core.config import AlgorithmConfig, ModelConfig, TinyModelConfig
from core.models.base import CausalLM
from core.models.tiny import TinyLM
from core.objective.behavior import BehaviorView
from core.rollout import (
    RolloutBatch,
    generate,
    left_pad,
    position_ids,
    response_logits,
    response_projection,
    sample_tokens,
    sampling_logprobs,
    topk_view,
)
from tests.core.argmax import argmax_decode


def tiny(seed: int = 0) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM(TinyModelConfig(d_model=32, n_layers=2, n_heads=2, max_seq_len=48))


def prompts(lm: TinyLM) -> list[list[int]]:
    texts = ["reverse 12=", "copy 9=", "1+2=", "sort 4312=", "x"]
    return [lm.tokenizer.encode_prompt(t) for t in texts * 4]


def test_vocabulary_makes_top20_a_real_truncation() -> None:
    lm = tiny()
    assert lm.tokenizer.vocab_size >= 512
    assert ModelConfig().name == "builtin:tiny"


def test_topk_view_always_contains_the_sampled_token() -> None:
    lm = tiny()
    gen = torch.Generator().manual_seed(0)
    # high temperature and K=2 over 512 tokens: the sampled token is usually outside the top-2
    for temperature, top_p in [(3.0, 1.0), (1.0, 0.9)]:
        batch = generate(
            lm,
            prompts(lm),
            max_new_tokens=6,
            temperature=temperature,
            top_p=top_p,
            top_k=2,
            generator=gen,
        )
        view = batch.behavior
        tokens = batch.tokens
        assert view.topk_ids.shape == (len(tokens), 2)
        hit = view.topk_ids == tokens[:, None]
        assert bool(hit.any(-1).all())
        # and its log-prob there is the sampled token's
        assert torch.allclose(view.topk_logprobs[hit], view.token_logprobs)
        assert bool(torch.isfinite(view.token_logprobs).all())


def test_topk_view_replaces_the_last_entry_when_missing() -> None:
    logp = torch.log_softmax(torch.tensor([[3.0, 2.0, 1.0, 0.0]]), -1)
    ids, vals = topk_view(logp, torch.tensor([3]), 2)
    assert ids.tolist() == [[0, 3]]
    assert torch.allclose(vals, logp[:, [0, 3]])


def test_top_p_truncates_and_renormalizes() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    lp = sampling_logprobs(logits, 1.0, 0.7)
    assert torch.isinf(lp[0, 2:]).all()
    assert torch.allclose(lp[0, :2].exp(), torch.tensor([0.625, 0.375]))


def test_kv_cache_rollout_matches_the_training_forward() -> None:
    """fp32, same weights: the recorded mu equals pi recomputed in one full pass."""
    lm = tiny()
    batch = generate(
        lm,
        prompts(lm),
        max_new_tokens=6,
        temperature=0.7,
        top_k=20,
        keep_full=True,
        generator=torch.Generator().manual_seed(1),
    )
    assert bool(batch.response_mask[:, 0].all())
    with torch.no_grad():
        logp = torch.log_softmax(response_logits(lm, batch, 0.7), -1)
    assert batch.behavior.full_logprobs is not None
    assert torch.allclose(logp, batch.behavior.full_logprobs, atol=1e-4)
    mu_a = logp.gather(-1, batch.tokens[:, None])[:, 0]
    assert torch.allclose(mu_a, batch.behavior.token_logprobs, atol=1e-4)
    # rows stop at EOS: nothing real follows an EOS
    eos = lm.tokenizer.eos_id
    for row, alive in zip(batch.responses.tolist(), batch.response_mask.tolist(), strict=True):
        real = [t for t, a in zip(row, alive, strict=True) if a]
        assert eos not in real[:-1]


def _sampler_gap(sampler: CausalLM, trained: TinyLM) -> torch.Tensor:
    """|log pi(a) - log mu(a)| per token: pi from `trained` in fp32, mu as `sampler` recorded."""
    batch = generate(
        sampler,
        prompts(trained),
        max_new_tokens=6,
        top_k=20,
        generator=torch.Generator().manual_seed(2),
    )
    with torch.no_grad():
        logp = torch.log_softmax(response_logits(trained, batch, 1.0), -1)
    pi_a = logp.gather(-1, batch.tokens[:, None])[:, 0]
    return (pi_a - batch.behavior.token_logprobs).abs()


def test_bf16_rollout_yields_a_different_behavior_policy() -> None:
    lm = tiny()
    low = lm.copy_as(torch.bfloat16)
    assert low.dtype == torch.bfloat16 and lm.dtype == torch.float32
    same = _sampler_gap(lm, lm)
    bf16 = _sampler_gap(low, lm)
    assert float(same.max()) < 1e-5
    # bf16 rounding moves mu away from the fp32 pi by orders of magnitude more than fp32 noise,
    # yet it is the same policy, not garbage
    assert float(bf16.mean()) > 1e-4
    assert float(bf16.mean()) > 100 * float(same.mean())
    assert float(bf16.max()) < 0.5


def test_select_keeps_behavior_rows_aligned() -> None:
    lm = tiny()
    batch = generate(
        lm, prompts(lm), max_new_tokens=5, top_k=4, generator=torch.Generator().manual_seed(3)
    )
    rows = torch.tensor([1, 4, 7])
    sub = batch.select(rows)
    assert torch.equal(sub.input_ids, batch.input_ids[rows])
    assert len(sub.behavior) == int(sub.response_mask.sum())
    assert torch.equal(
        sub.behavior.topk_ids[:, :].eq(sub.tokens[:, None]).any(-1),
        torch.ones(len(sub.tokens), dtype=torch.bool),
    )


# -- the pure parts, on known values -----------------------------------------------------------

HALVES = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125]]))
"""Probabilities whose cumulative sums are exact in binary: top-p edges compare exactly."""


def test_top_p_keeps_the_smallest_prefix_that_reaches_it() -> None:
    # 0.5 + 0.25 reaches 0.75: the third token is cut, though 0.75 is not above 0.75
    lp = sampling_logprobs(HALVES, 1.0, 0.75)
    assert lp[0].exp().tolist() == pytest.approx([2 / 3, 1 / 3, 0.0, 0.0])
    lp = sampling_logprobs(HALVES, 1.0, 0.5)
    assert lp[0].exp().tolist() == [1.0, 0.0, 0.0, 0.0]
    lp = sampling_logprobs(HALVES, 1.0, 0.76)
    assert lp[0].exp().tolist() == pytest.approx([4 / 7, 2 / 7, 1 / 7, 0.0])
    assert sampling_logprobs(HALVES, 1.0, 1.0)[0].exp().tolist() == pytest.approx(
        [0.5, 0.25, 0.125, 0.125]
    )


def test_temperature_divides_the_logits() -> None:
    # at temperature 2 the probabilities go as their square roots
    lp = sampling_logprobs(HALVES, 2.0, 1.0)
    root = torch.tensor([0.5, 0.25, 0.125, 0.125]).sqrt()
    assert torch.allclose(lp[0].exp(), root / root.sum())


def test_sample_tokens_by_inverse_cdf() -> None:
    logp = torch.log(torch.tensor([0.5, 0.25, 0.25])).expand(6, 3)
    u = torch.tensor([0.0, 0.49, 0.5, 0.74, 0.75, 0.999999])
    assert sample_tokens(logp, u).tolist() == [0, 0, 1, 1, 2, 2]
    # a cut token (probability 0) is never drawn, at either end of its empty step
    cut = torch.log(torch.tensor([0.5, 0.0, 0.5])).expand(3, 3)
    assert sample_tokens(cut, torch.tensor([0.4999, 0.5, 1.0])).tolist() == [0, 2, 2]


def test_left_pad_and_positions() -> None:
    ids, mask = left_pad([[7, 8, 9], [5]], pad=0, device=torch.device("cpu"))
    assert ids.tolist() == [[7, 8, 9], [0, 0, 5]]
    assert mask.tolist() == [[True, True, True], [False, False, True]]
    assert position_ids(mask).tolist() == [[0, 1, 2], [0, 0, 0]]


def test_assemble_cuts_each_completion_at_its_eos() -> None:
    eos = 2
    prompt_ids = torch.tensor([[0, 9], [8, 9], [8, 9]])
    prompt_mask = torch.tensor([[False, True], [True, True], [True, True]])
    responses = torch.tensor([[5, 2, 0], [5, 6, 7], [2, 0, 0]])
    rmask = torch.tensor([[True, True, False], [True, True, True], [True, False, False]])
    view = BehaviorView(torch.zeros(6), torch.zeros((6, 1), dtype=torch.long), torch.zeros((6, 1)))
    batch = RolloutBatch.assemble(
        prompt_ids, prompt_mask, responses, response_mask=rmask, behavior=view, eos=eos
    )
    assert batch.completions == [[5], [5, 6, 7], []]
    assert batch.prompt_len == 2
    assert batch.input_ids.tolist() == [[0, 9, 5, 2, 0], [8, 9, 5, 6, 7], [8, 9, 2, 0, 0]]
    assert batch.tokens.tolist() == [5, 2, 5, 6, 7, 2]
    assert batch.position_ids().tolist() == [[0, 0, 1, 2, 2], [0, 1, 2, 3, 4], [0, 1, 2, 2, 2]]


def test_a_generation_ends_at_the_last_token_any_row_is_alive_in() -> None:
    lm = tiny()
    batch = generate(
        lm, prompts(lm)[:3], max_new_tokens=6, top_k=3, generator=torch.Generator().manual_seed(1)
    )
    t = batch.response_mask.shape[1]
    assert bool(batch.response_mask[:, t - 1].any())
    lengths = batch.response_mask.sum(1).tolist()
    assert max(lengths) == t
    for row, n in zip(batch.completions, lengths, strict=True):
        assert len(row) in (n, n - 1)  # EOS excluded
        if len(row) == n:  # no EOS: the row ran to the limit
            assert n == 6
    assert len(batch.behavior) == sum(lengths)


def test_the_projection_multiplies_out_to_the_response_logits() -> None:
    lm = tiny()
    batch = generate(
        lm, prompts(lm)[:4], max_new_tokens=4, top_k=3, generator=torch.Generator().manual_seed(2)
    )
    proj = response_projection(lm, batch, 2.0)
    assert proj is not None and proj.hidden.shape == (len(batch.tokens), 32)
    assert torch.allclose(proj.materialize(), response_logits(lm, batch, 2.0), atol=1e-5)


def test_greedy_decoding_is_the_argmax_and_records_no_behavior() -> None:
    """Against a decode without the KV cache or padding: each prompt alone, the whole sequence
    run again for every token."""
    lm = tiny()
    tok = lm.tokenizer
    texts = ["reverse 12=", "1+2=", "sort 4312="]
    expected = argmax_decode(lm, [tok.encode_prompt(t) for t in texts], 5)
    batch = generate(lm, [tok.encode_prompt(t) for t in texts], max_new_tokens=5, greedy=True)
    assert batch.completions == expected
    assert all(len(c) == 5 for c in expected)  # random weights: no row stops early
    view = batch.behavior
    assert (len(view), tuple(view.topk_ids.shape), tuple(view.topk_logprobs.shape)) == (
        0,
        (0, 1),
        (0, 1),
    )


def test_finished_rows_leave_decoding_a_quarter_at_a_time() -> None:
    """Eight rows that end one token after another (the model is made to say EOS at a fixed
    position, and the prompts are of 8 lengths): a row that finishes is dropped from the cache
    once the finished are a quarter of those still decoded, and the loop ends, asking no more
    whether to stop, when the last row has."""
    lm = tiny()
    eos = lm.tokenizer.eos_id
    # 9 to 2 tokens, the first rows finishing first: the rows left are not a prefix of the batch
    prompts = [lm.tokenizer.encode_prompt("x" * n) for n in range(8, 0, -1)]
    stop_at = 9  # the token at position 9 is EOS: the rows give 1, 2, ..., 8 tokens
    forward, select_cache = lm.forward, lm.select_cache
    kept: list[int] = []
    asked: list[int] = []

    def should_stop() -> bool:
        asked.append(1)
        return False

    def eos_at_position(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        logits, cache = forward(*args, **kwargs)
        predicted = args[2][:, -1:] + 1  # the position of the token these logits predict
        logits[:, :, eos] = torch.where(predicted >= stop_at, 1e4, -1e4).to(logits.dtype)
        return logits, cache

    def counting_select(cache: Any, rows: torch.Tensor) -> Any:
        kept.append(len(rows))
        return select_cache(cache, rows)

    lm.forward = eos_at_position  # type: ignore[method-assign]
    lm.select_cache = counting_select  # type: ignore[method-assign]
    batch = generate(lm, prompts, max_new_tokens=12, greedy=True, should_stop=should_stop)
    assert batch.response_mask.sum(1).tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert [len(c) for c in batch.completions] == [0, 1, 2, 3, 4, 5, 6, 7]
    # 2 of 8 finished: 6 left; 2 of 6 (1 is not a quarter): 4; then 1 of 4, of 3, of 2
    assert kept == [6, 4, 3, 2, 1]
    assert len(asked) == 8  # once per token decoded, none after the last row's EOS


def test_the_full_forward_gives_the_shared_prefix_logits() -> None:
    """`prefix="full"`, the path of a model that cannot share its prompts, on a batch of more
    rows than response tokens (20 and 3)."""
    lm = tiny()
    batch = generate(
        lm, prompts(lm), max_new_tokens=3, top_k=3, generator=torch.Generator().manual_seed(4)
    )
    assert batch.response_mask.shape == (20, 3)
    with torch.no_grad():
        full = response_logits(lm, batch, 1.5, prefix="full")
        shared = response_logits(lm, batch, 1.5, prefix="shared")
    assert full.shape == (len(batch.tokens), lm.tokenizer.vocab_size)
    assert torch.allclose(full, shared, atol=1e-5)


def test_top_p_of_1_cuts_nothing_however_the_sums_round() -> None:
    """A near-certain token with a tail of unlikely ones: in fp32 the cumulative sum is 1.0 from
    the first token on, so a top-p cut at 1.0 would drop the whole tail (-inf: never sampled,
    an infinite ratio against pi). top_p = 1 is no truncation at all."""
    logits = torch.tensor([[0.0] + [-30.0] * 8])
    assert torch.log_softmax(logits, -1).exp().cumsum(-1)[0, 0] == 1.0
    lp = sampling_logprobs(logits, 1.0, 1.0)
    assert torch.equal(lp, torch.log_softmax(logits, -1))
    assert bool(torch.isfinite(lp).all())


def test_the_engines_default_top_k_is_the_configs() -> None:
    lm = tiny()
    batch = generate(lm, prompts(lm)[:2], max_new_tokens=2, generator=torch.Generator())
    assert batch.behavior.topk_ids.shape[1] == AlgorithmConfig().top_k == 20
