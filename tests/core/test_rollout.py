"""The rollout engine: what it records about the behavior policy is what it sampled from."""

from __future__ import annotations

import torch

from core.config import ModelConfig, TinyModelConfig
from core.models.base import CausalLM
from core.models.tiny import TinyLM
from core.rollout import generate, response_logits, sampling_logprobs, topk_view


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
