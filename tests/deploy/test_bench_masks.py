"""bench/masks.py prints `core.experiments.report`'s numbers: the summary per mask and the paired
comparison with the baseline (the statistics themselves are tested in
tests/core/test_experiments_stats.py)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.masks import paired_table, summary_table  # noqa: E402
from core.experiments import report  # noqa: E402


def rows(rewards: list[float], masked: float, step_time: float = 0.5) -> list[dict[str, float]]:
    return [
        {"step": float(i + 1), "reward_mean": r, "masked_fraction": masked, "step_time": step_time}
        for i, r in enumerate(rewards)
    ]


LATE = [0.0] * 10 + [1.0] * 10  # reaches 0.8 at step 14, final 1.0
EARLY = [0.0] * 5 + [1.0] * 15  # at step 9, final 1.0
NEVER = [0.5] * 20  # never, final 0.5
RUNS = {
    "base": {0: rows(LATE, 0.25), 1: rows(LATE, 0.25), 2: rows(NEVER, 0.25)},
    "other": {0: rows(EARLY, 0.5, 1.0), 1: rows(EARLY, 0.5, 1.0), 2: rows(LATE, 0.5, 1.0)},
}


def test_summary_table_shows_the_reports_numbers() -> None:
    rep = report(RUNS, baseline="base", threshold=0.8)
    times = report(RUNS, metric="step_time", baseline="base", final_fraction=1.0)
    lines = summary_table(rep, times).splitlines()
    assert lines[0].split() == [
        "mask",
        "final",
        "reward",
        "steps",
        "to",
        "0.80",
        "masked",
        "frac",
        "s/step",
    ]
    # base: finals 1, 1, 0.5; reached at 14, 14 (2 of 3); other: 9, 9, 14 (the lower median 9)
    assert lines[2].split() == [
        "base",
        "1.000",
        "[0.500,1.000]",
        "14",
        "(2/3",
        "hit)",
        "0.2500",
        "0.500",
    ]
    assert lines[3].split() == [
        "other",
        "1.000",
        "[1.000,1.000]",
        "9",
        "(3/3",
        "hit)",
        "0.5000",
        "1.000",
    ]


def test_paired_table_compares_seed_by_seed_with_the_baseline() -> None:
    rep = report(RUNS, baseline="base", threshold=0.8)
    line = paired_table(rep).splitlines()[-1].split()
    # final: 0, 0, +0.5 -> mean +0.167, one win and two ties (p = 1); resampling {0, 0, 0.5}:
    # a mean of 0 and one of 0.5 each have chance 8/27 and 1/27; masked +0.25 on every seed;
    # seed 2 reached the threshold in "other" only
    assert line == [
        "other",
        "3",
        "+0.167",
        "[+0.000,+0.500]",
        "1/0/2",
        "1.000",
        "+0.2500",
        "[+0.2500,+0.2500]",
        "2/1/0",
    ]
    assert len(paired_table(rep).splitlines()) == 3  # the baseline is not compared with itself


def test_held_out_evaluations_join_the_rows_of_their_steps() -> None:
    from bench.masks import join_evals

    metrics = [{"reward_mean": 0.1}, {"reward_mean": 0.2}, {"reward_mean": 0.3}]
    join_evals(
        metrics,
        [
            {"step": 0, "eval_reward_mean": 0.25},
            {"step": 3, "eval_reward_mean": 0.5},
            {"step": 9, "eval_reward_mean": 0.9},  # past the rows: a run cut short
        ],
    )
    assert metrics == [
        {"reward_mean": 0.1, "start_eval_reward_mean": 0.25},
        {"reward_mean": 0.2},
        {"reward_mean": 0.3, "eval_reward_mean": 0.5},
    ]


def test_held_out_table_compares_the_last_rows_seed_by_seed() -> None:
    from bench.masks import held_out

    def run(value: float) -> list[dict[str, float]]:
        return [
            {"step": 1.0, "reward_mean": 0.0},
            {"step": 2.0, "reward_mean": 0.0, "eval_reward_mean": value},
        ]

    runs = {
        "dppo topK-TV": {0: run(0.30), 1: run(0.40), 2: run(0.50)},
        "predictive topK-TV": {0: run(0.35), 1: run(0.45), 2: run(0.45)},
    }
    table = held_out(runs, "dppo topK-TV", "eval_reward_mean").splitlines()
    base = next(line for line in table if line.startswith("dppo topK-TV"))
    pred = next(line for line in table if line.startswith("predictive topK-TV"))
    assert "0.400 [0.300, 0.500]" in base
    assert "0.450 [0.350, 0.450]" in pred
    # differences +0.05, +0.05, -0.05: mean +0.017, 2 won, 1 lost, sign test p = 1.0
    compared = table[-1].split()
    assert compared[:3] == ["predictive", "topK-TV", "3"]
    assert compared[3] == "+0.017"
    assert compared[5:7] == ["2/1/0", "1.000"]


def test_chat_setting_starts_every_mask_of_a_seed_from_its_warmed_up_model() -> None:
    import argparse

    from bench.masks import VARIANTS, base_config, warm_config

    args = argparse.Namespace(
        setting="chat-math",
        out=Path("/tmp/bench-out"),
        first_seed=3,
        shared_warmup=False,
        rollout_dtype="bfloat16",
        staleness=2,
        engine="vllm",
        kind="tv",
        delta=0.05,
        minibatches=1,
        lr=3e-4,
        steps=60,
        eval_samples=16,
        model=Path("/tmp/bench-out/model"),
        warmup=400,
    )
    a = base_config(args, 4, VARIANTS["dppo topK-TV"])
    b = base_config(args, 4, VARIANTS["predictive topK-TV"])
    assert a["model"] == b["model"] == {"name": "hf:/tmp/bench-out/warm/seed4"}
    assert "warmup_steps" not in a["task"]  # warmed up once, before
    assert (a["eval_every"], a["eval_on_start"], a["eval_samples"]) == (60, True, 16)
    assert (a["algorithm"]["delta_low"], a["algorithm"]["mask"]) == (0.05, "dppo")
    assert (a["rollout"]["dtype"], a["rollout"]["staleness"]) == ("bfloat16", 2)
    args.shared_warmup, args.warmup_seed = True, 3  # main's default: the first seed
    assert base_config(args, 4, VARIANTS["dppo topK-TV"])["model"]["name"].endswith("seed3")
    args.warmup_seed = 0  # a later invocation's seeds start from an earlier one's warm-up
    assert base_config(args, 4, VARIANTS["dppo topK-TV"])["model"]["name"].endswith("seed0")
    args.warmup_seed = 3
    warm = warm_config(args, 3)
    assert warm["model"] == {"name": "hf:/tmp/bench-out/model"}
    assert (warm["task"]["warmup_steps"], warm["rollout"]["engine"]) == (400, "hf")


def test_held_out_table_counts_the_seeds_that_collapsed_and_the_corrections_shares() -> None:
    from bench.masks import held_out

    def run(start: float, end: float, dropped: float = 0.0) -> list[dict[str, float]]:
        first = {"step": 1.0, "start_eval_reward_mean": start}
        if dropped:  # a correction's run: its two shares on the steps that have them
            first["correction_masked_fraction"] = dropped
            return [
                first,
                {"step": 2.0, "eval_reward_mean": end, "correction_clipped_fraction": 0.25},
            ]
        return [first, {"step": 2.0, "eval_reward_mean": end}]

    # a fall of exactly the margin is not a collapse, one just past it is; so is a non-finite end
    runs = {
        "dppo topK-TV": {0: run(0.30, 0.25), 1: run(0.30, 0.2499), 2: run(0.30, 0.35)},
        "none": {0: run(0.30, 0.10), 1: run(0.30, float("nan")), 2: run(0.30, 0.2501)},
        "icepop": {0: run(0.30, 0.30, dropped=0.5), 1: run(0.30, 0.30, dropped=0.1)},
    }
    table = held_out(runs, "dppo topK-TV", "eval_reward_mean").splitlines()
    assert table[0].split()[-5:] == ["collapsed", "corr.", "dropped", "corr.", "clipped"]
    line = {row.split()[0]: row.split() for row in table[2:5]}
    assert line["dppo"][-3:] == ["1/3", "0.0000", "0.0000"]
    assert line["none"][-3:] == ["2/3", "0.0000", "0.0000"]
    # the means over every step of both seeds, a step without the key counting 0:
    # (0.5 + 0 + 0.1 + 0) / 4 dropped, (0 + 0.25 + 0 + 0.25) / 4 clipped
    assert line["icepop"][-3:] == ["0/2", "0.1500", "0.1250"]


def test_runs_saved_midway_are_read_back_for_a_resumed_comparison(tmp_path: Path) -> None:
    from bench.masks import load_runs, save_runs

    path = tmp_path / "runs.json"
    assert load_runs(path) == {}
    runs = {"tis": {3: rows([0.5], 0.1)}, "none": {3: rows([0.25], 0.0), 11: rows([1.0], 0.0)}}
    save_runs(path, runs)
    assert load_runs(path) == runs  # seeds are ints again, not JSON's strings
    assert not path.with_suffix(".json.tmp").exists()


def test_every_arm_is_a_valid_algorithm_section_and_the_corrections_reach_it() -> None:
    import argparse

    from bench.masks import VARIANTS, base_config
    from core.config import TrainConfig

    args = argparse.Namespace(
        setting="reverse",
        engine="hf",
        warmup=50,
        rollout_dtype="bfloat16",
        staleness=4,
        minibatches=4,
        lr=3e-3,
        steps=40,
    )
    types = {}
    for name, algorithm in VARIANTS.items():
        cfg = TrainConfig.model_validate(base_config(args, 0, algorithm))
        types[name] = (cfg.algorithm.mask, cfg.algorithm.correction.type)
    assert types["tis"] == ("none", "tis")
    assert types["icepop"] == ("none", "icepop")
    assert types["dppo topK-TV + tis"] == ("dppo", "tis")
    assert types["dppo topK-TV"] == ("dppo", "none")


def test_the_figures_curves_are_running_means_over_the_last_five_steps() -> None:
    from bench.masks import smoothed

    assert smoothed([5.0, 1.0, 3.0, 0.0, 1.0, 10.0, 0.0]) == [5.0, 3.0, 3.0, 2.25, 2.0, 3.0, 2.8]
    assert smoothed([]) == []
