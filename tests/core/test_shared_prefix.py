"""Each prompt once for all the rows that hold it: in the training forward (`core.rollout.prefix`)
the logits and the gradients of every trainable parameter equal the full forward's (1e-5 relative,
fp32), for `builtin:tiny` and the Hugging Face Llama family (full weights and LoRA), with left
padding, groups split across minibatches and answers of different lengths; generation prefills
each distinct prompt once, drops finished rows, and samples exactly the recorded distribution."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
from torch import Tensor

from core.config import ModelConfig, TinyModelConfig
from core.models import CausalLM, load_model
from core.models.hf import make_tiny_hf
from core.models.tiny import TinyLM
from core.objective.behavior import BehaviorView
from core.rollout import (
    RolloutBatch,
    generate,
    left_pad,
    response_logits,
    sample_tokens,
    sampling_logprobs,
)
from core.rollout.prefix import distinct_rows

GROUP = 4
PROMPTS = ["12+3=", "reverse 4567=", "x", "copy 89="]  # 6, 14, 2 and 8 tokens with BOS


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny random model of each covered family and of one that is not (GPT-2), all with
    make_tiny_hf's character tokenizer, built here (no download)."""
    root = tmp_path_factory.mktemp("families")
    llama = make_tiny_hf(root / "llama")
    dirs = {"llama": llama}
    for family in ("qwen2", "qwen3", "gpt2"):
        dirs[family] = _save_family(root / family, llama, family)
    return dirs


def _save_family(path: Path, tok_dir: Path, family: str) -> Path:
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        GPT2Config,
        Qwen2Config,
        Qwen3Config,
    )

    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    ids = {
        "vocab_size": len(tok),
        "pad_token_id": tok.pad_token_id,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
    }
    llama_like = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "tie_word_embeddings": False,
    }
    config: Any
    if family == "qwen2":
        config = Qwen2Config(**llama_like, **ids)
    elif family == "qwen3":
        config = Qwen3Config(**llama_like, head_dim=8, **ids)
    else:
        config = GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=128, **ids)
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(str(path), safe_serialization=True)
    tok.save_pretrained(str(path))
    return path


def build(family: str, hf_dirs: dict[str, Path]) -> CausalLM:
    """The policy in fp32; LoRA's B matrices randomized (they start at 0, which would leave
    the A matrices without a gradient to compare)."""
    torch.manual_seed(0)
    if family == "tiny":
        return TinyLM(TinyModelConfig(d_model=32, n_layers=2, n_heads=2, max_seq_len=64))
    name, lora = family.removesuffix("-lora"), family.endswith("-lora")
    cfg = ModelConfig(name=f"hf:{hf_dirs[name]}", lora={"r": 4, "alpha": 8} if lora else None)
    lm = load_model(cfg, torch.device("cpu"))
    with torch.no_grad():
        for n, p in lm.module.named_parameters():
            if "lora_B" in n:
                p.normal_(std=0.1)
    return lm


def pack(lm: CausalLM, lengths: list[int], seed: int = 0) -> RolloutBatch:
    """PROMPTS x GROUP rows, a group's rows consecutive, with random answers of `lengths[i]`
    tokens (row i), ending with EOS when shorter than the longest: the rollout layout."""
    tok = lm.tokenizer
    prompts = [tok.encode_prompt(p) for p in PROMPTS for _ in range(GROUP)]
    gen = torch.Generator().manual_seed(seed)
    t = max(lengths)
    ids, mask = left_pad(prompts, tok.pad_id, torch.device("cpu"))
    resp = torch.full((len(prompts), t), tok.pad_id, dtype=torch.long)
    rmask = torch.zeros((len(prompts), t), dtype=torch.bool)
    for i, n in enumerate(lengths):
        resp[i, :n] = torch.randint(4, 90, (n,), generator=gen)
        if n < t:
            resp[i, n - 1] = tok.eos_id
        rmask[i, :n] = True
    n_tok = int(rmask.sum())
    view = BehaviorView(
        torch.zeros(n_tok), torch.zeros(n_tok, 1, dtype=torch.long), torch.zeros(n_tok, 1)
    )
    return RolloutBatch(
        input_ids=torch.cat([ids, resp], 1),
        attention_mask=torch.cat([mask, rmask], 1),
        prompt_len=ids.shape[1],
        response_mask=rmask,
        behavior=view,
        completions=[[]] * len(prompts),
    )


LENGTHS = [6, 2, 6, 1, 3, 6, 5, 6, 1, 4, 6, 6, 2, 2, 6, 3]  # EOS early in most rows


def grads(
    lm: CausalLM, batch: RolloutBatch, prefix: Literal["full", "shared"]
) -> tuple[Tensor, dict[str, Tensor]]:
    """Logits and the gradient of a policy-gradient-like loss (a different weight per token)."""
    for _, p in lm.trainable():
        p.grad = None
    logits = response_logits(lm, batch, 0.7, prefix=prefix)
    logp = torch.log_softmax(logits, -1).gather(-1, batch.tokens[:, None])[:, 0]
    weight = torch.linspace(-1.0, 2.0, len(logp))
    (weight * logp).sum().backward()
    out = {}
    for n, p in lm.trainable():
        assert p.grad is not None, n
        out[n] = p.grad.detach().clone()
    return logits.detach(), out


class ForwardSpy:
    """Records the batch size and length of every `lm.forward` call."""

    def __init__(self, lm: CausalLM, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[int, int]] = []
        real: Callable[..., Any] = lm.forward

        def spy(input_ids: Tensor, *args: Any, **kwargs: Any) -> Any:
            self.calls.append((int(input_ids.shape[0]), int(input_ids.shape[1])))
            return real(input_ids, *args, **kwargs)

        monkeypatch.setattr(lm, "forward", spy)


FAMILIES = ["tiny", "llama", "llama-lora", "qwen2", "qwen3"]
MINIBATCHES = {
    "whole batch": list(range(16)),
    "groups split": [0, 1, 2, 5, 6, 9, 12, 13, 14, 15],  # parts of every group
    "one row per prompt": [3, 4, 10, 12],
}


@pytest.mark.parametrize("family", FAMILIES)
def test_shared_prefix_gives_the_full_forwards_logits_and_gradients(
    family: str, hf_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    lm = build(family, hf_dirs)
    assert lm.shares_prefix
    batch = pack(lm, LENGTHS)
    for what, rows in MINIBATCHES.items():
        mb = batch.select(torch.tensor(rows))
        full_logits, full = grads(lm, mb, "full")
        with monkeypatch.context() as m:
            spy = ForwardSpy(lm, m)
            shared_logits, shared = grads(lm, mb, "shared")
        distinct = len({tuple(r) for r in mb.input_ids[:, : mb.prompt_len].tolist()})
        assert spy.calls[0][0] == distinct, what  # each distinct prompt once
        # the T logit columns the loss reads, nothing more: the tail runs T - 1 positions
        assert spy.calls[1][1] == int(mb.response_mask.sum(1).max()) - 1, what
        torch.testing.assert_close(shared_logits, full_logits, rtol=1e-5, atol=1e-5)
        assert set(shared) == set(full) and len(full) > 0
        for name, g in full.items():
            assert float(g.norm()) > 0, (what, name)
            rel = float((shared[name] - g).norm() / g.norm())
            assert rel < 1e-5, (what, name, rel)


def test_auto_shares_where_the_model_can_and_runs_the_rest_in_full(
    hf_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPT-2 is not of the Llama family: every row runs whole (the reference path), in
    generation too, and asking for sharing says why not."""
    gpt2 = build("gpt2", hf_dirs)
    assert not gpt2.shares_prefix
    batch = pack(gpt2, LENGTHS)
    spy = ForwardSpy(gpt2, monkeypatch)
    with torch.no_grad():
        auto = response_logits(gpt2, batch, 1.0)
    assert spy.calls == [(16, batch.prompt_len + 6 - 1)]  # one pass, T columns kept
    assert auto.shape == (sum(LENGTHS), gpt2.tokenizer.vocab_size)
    with pytest.raises(ValueError, match="cannot share prompts"):
        response_logits(gpt2, batch, 1.0, prefix="shared")
    spy.calls.clear()
    prompts = [gpt2.tokenizer.encode_prompt(p) for p in PROMPTS for _ in range(GROUP)]
    sampled = generate(gpt2, prompts, max_new_tokens=4, generator=torch.Generator().manual_seed(0))
    assert [b for b, _ in spy.calls] == [16] * 4  # every row prefilled, none dropped
    with torch.no_grad():
        pi = torch.log_softmax(response_logits(gpt2, sampled, 1.0), -1)
    pi_a = pi.gather(-1, sampled.tokens[:, None])[:, 0]
    torch.testing.assert_close(pi_a, sampled.behavior.token_logprobs, rtol=0, atol=1e-4)


def test_distinct_rows_compares_real_tokens_not_the_layout() -> None:
    pad = 0
    ids = torch.tensor([[pad, 7, 8], [5, 7, 8], [pad, 7, 8], [0, 7, 8], [5, 7, 8]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]]).bool()
    first, rows = distinct_rows(ids, mask)
    # a real token equal to the pad id is not padding; equal rows need not be neighbours
    assert len(first) == 3
    assert rows[0] == rows[2] and rows[1] == rows[4]
    assert len({int(rows[0]), int(rows[1]), int(rows[3])}) == 3
    assert torch.equal(first[rows], torch.tensor([0, 1, 0, 3, 1]))


def eos_often(lm: CausalLM, bonus: float) -> None:
    """Adds `bonus` to the EOS logit in every forward (a hook on the output head), so rows end
    at different lengths: generation and the training forward see the same policy."""
    head = lm.module.head if isinstance(lm, TinyLM) else lm.module.get_output_embeddings()
    eos = lm.tokenizer.eos_id

    def hook(_m: Any, _i: Any, out: Tensor) -> Tensor:
        out = out.clone()
        out[..., eos] += bonus
        return out

    head.register_forward_hook(hook)


@pytest.mark.parametrize("family", ["tiny", "llama"])
@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_generation_shares_prompts_drops_finished_rows_and_records_what_it_sampled(
    family: str, top_p: float, hf_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    lm = build(family, hf_dirs)
    eos_often(lm, 3.0)
    tok = lm.tokenizer
    # groups interleaved, not consecutive: rows are matched by their tokens
    prompts = [tok.encode_prompt(p) for _ in range(GROUP) for p in PROMPTS]
    spy = ForwardSpy(lm, monkeypatch)
    batch = generate(
        lm,
        prompts,
        max_new_tokens=8,
        temperature=0.8,
        top_p=top_p,
        top_k=5,
        keep_full=True,
        generator=torch.Generator().manual_seed(3),
    )
    monkeypatch.undo()
    assert spy.calls[0] == (len(PROMPTS), batch.prompt_len)  # each distinct prompt once
    decoded = [b for b, t in spy.calls[1:]]  # rows of each decoding forward
    assert decoded == sorted(decoded, reverse=True) and decoded[-1] < len(prompts)
    lengths = batch.response_mask.sum(1)
    assert int(lengths.min()) < int(lengths.max())
    eos = tok.eos_id
    for row, alive in zip(batch.responses.tolist(), batch.response_mask.tolist(), strict=True):
        real = [t for t, a in zip(row, alive, strict=True) if a]
        assert eos not in real[:-1] and (real[-1] == eos or len(real) == batch.responses.shape[1])
    # what was recorded is the policy that a full forward computes over the sampled rows
    with torch.no_grad():
        pi = sampling_logprobs(response_logits(lm, batch, 0.8, prefix="full"), 1.0, top_p)
    full = batch.behavior.full_logprobs
    assert full is not None
    # (a nucleus may differ at its edge, where two near-equal probabilities trade places)
    both = torch.isfinite(full) & torch.isfinite(pi)
    assert float(both.sum()) >= 0.999 * float(torch.isfinite(full).sum())
    torch.testing.assert_close(full[both], pi[both], rtol=0, atol=1e-4)
    sampled = full.gather(-1, batch.tokens[:, None])[:, 0]
    assert bool(torch.isfinite(sampled).all())
    assert bool(torch.isfinite(pi.gather(-1, batch.tokens[:, None])).all())
    torch.testing.assert_close(batch.behavior.token_logprobs, sampled)


def test_sampler_draws_exactly_the_sampling_distribution() -> None:
    """400k inverse-CDF draws from one top-p-truncated row: every frequency within 5 standard
    errors of its probability, and no token outside the nucleus, ever."""
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -4.0, 1.0, 0.0, -2.0, 2.5, -0.5, 1.5, -3.0]])
    logp = sampling_logprobs(logits, 1.3, 0.9)  # (1, 12), -inf outside the nucleus
    probs = logp.exp()[0]
    assert int((probs == 0).sum()) >= 3
    n = 400_000
    u = torch.rand(n, generator=torch.Generator().manual_seed(0))
    draws = sample_tokens(logp.expand(n, -1).contiguous(), u)
    freq = torch.bincount(draws, minlength=12).double() / n
    assert float(freq[probs == 0].sum()) == 0.0
    stderr = (probs.double() * (1 - probs.double()) / n).sqrt()
    assert bool(((freq - probs.double()).abs() <= 5 * stderr + 1e-9).all()), (freq, probs)


def test_sampler_never_draws_a_cut_token_at_the_ends_of_the_unit_interval() -> None:
    """u = 0, the largest float torch.rand draws (1 - 2^-24) and even 1 itself, with cut tokens
    (-inf) first and last in the vocabulary: the draw is a token of positive probability, the
    first or the last such one."""
    inf = float("-inf")
    logp = torch.log_softmax(torch.tensor([[inf, 0.3, 1.7, 0.1, inf, inf]] * 3), -1)
    u = torch.tensor([0.0, 1.0 - 2.0**-24, 1.0])
    assert sample_tokens(logp, u).tolist() == [1, 3, 3]


def test_a_training_step_tokenizes_and_prefills_each_prompt_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer's rollout: one tokenization and one prefill row per drawn prompt, the
    group's rows sharing them; and its AdamW runs one fused kernel on CPU."""
    from core.config import TrainConfig
    from core.models.tiny import ByteTokenizer
    from core.training.trainer import TrainerCallback
    from core.training.trainer import TrainingRun as _Run

    cfg = TrainConfig.model_validate(
        {
            "model": {"tiny": {"d_model": 16, "n_layers": 1, "n_heads": 2, "max_seq_len": 32}},
            "task": {"name": "reverse", "min_len": 4, "max_len": 6},
            "rollout": {"prompts_per_step": 3, "group_size": 5, "max_new_tokens": 3},
            "device": "cpu",
        }
    )
    run = _Run(cfg, tmp_path, TrainerCallback())
    assert run.optimizer.param_groups[0]["fused"] is True
    encoded: list[str] = []
    real_encode = ByteTokenizer.encode_prompt

    def counting(self: ByteTokenizer, text: str) -> list[int]:
        encoded.append(text)
        return real_encode(self, text)

    monkeypatch.setattr(ByteTokenizer, "encode_prompt", counting)
    spy = ForwardSpy(run.rollout_lm, monkeypatch)
    ro = run.rollout()
    assert len(encoded) == 3 and ro.batch.input_ids.shape[0] == 15
    assert spy.calls[0][0] == len(set(encoded))  # the prefill: one row per distinct prompt
    assert [e.prompt for e in ro.examples] == [p for p in encoded for _ in range(5)]
