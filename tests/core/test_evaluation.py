"""Held-out evaluation and rollout samples (`core.training.evaluation`), on the built-in tiny
model (CPU).

pass@k against hand-computed values and against the binomial formula; metrics recomputed from
what the grader was really shown; greedy completions against a cache-free argmax decode; the
same numbers for the same (seed, step) and none of the training RNG touched; and, through the
trainer, a run with evaluation trains exactly like one without, and a run stopped in the middle
of an evaluation resumes to the files of an uninterrupted run.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from core.config import TrainConfig
from core.models import CausalLM, load_model
from core.rollout import StopRequested, generate
from core.tasks.base import Example, Grades
from core.training.evaluation import (
    PASS_REWARD,
    SAMPLE_TEXT_CHARS,
    Evaluator,
    RunResults,
    StepRollout,
    eval_seed,
    last_row_step,
    make_sample,
    pass_at_k,
    pass_ks,
    pick_samples,
    truncate_rows,
)
from core.training.trainer import TrainerCallback, train
from tests.core.argmax import argmax_decode
from tests.core.held_out import DIGITS, HeldOutReverse, config, run_config

TIMING = {"tokens_per_s", "rollout_time", "update_time", "step_time", "eval_time"}


def tiny(cfg: TrainConfig) -> CausalLM:
    torch.manual_seed(cfg.seed)
    return load_model(cfg.model, torch.device("cpu"))


# -- pass@k ---------------------------------------------------------------------------------


def test_pass_at_k_hand_computed_values() -> None:
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)  # c / n
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # 1 - C(7,5)/C(10,5)
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 3, 2) == 1.0  # fewer failures (1) than draws (2): a pass is certain
    assert pass_at_k(4, 1, 4) == 1.0
    for n, c, k in [(8, 3, 2), (16, 5, 4), (64, 10, 32)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(4, 5, 1)
    # the edges: no draw at all and a negative count are not estimates of anything
    with pytest.raises(ValueError, match=r"1 <= k <= n, got n=4 c=1 k=0"):
        pass_at_k(4, 1, 0)
    with pytest.raises(ValueError, match=r"0 <= c <= n and 1 <= k <= n, got n=4 c=-1 k=1"):
        pass_at_k(4, -1, 1)
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 1) == 1.0 and pass_at_k(1, 1, 1) == 1.0


def test_reported_k_are_one_powers_of_two_and_n() -> None:
    assert pass_ks(1) == []
    assert pass_ks(2) == [1, 2]
    assert pass_ks(6) == [1, 2, 4, 6]
    assert pass_ks(8) == [1, 2, 4, 8]


def test_eval_seed_depends_on_seed_and_step_only() -> None:
    assert eval_seed(0, 5) == eval_seed(0, 5)
    assert len({eval_seed(0, 5), eval_seed(0, 6), eval_seed(1, 5)}) == 3
    assert 0 <= eval_seed(2**63 - 4, 10_000_000) < 2**63


def test_eval_seed_is_the_top_63_bits_of_its_hash() -> None:
    """Known values: a run resumed by another version of pdppo evaluates a step again with
    the same draws only if the recipe stays put; 63 bits fill torch's seed range."""
    assert eval_seed(0, 5) == 4233499999400229535
    assert eval_seed(7, 123) == 9177992329687503002
    seeds = [eval_seed(s, t) for s in range(20) for t in range(20)]
    assert max(seeds).bit_length() == 63 and min(seeds) >= 0


# -- samples --------------------------------------------------------------------------------


def test_samples_take_the_first_of_each_group_then_the_second() -> None:
    exs = [Example(f"p{g}", f"a{g}") for g in range(3) for _ in range(2)]  # 3 groups of 2
    comps = [[i] for i in range(6)]
    rollout = StepRollout(exs, comps, [i / 10 for i in range(6)])
    got = pick_samples(rollout, 2, 4, lambda ids: f"c{ids[0]}")
    assert [(s["prompt"], s["completion"], s["reward"]) for s in got] == [
        ("p0", "c0", 0.0),
        ("p1", "c2", 0.2),
        ("p2", "c4", 0.4),
        ("p0", "c1", 0.1),
    ]
    assert all(s["answer"] == s["prompt"].replace("p", "a") and not s["truncated"] for s in got)
    with pytest.raises(ValueError, match="whole groups"):
        pick_samples(StepRollout(exs[:5], comps[:5], [0.0] * 5), 2, 1, str)


def test_samples_cut_long_texts_and_render_chat_turns() -> None:
    chat = Example(
        "hi",
        "x" * (SAMPLE_TEXT_CHARS + 1),
        messages=({"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}),
    )
    sample = make_sample(chat, "y" * 5000, 1.0)
    assert sample["prompt"] == "system: be brief\nuser: hi"
    assert sample["answer"] == "x" * SAMPLE_TEXT_CHARS and len(sample["completion"]) == 2000
    assert sample["truncated"] is True
    short = make_sample(Example("p", "a"), "c", 0.25)
    assert short == {"prompt": "p", "answer": "a", "completion": "c", "reward": 0.25,
                     "truncated": False}  # fmt: skip


def test_many_samples_share_the_event_budget() -> None:
    exs = [Example("p" * 3000, "a") for _ in range(64)]  # 32 groups of 2
    rollout = StepRollout(exs, [[0]] * 64, [1.0] * 64)
    got = pick_samples(rollout, 2, 64, lambda ids: "c" * 3000)
    assert len(got) == 64
    assert all(len(s["prompt"]) == len(s["completion"]) == 125 for s in got)  # 24000 / (3 * 64)
    assert all(s["truncated"] and s["answer"] == "a" for s in got)
    assert sum(len(s["prompt"]) + len(s["answer"]) + len(s["completion"]) for s in got) <= 24_000
    few = pick_samples(rollout, 2, 2, lambda ids: "c" * 3000)
    assert [len(s["completion"]) for s in few] == [SAMPLE_TEXT_CHARS] * 2


# -- the evaluator --------------------------------------------------------------------------


def test_metrics_are_computed_from_what_the_grader_saw() -> None:
    cfg = config(
        eval_every=2, task={"name": "jsonl", "path": "x.jsonl", "validation_fraction": 0.1}
    )
    task = HeldOutReverse()
    out = Evaluator(cfg, task, tiny(cfg)).evaluate(step=2)
    n, k = len(DIGITS), 4
    sampled, greedy = task.graded[: n * k], task.graded[n * k :]
    assert [i for i, _, _ in sampled] == [i for i in range(n) for _ in range(k)]
    assert [i for i, _, _ in greedy] == list(range(n))
    rewards = [r for _, _, r in sampled]
    assert 0 < rewards.count(1.0) < len(rewards)  # a mix: the pass@k below mean something
    assert out["eval_prompts"] == n
    assert out["eval_reward_mean"] == pytest.approx(sum(rewards) / len(rewards))
    passed = [sum(r == 1.0 for r in rewards[i * k : (i + 1) * k]) for i in range(n)]
    for kk in (1, 2, 4):
        expect = sum(1 - math.comb(k - c, kk) / math.comb(k, kk) for c in passed) / n
        assert out[f"eval_pass@{kk}"] == pytest.approx(expect)
    assert out["eval_greedy_reward_mean"] == pytest.approx(sum(r for *_, r in greedy) / n)
    # 24 sampled rows in batches of 16 and 8: the batch-size weighted mean of the grader's
    # batch means is the mean index 2.5 (an unweighted mean of batch means would be 3.0)
    assert out["eval_grader/index"] == pytest.approx(2.5)
    assert out["eval_greedy_grader/index"] == pytest.approx(2.5)
    assert 0 < out["eval_response_len"] <= cfg.rollout.max_new_tokens
    assert set(out) == {
        "eval_prompts", "eval_reward_mean", "eval_response_len", "eval_pass@1", "eval_pass@2",
        "eval_pass@4", "eval_grader/index", "eval_greedy_reward_mean",
        "eval_greedy_grader/index", "eval_time",
    }  # fmt: skip


class RewardByIndex(HeldOutReverse):
    """Rewards that do not depend on what the model wrote: held-out example i scores
    (i + 1) / 8, so every mean over the held-out set is known in advance."""

    def grade(self, examples: Sequence[Example], completions: Sequence[str]) -> Grades:
        super().grade(examples, completions)
        return Grades([(self.held.index(e) + 1) / 8 for e in examples], {})


def test_the_greedy_mean_and_the_time_are_of_this_evaluation() -> None:
    cfg = config(
        eval_every=2, task={"name": "jsonl", "path": "x.jsonl", "validation_fraction": 0.1}
    )
    evaluator = Evaluator(cfg, RewardByIndex(), tiny(cfg))
    started = time.perf_counter()
    out = evaluator.evaluate(step=2)
    took = time.perf_counter() - started
    mean = sum(range(1, len(DIGITS) + 1)) / len(DIGITS) / 8  # 0.4375
    assert out["eval_greedy_reward_mean"] == pytest.approx(mean)
    assert out["eval_reward_mean"] == pytest.approx(mean)
    assert 0 < out["eval_time"] <= took


def test_greedy_completions_are_the_argmax_decode() -> None:
    """Against a decode without the KV cache or padding: the whole sequence re-run for every
    token, one prompt at a time."""
    cfg = config(eval_every=1, eval_samples=1, task={"name": "jsonl", "path": "x.jsonl",
                 "validation_fraction": 0.1})  # fmt: skip
    task = HeldOutReverse()
    lm = tiny(cfg)
    tok = lm.tokenizer
    prompts = [tok.encode_prompt(e.prompt) for e in task.held]  # of 2 lengths: left padding
    expected = argmax_decode(lm, prompts, cfg.rollout.max_new_tokens)
    batch = generate(lm, prompts, max_new_tokens=cfg.rollout.max_new_tokens, greedy=True)
    assert batch.completions == expected
    assert len(batch.behavior) == 0  # nothing recorded: a greedy batch is never trained on
    out = Evaluator(cfg, task, lm).evaluate(step=1)
    assert "eval_pass@1" not in out  # one sample per prompt: no pass@k
    assert [c for _, c, _ in task.graded[len(DIGITS) :]] == [tok.decode(e) for e in expected]


def test_same_step_same_numbers_and_training_rng_untouched() -> None:
    cfg = config(
        eval_every=1, task={"name": "jsonl", "path": "x.jsonl", "validation_fraction": 0.1}
    )
    lm = tiny(cfg)
    lm.module.train()
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    runs = []
    for step in (3, 3, 4):
        task = HeldOutReverse()
        out = Evaluator(cfg, task, lm).evaluate(step)
        runs.append((out, [c for _, c, _ in task.graded]))
    assert torch.equal(torch.get_rng_state(), before)  # evaluation drew nothing from it
    assert lm.module.training  # back in train mode
    strip = [{k: v for k, v in out.items() if k != "eval_time"} for out, _ in runs]
    assert strip[0] == strip[1] and runs[0][1] == runs[1][1]
    assert runs[0][1] != runs[2][1]  # another step, another generator seed


def test_a_stop_ends_the_evaluation_and_restores_train_mode() -> None:
    cfg = config(
        eval_every=1, task={"name": "jsonl", "path": "x.jsonl", "validation_fraction": 0.1}
    )
    lm = tiny(cfg)
    lm.module.train()
    asked = 0

    def stop_soon() -> bool:
        nonlocal asked
        asked += 1
        return asked > 3  # the first batch's first tokens, then stop

    task = HeldOutReverse()
    with pytest.raises(StopRequested):
        Evaluator(cfg, task, lm, stop_soon).evaluate(1)
    assert task.graded == [] and asked == 4
    assert lm.module.training


# -- through the trainer --------------------------------------------------------------------


class Recorder(TrainerCallback):
    def __init__(self, stop_in_eval_of: int | None = None) -> None:
        self.events: list[tuple[str, int]] = []
        self.stop_in_eval_of = stop_in_eval_of
        self.evaluating: int | None = 0  # before step 1: the starting policy's (eval_on_start)

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self.events.append(("step", step))
        self.evaluating = step  # evaluations come right after their step

    def on_samples(self, step: int, samples: list[Any]) -> None:
        self.events.append(("samples", step))

    def on_eval(self, step: int, metrics: dict[str, float]) -> None:
        self.events.append(("eval", step))
        self.evaluating = None

    def on_checkpoint(self, step: int, path: Path) -> None:
        self.events.append(("checkpoint", step))
        self.evaluating = None

    def should_stop(self) -> bool:
        return self.stop_in_eval_of is not None and self.evaluating == self.stop_in_eval_of


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def untimed(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in items]


@pytest.mark.usefixtures("held_out_task")
def test_a_run_with_evaluation_trains_exactly_like_one_without(tmp_path: Path) -> None:
    plain = run_config(tmp_path, steps=3)
    evaluated = run_config(tmp_path, steps=3, eval_every=1, log_samples_every=1)
    train(plain, tmp_path / "plain")
    rec = Recorder()
    train(evaluated, tmp_path / "eval", callback=rec)
    assert untimed(rows(tmp_path / "eval" / "metrics.jsonl")) == untimed(
        rows(tmp_path / "plain" / "metrics.jsonl")
    )
    assert rows(tmp_path / "plain" / "eval.jsonl") == []
    assert [r["step"] for r in rows(tmp_path / "eval" / "eval.jsonl")] == [1, 2, 3]
    assert rec.events == [
        ("step", 1), ("samples", 1), ("eval", 1),
        ("step", 2), ("samples", 2), ("eval", 2), ("checkpoint", 2),
        ("step", 3), ("samples", 3), ("eval", 3), ("checkpoint", 3),
    ]  # fmt: skip
    samples = rows(tmp_path / "eval" / "samples.jsonl")
    assert [len(r["samples"]) for r in samples] == [4, 4, 4]  # log_samples_count's default
    first = samples[0]["samples"][0]
    assert first["prompt"].startswith("reverse ") and 0.0 <= first["reward"] <= 1.0


@pytest.mark.usefixtures("held_out_task")
def test_every_n_steps_and_after_the_last(tmp_path: Path) -> None:
    cfg = run_config(tmp_path, steps=5, eval_every=2, log_samples_every=2, log_samples_count=2)
    train(cfg, tmp_path / "out")
    assert [r["step"] for r in rows(tmp_path / "out" / "eval.jsonl")] == [2, 4, 5]
    samples = rows(tmp_path / "out" / "samples.jsonl")
    assert [(r["step"], len(r["samples"])) for r in samples] == [(2, 2), (4, 2)]


@pytest.mark.usefixtures("held_out_task")
def test_a_stop_during_an_evaluation_resumes_to_the_uninterrupted_files(tmp_path: Path) -> None:
    cfg = run_config(tmp_path, steps=4, checkpoint_every=4, eval_every=1, log_samples_every=1)
    train(cfg, tmp_path / "full")
    rec = Recorder(stop_in_eval_of=3)
    stopped = train(cfg, tmp_path / "part", callback=rec)
    assert stopped.stopped and stopped.step == 3
    assert rec.events[-3:] == [("step", 3), ("samples", 3), ("checkpoint", 3)]  # no eval 3
    resumed_rec = Recorder()
    resumed = train(cfg, tmp_path / "part", resume=True, callback=resumed_rec)
    assert resumed.step == 4 and not resumed.stopped
    assert resumed_rec.events[:2] == [("eval", 3), ("step", 4)]  # the owed evaluation first
    for name in ("metrics.jsonl", "eval.jsonl", "samples.jsonl"):
        assert untimed(rows(tmp_path / "part" / name)) == untimed(rows(tmp_path / "full" / name))


@pytest.mark.usefixtures("held_out_task")
def test_eval_on_start_scores_the_starting_policy_as_step_0(tmp_path: Path) -> None:
    cfg = run_config(tmp_path, steps=2, eval_every=2, eval_on_start=True)
    rec = Recorder()
    train(cfg, tmp_path / "full", callback=rec)
    assert rec.events[:2] == [("eval", 0), ("step", 1)]
    evals = rows(tmp_path / "full" / "eval.jsonl")
    assert [r["step"] for r in evals] == [0, 2]
    # the baseline is the untrained policy's: the same number a run without RL steps reports
    untrained = run_config(tmp_path, steps=1, eval_every=1, eval_on_start=True)
    train(untrained, tmp_path / "untrained")
    assert untimed(rows(tmp_path / "untrained" / "eval.jsonl"))[0] == untimed(evals)[0]

    stopping = Recorder(stop_in_eval_of=0)
    stopped = train(cfg, tmp_path / "part", callback=stopping)
    assert stopped.stopped and stopped.step == 0
    assert stopping.events == [("checkpoint", 0)]
    resumed = Recorder()
    train(cfg, tmp_path / "part", resume=True, callback=resumed)
    assert resumed.events[:2] == [("eval", 0), ("step", 1)]  # the owed baseline first
    for name in ("metrics.jsonl", "eval.jsonl"):
        assert untimed(rows(tmp_path / "part" / name)) == untimed(rows(tmp_path / "full" / name))


@pytest.mark.usefixtures("held_out_task")
def test_rows_past_the_checkpoint_are_dropped_on_resume(tmp_path: Path) -> None:
    """A run killed after writing steps 3-4 but before checkpointing step 4 resumes from step 2
    and writes steps 3-4 once more, not twice."""
    cfg = run_config(tmp_path, steps=4, checkpoint_every=2, eval_every=1, log_samples_every=1)
    train(cfg, tmp_path / "full")
    out = tmp_path / "killed"
    train(cfg, out)
    shutil.rmtree(out / "checkpoints" / "step-000004")
    shutil.rmtree(out / "final")
    with (out / "eval.jsonl").open("a") as f:
        f.write('{"step": 4, "eval_rew')  # torn by the kill
    train(cfg, out, resume=True)
    for name in ("metrics.jsonl", "eval.jsonl", "samples.jsonl"):
        assert untimed(rows(out / name)) == untimed(rows(tmp_path / "full" / name))


# -- bookkeeping, on known values -----------------------------------------------------------


def test_a_pass_is_full_credit_up_to_rounding(tmp_path: Path) -> None:
    assert PASS_REWARD == 1.0 - 1e-6
    task = HeldOutReverse()
    task.grade = lambda examples, completions: Grades(  # type: ignore[method-assign]
        [1.0 - 1e-6, 1.0 - 2e-6, 1.0, 0.5] * (len(completions) // 4), {}
    )
    cfg = run_config(tmp_path, eval_every=1, eval_samples=4)
    out = Evaluator(cfg, task, tiny(cfg)).evaluate(1)
    # per prompt: 2 of 4 samples pass (1 - 1e-6 is a pass, 1 - 2e-6 is not)
    assert out["eval_pass@1"] == pytest.approx(0.5)
    assert out["eval_pass@2"] == pytest.approx(1 - 1 / 6)  # 1 - C(2,2)/C(4,2)
    assert out["eval_pass@4"] == 1.0
    assert out["eval_reward_mean"] == pytest.approx((4 - 3e-6 - 0.5) / 4)
    assert out["eval_prompts"] == float(len(DIGITS))


def test_when_an_evaluation_is_due_and_owed(tmp_path: Path) -> None:
    cfg = run_config(tmp_path, eval_every=2, steps=5, eval_on_start=False)
    results = RunResults(cfg, tmp_path, HeldOutReverse(), tiny(cfg), Recorder())
    assert [s for s in range(-1, 6) if results.eval_due(s)] == [2, 4, 5]
    started = run_config(tmp_path, eval_every=2, steps=5, eval_on_start=True)
    with_start = RunResults(started, tmp_path, HeldOutReverse(), tiny(cfg), Recorder())
    assert [s for s in range(-1, 6) if with_start.eval_due(s)] == [0, 2, 4, 5]
    with_start.last_eval_step = 2
    assert [s for s in range(0, 6) if with_start.owes(s)] == [4, 5]
    with_start.last_eval_step = 1
    assert with_start.owes(2)
    plain = RunResults(config(), tmp_path, HeldOutReverse(), tiny(cfg), Recorder())
    assert plain.evaluator is None
    assert not any(plain.eval_due(s) for s in range(0, 6))


def test_truncating_result_rows_keeps_the_checkpoints_steps(tmp_path: Path) -> None:
    path = tmp_path / "eval.jsonl"
    assert last_row_step(path) == -1
    truncate_rows(path, 3)  # no file: nothing to do
    assert not path.exists()
    path.write_text('{"step": 0}\n{"step": 2}\nnot json\n{"x": 1}\n{"step": 3}\n{"step": 4}\n')
    assert last_row_step(path) == 4
    truncate_rows(path, 3)
    assert path.read_text() == '{"step": 0}\n{"step": 2}\n{"step": 3}\n'
    assert last_row_step(path) == 3
    truncate_rows(path, -1)
    assert path.read_text() == ""
    assert last_row_step(path) == -1


def test_a_text_of_exactly_the_limit_is_not_cut() -> None:
    sample = make_sample(Example("p" * 10, "a" * 9), "c" * 11, 1, chars=10)
    assert (sample["prompt"], sample["answer"], sample["completion"]) == (
        "p" * 10,
        "a" * 9,
        "c" * 10,
    )
    assert sample["truncated"] is True and sample["reward"] == 1.0
    assert make_sample(Example("p" * 10, "a"), "c", 0.0, chars=10)["truncated"] is False
    assert make_sample(Example("p", "a" * 11), "c", 0.0, chars=10)["truncated"] is True
    assert make_sample(Example("p" * 11, "a"), "c", 0.0, chars=10)["truncated"] is True
