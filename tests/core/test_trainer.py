"""The training loop on the built-in tiny model: it learns something, logs finite metrics, and
its knobs (masks, estimators, schedule, KL to the reference, accumulation, aggregation, LoRA,
graders) do what they say (CPU, fixed seed). Stopping and resuming: test_trainer_resume.py."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from core.config import OptimConfig, TrainConfig
from core.models import load_model
from core.objective.loss import policy_loss
from core.training.schedule import lr_at
from core.training.trainer import TrainerCallback, group_advantages, train
from tests.support.trainer_runs import (
    TIMING,
    Recorder,
    read_metrics,
    small_config,
    strip_timing,
)

REQUIRED = {
    "step",
    "reward_mean",
    "reward_std",
    "loss",
    "masked_fraction",
    "masked_fraction_pos",
    "masked_fraction_neg",
    "divergence_mean",
    "divergence_max",
    "direction_disagreement",
    "direction_disagreement_far",
    "masked_only_predictive",
    "masked_only_dppo",
    "correction_masked_fraction",
    "correction_clipped_fraction",
    "offpolicy_logratio_abs",
    "entropy",
    "grad_norm",
    *TIMING,
}


@pytest.mark.usefixtures("spread_reward")
def test_short_run_changes_every_parameter_and_logs_finite_metrics(tmp_path: Path) -> None:
    cfg = small_config()
    torch.manual_seed(cfg.seed)
    initial = {
        n: p.detach().clone() for n, p in load_model(cfg.model, torch.device("cpu")).trainable()
    }
    rec = Recorder()
    result = train(cfg, tmp_path, callback=rec)
    assert result.step == 4 and not result.stopped
    assert result.final_model == tmp_path / "final"
    assert rec.steps == [1, 2, 3, 4] and rec.checkpoints == [2, 4]
    final = load_file(str(tmp_path / "final" / "model.safetensors"))
    assert set(final) == set(initial)
    unchanged = [n for n, t in initial.items() if torch.equal(t, final[n])]
    assert unchanged == []
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["zero_adv_groups"] < 1.0 for r in rows)  # every step had a gradient
    for row in rows:
        assert set(row) >= REQUIRED
        assert all(isinstance(v, float) and math.isfinite(v) for v in row.values())
        assert 0.0 <= row["reward_mean"] <= 1.0
        assert 0.0 <= row["masked_fraction"] <= 1.0


def test_group_advantages() -> None:
    r = torch.tensor([1.0, 0.0, 0.5, 0.5])
    assert torch.allclose(group_advantages(r, 2, False), torch.tensor([0.5, -0.5, 0.0, 0.0]))
    norm = group_advantages(r, 2, True)
    assert torch.allclose(norm[:2], torch.tensor([1.0, -1.0]) / math.sqrt(2), atol=1e-4)
    assert torch.equal(norm[2:], torch.zeros(2))


def test_group_advantages_use_each_groups_own_mean_and_std() -> None:
    """Groups of unequal means and spreads (the case above has equal means, where the batch's
    mean would pass): each reward is centred, and scaled, by its own group's statistics,
    computed here one group at a time with `statistics` (the sample std, as torch.std)."""
    import statistics

    rewards = [1.0, 0.0, 0.0, 0.9, 0.6, 0.6]
    groups = [rewards[:3], rewards[3:]]
    centred = [x - statistics.mean(g) for g in groups for x in g]
    scaled = [(x - statistics.mean(g)) / (statistics.stdev(g) + 1e-6) for g in groups for x in g]
    r = torch.tensor(rewards, dtype=torch.float64)
    assert torch.allclose(group_advantages(r, 3, False), torch.tensor(centred, dtype=r.dtype))
    assert torch.allclose(group_advantages(r, 3, True), torch.tensor(scaled, dtype=r.dtype))


def test_low_precision_stale_rollouts_make_the_mask_work(tmp_path: Path) -> None:
    cfg = small_config(
        steps=3,
        checkpoint_every=0,
        task={"warmup_steps": 20},  # peaked enough that an lr-1e-2 update moves TV past delta
        rollout={"dtype": "bfloat16", "staleness": 1},
        algorithm={"minibatches": 4, "delta_low": 0.05, "delta_high": 0.05},
        optim={"lr": 1e-2},
    )
    train(cfg, tmp_path)
    rows = read_metrics(tmp_path)
    assert all(r["offpolicy_logratio_abs"] > 0 for r in rows)  # mu != pi from the first update
    assert max(r["masked_fraction"] for r in rows) > 0


@pytest.mark.parametrize(
    ("algorithm", "rollout"),
    [
        ({"mask": "ppo_clip", "estimator": "binary"}, {"top_p": 0.9}),
        ({"mask": "dppo", "estimator": "binary", "kind": "kl", "delta_low": 0.05}, {}),
        ({"mask": "predictive", "estimator": "exact", "epochs": 2}, {"top_p": 0.8}),
        ({"mask": "predictive", "estimator": "topk_tail", "kind": "kl_reverse"}, {}),
        ({"mask": "none", "normalize_std": True}, {"temperature": 0.7, "dtype": "float16"}),
    ],
    ids=["ppo_clip-top_p", "dppo-kl", "exact-top_p-epochs", "topk_tail-kl_reverse", "none-fp16"],
)
def test_algorithm_and_sampling_variants_train_with_finite_metrics(
    tmp_path: Path, algorithm: dict[str, Any], rollout: dict[str, Any]
) -> None:
    cfg = small_config(
        steps=2, checkpoint_every=0, task={"warmup_steps": 5}, algorithm=algorithm, rollout=rollout
    )
    result = train(cfg, tmp_path)
    assert result.step == 2
    rows = read_metrics(tmp_path)
    assert all(math.isfinite(v) for r in rows for v in r.values())


# -- knobs: schedule, KL to the reference, gradient accumulation ----------------------------


def test_kl_beta_zero_is_the_unpenalized_path_bit_for_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """β = 0 builds no reference, reports no kl_ref, and trains exactly as a loss call without
    any of the new arguments (the trainer before the penalty existed)."""
    import core.training.run as run_module
    import core.training.update as update_module

    # the aggregation the loss had then (token_mean passes a count to minibatches whose token
    # counts differ from batch tokens / minibatches)
    cfg = small_config(steps=1, checkpoint_every=0, algorithm={"loss_agg": "minibatch_token_mean"})
    train(cfg, tmp_path / "now")

    def old_call(**kwargs: Any) -> Any:
        assert kwargs["region"].kl_beta == 0.0
        for name in ("ref_logprobs", "normalizer"):
            assert kwargs.pop(name) is None
        return policy_loss(**kwargs)

    def no_reference(*_: Any) -> None:
        raise AssertionError("β = 0 must not build a reference model")

    monkeypatch.setattr(update_module, "policy_loss", old_call)
    monkeypatch.setattr(run_module, "ReferencePolicy", no_reference)
    train(cfg, tmp_path / "old")
    monkeypatch.undo()
    now, old = read_metrics(tmp_path / "now"), read_metrics(tmp_path / "old")
    assert "kl_ref" not in now[0]
    assert strip_timing(now) == strip_timing(old)
    a = load_file(str(tmp_path / "now" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "old" / "final" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)

    from core.training.trainer import TrainingRun as _Run

    run = _Run(cfg, tmp_path / "run", TrainerCallback())
    assert run.reference is None and run.rollout_lm is run.lm  # no module but the policy
    kl = _Run(small_config(algorithm={"kl_beta": 0.1}), tmp_path / "kl", TrainerCallback())
    assert kl.reference is not None and kl.reference.lm.module is not kl.lm.module
    assert not any(p.requires_grad for p in kl.reference.lm.module.parameters())


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean", "minibatch_token_mean"])
@pytest.mark.parametrize("kl_beta", [0.0, 0.3])
def test_gradient_accumulation_gives_the_same_update(
    tmp_path: Path, kl_beta: float, loss_agg: str
) -> None:
    """Micro-batches of 8, 4 and 2 sequences (1, 2, 4 pieces of a minibatch of 8) divide by the
    normalizer of the whole minibatch (`algorithm.loss_agg`: a token count, or per sequence),
    so one step ends with the same weights up to fp32 rounding."""
    finals = []
    losses = []
    for accum in (1, 2, 4):
        out = tmp_path / f"acc{accum}"
        cfg = small_config(
            steps=1,
            checkpoint_every=0,
            # peaked enough that the step's samples earn rewards (3 steps left every reward 0
            # with most sampling streams: no gradient to compare)
            task={"warmup_steps": 20},
            algorithm={"kl_beta": kl_beta, "loss_agg": loss_agg},
            # AdamW's first step moves a weight by lr * g / (|g| + eps): with eps 1e-8 a
            # gradient element within fp32 rounding of 0 (~1e-9) moves by a noisy fraction of
            # lr, whichever way the sums were split; 1e-6 keeps the comparison to the gradient
            optim={"grad_accumulation": accum, "eps": 1e-6},
        )
        train(cfg, out)
        finals.append(load_file(str(out / "final" / "model.safetensors")))
        row = read_metrics(out)[0]
        losses.append((row["loss"], row["grad_norm"]))
    for other in finals[1:]:
        for k, t in finals[0].items():
            torch.testing.assert_close(other[k], t, rtol=0, atol=2e-6)
    # AdamW's first step hardly sees a gradient's scale; the loss and the norm do (the loss, a
    # difference of the policy term and the penalty, to its rounding: 1e-9 absolute)
    assert losses[0][0] != 0.0 and losses[0][1] > 0.0
    assert losses[1] == pytest.approx(losses[0], rel=1e-5, abs=1e-9)
    assert losses[2] == pytest.approx(losses[0], rel=1e-5, abs=1e-9)


@pytest.mark.usefixtures("spread_reward")
def test_loss_aggregations_are_different_updates(tmp_path: Path) -> None:
    """Responses of unequal length in two minibatches of unequal token counts: the three
    aggregations weigh the tokens differently, three gradient norms for the same rollout (the
    weights by hand: tests/core/test_loss.py)."""
    norms, lengths = {}, set()
    for agg in ("token_mean", "seq_mean", "minibatch_token_mean"):
        cfg = small_config(
            steps=1,
            checkpoint_every=0,
            task={"warmup_steps": 10, "warmup_lr": 3e-2},  # some answers end early
            algorithm={"loss_agg": agg, "minibatches": 2},
        )
        train(cfg, tmp_path / agg)
        row = read_metrics(tmp_path / agg)[0]
        norms[agg] = row["grad_norm"]
        lengths.add(row["response_len"])
    assert len(lengths) == 1 and 1.0 < lengths.pop() < 4.0  # one rollout, lengths vary
    assert len({round(v, 6) for v in norms.values()}) == 3, norms


@pytest.mark.usefixtures("spread_reward")
def test_offpolicy_logratio_covers_every_token_of_the_first_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each token counts once, measured by the pass that first trains on it: the first epoch's
    two minibatches (the second one after an update, so off-policy), not the second epoch."""
    import core.training.update as update_module

    seen: list[torch.Tensor] = []

    def recording(**kwargs: Any) -> Any:
        out = policy_loss(**kwargs)
        seen.append(out.log_ratio.abs())
        return out

    monkeypatch.setattr(update_module, "policy_loss", recording)
    cfg = small_config(
        steps=1,
        checkpoint_every=0,
        task={"warmup_steps": 3},
        algorithm={"minibatches": 2, "epochs": 2},
        optim={"grad_accumulation": 2},
    )
    train(cfg, tmp_path)
    row = read_metrics(tmp_path)[0]
    assert len(seen) == 8  # 2 epochs x 2 minibatches x 2 pieces
    first_epoch = torch.cat(seen[:4])
    assert len(first_epoch) == round(row["response_len"] * 16)  # the whole batch, once
    assert row["offpolicy_logratio_abs"] == pytest.approx(float(first_epoch.mean()), rel=1e-6)
    # the first minibatch is on-policy, the second is measured after the first update
    assert float(torch.cat(seen[2:4]).mean()) > 100 * float(torch.cat(seen[:2]).mean())


@pytest.mark.usefixtures("zero_reward")
def test_kl_pulls_a_moved_policy_back_toward_the_reference(tmp_path: Path) -> None:
    """The warm-up moves the policy away from the reference (the model as loaded); with every
    advantage 0 only the penalty has a gradient, and it walks the weights back: the measured
    KL falls and the weights end closer to the initial ones. Without it (β = 0) nothing moves
    at all."""
    base = {"steps": 8, "checkpoint_every": 0, "task": {"warmup_steps": 20}}
    cfg = small_config(**base, algorithm={"kl_beta": 1.0}, optim={"lr": 1e-3})
    torch.manual_seed(cfg.seed)
    initial = load_model(cfg.model, torch.device("cpu"))
    warmed = small_config(**{**base, "steps": 1}, algorithm={"kl_beta": 0.0})
    train(warmed, tmp_path / "beta0")
    pulled = train(cfg, tmp_path / "beta1")
    assert pulled.final_model is not None
    kl = [r["kl_ref"] for r in read_metrics(tmp_path / "beta1")]
    # measured on each step's own samples, so not monotone; 0.97 -> 0.05 on this seed
    assert kl[0] > 0.5 and kl[-1] < 0.25 * kl[0]

    def kl_to_initial(path: Path) -> float:
        """Mean KL(pi || pi_initial) of the next token over fixed prompts' positions."""
        from core.models.tiny import load_tiny_final

        lm = load_tiny_final(path / "final")
        ids = torch.tensor([lm.tokenizer.encode_prompt(f"{n}:") for n in (12, 34, 67, 89)])
        mask = torch.ones_like(ids, dtype=torch.bool)
        pos = torch.arange(ids.shape[1]).expand_as(ids)
        with torch.no_grad():
            logp = torch.log_softmax(lm.forward(ids, mask, pos)[0], -1)
            ref = torch.log_softmax(initial.forward(ids, mask, pos)[0], -1)
        return float((logp.exp() * (logp - ref)).sum(-1).mean())

    # β = 0 after a zero-advantage step: still exactly the warmed-up policy
    assert kl_to_initial(tmp_path / "beta1") < 0.1 * kl_to_initial(tmp_path / "beta0")


@pytest.mark.usefixtures("zero_reward")
def test_silent_run_warns_once_with_what_to_try(tmp_path: Path) -> None:
    class Warnings(Recorder):
        def __init__(self) -> None:
            super().__init__()
            self.warnings: list[str] = []

        def on_warning(self, message: str) -> None:
            self.warnings.append(message)

    cfg = small_config(steps=4, checkpoint_every=0, silent_steps=2)
    cb = Warnings()
    train(cfg, tmp_path, callback=cb)
    # the early warning once; the verdict at the end is `core.training.silence.run_warnings`'
    # (test_phases)
    early = [w for w in cb.warnings if not w.startswith("run finished with a warning")]
    assert len(early) == 1 and len(cb.warnings) == 3
    message = early[0]
    assert message.startswith("reward was 0 on every completion of the first 2 steps")
    assert "nothing is learned" in message and "task.warmup_steps" in message
    rows = read_metrics(tmp_path)
    assert [r["zero_adv_groups"] for r in rows] == [1.0] * 4
    # Grades.metrics reach the step's metrics
    assert rows[0]["grader_errors"] == 0.25 and rows[0]["grader/never"] == 0.0

    quiet = Warnings()
    train(small_config(steps=2, checkpoint_every=0, silent_steps=0), tmp_path / "q", callback=quiet)
    assert [w.split(":")[0] for w in quiet.warnings] == [
        "run finished with a warning (no_reward_variance)",
        "run finished with a warning (rewards_all_zero)",
    ]


def test_zero_adv_groups_and_the_warning_for_constant_groups() -> None:
    from core.training.silence import SilenceWatch, zero_adv_groups

    rewards = torch.tensor([1.0, 1.0, 0.5, 0.0, 0.2, 0.2])  # groups of 2: same, differ, same
    assert zero_adv_groups(rewards, 2) == pytest.approx(2 / 3)
    watch = SilenceWatch(2, jsonl_task=True)
    assert watch.observe(rewards, 2 / 3) is None and watch.streak == -1  # signal: never warn
    assert watch.observe(torch.zeros(6), 1.0) is None  # a later silent step is not "first"

    same = SilenceWatch(2, jsonl_task=True)
    groups = torch.tensor([1.0, 1.0, 0.5, 0.5])
    assert same.observe(groups, 1.0) is None
    message = same.observe(groups, 1.0)
    assert message is not None and "rewards ranged from 0.5 to 1" in message
    assert "rollout.group_size" in message and same.observe(groups, 1.0) is None  # once
    solved = SilenceWatch(1, jsonl_task=False)
    assert (solved.observe(torch.ones(4), 1.0) or "").startswith(
        "reward was 1 on every completion of the first step"
    )


def test_built_in_model_trains_a_chat_jsonl_dataset_through_grade(tmp_path: Path) -> None:
    """Rollout prompts go through `encode_example` (chat records rendered by the tokenizer)."""
    data = tmp_path / "chat.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": f"say {i}"}], "answer": str(i)} for i in range(8)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = small_config(
        steps=1,
        checkpoint_every=0,
        model={"tiny": {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 64}},
        task={"name": "jsonl", "path": str(data), "min_len": 2, "max_len": 4},
    )
    seen: list[list[int]] = []
    import core.training.run as run_module

    real = run_module.generate

    def spy(lm: Any, prompts: list[list[int]], **kw: Any) -> Any:
        seen.extend(prompts)
        return real(lm, prompts, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(run_module, "generate", spy)
        assert train(cfg, tmp_path / "out").step == 1
    from core.models.tiny import ByteTokenizer

    rendered = {ByteTokenizer().decode(p) for p in seen}
    assert rendered <= {f"user: say {i}\nassistant: " for i in range(8)} and rendered


def test_lora_reference_is_the_base_with_adapters_disabled(tmp_path: Path) -> None:
    """No copy with LoRA: the reference shares the policy's module and reads the base, which
    never trains, so after updates it still gives the loaded model's log-probs."""
    from core.models.hf import make_tiny_hf
    from core.rollout import generate, response_logits
    from core.training.trainer import TrainingRun as _Run

    hf = make_tiny_hf(tmp_path / "llama")
    cfg = small_config(
        model={"name": f"hf:{hf}", "lora": {"r": 4, "alpha": 32}},
        algorithm={"kl_beta": 0.1, "minibatches": 1},
        optim={"lr": 3e-2},
        steps=3,
    )
    run = _Run(cfg, tmp_path / "run", TrainerCallback())
    assert run.reference is not None and run.reference.shares_weights
    assert run.reference.lm is run.lm
    rows = [run.run_step() for _ in range(3)]
    assert rows[0]["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # B = 0: adapters start as no-op
    assert rows[-1]["kl_ref"] > 1e-4
    tok = run.lm.tokenizer
    batch = generate(run.lm, [tok.encode_prompt("12:")] * 4, max_new_tokens=4, top_k=8)
    ref = run.reference.token_logprobs(batch, 1.0, rows=2)[batch.response_mask]
    fresh = load_model(cfg.model.model_copy(update={"lora": None}), torch.device("cpu"))
    with torch.no_grad():
        base = torch.log_softmax(response_logits(fresh, batch, 1.0), -1)
        policy = torch.log_softmax(response_logits(run.lm, batch, 1.0), -1)
    want = base.gather(-1, batch.tokens[:, None])[:, 0]
    torch.testing.assert_close(ref, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(policy.gather(-1, batch.tokens[:, None])[:, 0], want, atol=1e-3)


@pytest.mark.parametrize(
    ("model", "lr"),
    [
        ({"name": "builtin:tiny"}, 1e-3),  # trained from scratch
        ({"name": "hf:/models/m"}, 1e-6),  # full fine-tuning of a pretrained model
        ({"name": "job:abc"}, 1e-6),
        ({"name": "hf:/models/m", "lora": {"r": 4}}, 1e-5),
    ],
)
def test_an_unset_lr_follows_the_model(model: dict[str, Any], lr: float) -> None:
    """Resolved once, when the spec validates: the stored spec, the trainer's optimizer and
    schedule, the budget and `--dry-run` all read `optim.lr`; a given lr is kept."""
    for optim in ({}, {"lr": None}):
        cfg = TrainConfig.model_validate({"model": model, "optim": optim})
        assert cfg.optim.lr == lr and cfg.optim.peak_lr == lr
        assert lr_at(0, cfg.optim, cfg.steps) == lr
        assert TrainConfig.model_validate(cfg.model_dump()).optim.lr == lr  # stored as is
    given = TrainConfig.model_validate({"model": model, "optim": {"lr": 3e-4}})
    assert given.optim.lr == 3e-4
    with pytest.raises(ValueError, match=r"optim\.lr is unset"):
        _ = OptimConfig().peak_lr


def test_the_trainer_uses_the_resolved_lr_of_an_hf_model(tmp_path: Path) -> None:
    from core.models.hf import make_tiny_hf
    from core.training.trainer import TrainingRun as _Run

    hf = make_tiny_hf(tmp_path / "llama")
    data = small_config().model_dump()
    data["model"] = {"name": f"hf:{hf}"}
    del data["optim"]["lr"]
    cfg = TrainConfig.model_validate(data)
    run = _Run(cfg, tmp_path / "run", TrainerCallback())
    assert [g["lr"] for g in run.optimizer.param_groups] == [1e-6]
    assert run.run_step()["lr"] == 1e-6


def test_job_model_starts_from_the_saved_final_in_its_family(tmp_path: Path) -> None:
    """`job:<id>` loads the folder the worker resolved: the saved weights and shape (not the
    spec's tiny dims) of a builtin:tiny final, a Hugging Face final through HFLM; without a
    folder it says that only a worker can resolve it."""
    from core.models.hf import HFLM, make_tiny_hf
    from core.training.trainer import TrainingRun as _Run

    first = train(small_config(steps=1, checkpoint_every=0), tmp_path / "a")
    assert first.final_model is not None
    spec = {"name": "job:a1", "tiny": {"d_model": 16, "n_layers": 2, "n_heads": 2}}
    cfg = small_config(model=spec, algorithm={"kl_beta": 0.1})
    run = _Run(cfg, tmp_path / "b", TrainerCallback(), model_dir=first.final_model)
    saved = load_file(str(first.final_model / "model.safetensors"))
    assert {n: p.detach() for n, p in run.lm.trainable()}.keys() == saved.keys()
    assert all(torch.equal(p.detach(), saved[n]) for n, p in run.lm.trainable())
    assert run.reference is not None  # the reference is the loaded final, too
    assert all(torch.equal(p, saved[n]) for n, p in run.reference.lm.module.named_parameters())
    assert run.lm.max_seq_len == 32  # the saved shape, not the spec's

    hf = make_tiny_hf(tmp_path / "hf-final")
    hf_run = _Run(
        small_config(model={"name": "job:h1"}), tmp_path / "c", TrainerCallback(), model_dir=hf
    )
    assert isinstance(hf_run.lm, HFLM)
    with pytest.raises(ValueError, match="names the final model of a service job"):
        train(small_config(model={"name": "job:a1"}), tmp_path / "d")


def _grading_children() -> set[int]:
    """Live child processes of this one that run the grading server (`python -P -c ...`)."""
    import os

    pids: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat[1]) == os.getpid() and stat[0] != "Z" and b"-P" in cmdline:
            pids.add(int(entry.name))
    return pids


def test_a_run_stops_its_grading_server_when_it_ends(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{i}", "answer": f"{i}"}) + "\n" for i in range(8))
    )
    cfg = small_config(
        steps=2,
        checkpoint_every=0,
        task={"name": "jsonl", "path": str(data), "grader": {"type": "regex", "pattern": "[0-9]+"}},
    )
    before = _grading_children()
    seen: list[set[int]] = []

    class Watch(TrainerCallback):
        def on_step(self, step: int, metrics: dict[str, float]) -> None:
            seen.append(_grading_children() - before)

    from core.tasks.jsonl import JsonlTask

    closed: list[set[int]] = []
    real_close = JsonlTask.close

    def close(task: JsonlTask) -> None:
        real_close(task)
        closed.append(_grading_children() - before)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(JsonlTask, "close", close)
        assert train(cfg, tmp_path / "out", callback=Watch()).step == 2
    assert len(seen[0]) == 1  # the regex grader ran in a server of its own
    # the run closed its task (not left to the garbage collector), which stopped the server
    assert closed[:1] == [set()]
    assert _grading_children() - before == set()
