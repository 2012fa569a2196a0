"""bench/regimes.py's collapse criterion, its mismatch figures and its regime table, on known
values (the runs themselves are the bench's, bench/results/regimes-*.txt)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.regimes import (  # noqa: E402
    Regime,
    arm_row,
    breaks,
    collapsed,
    earlier_runs,
    parse_regime,
    regime_table,
    run_summary,
    start_and_end,
    step_figures,
)


def test_a_run_collapses_when_its_end_falls_more_than_the_margin_below_its_start() -> None:
    assert not collapsed(0.30, 0.30)
    assert not collapsed(0.30, 0.26)  # 0.04 down: within the 0.05 margin
    assert collapsed(0.30, 0.24)  # 0.06 down
    assert not collapsed(0.30, 0.24, margin=0.1)
    assert collapsed(0.30, math.nan)
    assert collapsed(math.inf, 0.5)


def test_start_and_end_read_the_held_out_evaluations_or_the_training_reward() -> None:
    rows = [{"reward_mean": float(i) / 20} for i in range(20)]
    rows[0]["start_eval_reward_mean"] = 0.31
    rows[-1]["eval_reward_mean"] = 0.22
    assert start_and_end(rows, held_out=True) == (0.31, 0.22)
    # training reward: the first step's, and the mean of the last 10% (steps 19, 20: 0.9, 0.95)
    start, end = start_and_end(rows, held_out=False)
    assert start == 0.0 and end == pytest.approx(0.925)
    # a run stopped before its last evaluation has no end: it collapsed
    assert math.isnan(start_and_end(rows[:-1], held_out=True)[1])
    summary = run_summary(rows[:-1], held_out=True, error=None)
    assert summary["collapsed"] and summary["start"] == 0.31


def test_step_figures_measure_the_log_ratio_and_the_masks_that_would_fire() -> None:
    # four tokens, mu(a) = 0.5 each; pi(a) = 0.5 * ratio
    ratio = torch.tensor([1.0, 1.5, 0.5, 1.1])
    log_ratio = ratio.log()
    mu = torch.full((4,), 0.5).log()
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    f = step_figures(log_ratio, mu, adv)
    assert f["log_ratio_mean"] == pytest.approx(float(log_ratio.double().mean()))
    assert f["log_ratio_std"] == pytest.approx(float(log_ratio.double().std()))
    assert f["log_ratio_p01"] == pytest.approx(float(torch.quantile(log_ratio.double(), 0.01)))
    assert f["log_ratio_p99"] == pytest.approx(float(torch.quantile(log_ratio.double(), 0.99)))
    # PPO clip (0.2): token 2 (A > 0, ratio 1.5) and token 3 (A < 0, ratio 0.5)
    assert f["would_clip_ppo"] == pytest.approx(0.5)
    # DPPO binary TV |pi - mu| > 0.15: tokens 2 (0.25) and 3 (0.25), both moving away
    assert f["would_mask_dppo_binary"] == pytest.approx(0.5)
    # token 3 with A > 0 moves pi(a) back toward mu(a): DPPO keeps it, PPO's clip too
    f = step_figures(log_ratio, mu, torch.tensor([1.0, 1.0, 1.0, -1.0]))
    assert f["would_clip_ppo"] == pytest.approx(0.25)
    assert f["would_mask_dppo_binary"] == pytest.approx(0.25)


def run(start: float, end: float, std: float, error: str | None = None) -> dict:
    rows = [{"reward_mean": start, "log_ratio_std": std}] + [{"reward_mean": end}] * 9
    return run_summary(rows, held_out=False, error=error)


def test_the_regime_table_counts_collapses_and_shows_the_medians() -> None:
    runs = [
        run(0.5, 0.1, 0.2),
        run(0.5, 0.5, 0.4),
        run(0.5, 0.52, 0.6, "non-finite"),
        run(0.5, 0.6, 0.8),
    ]
    row = arm_row("s4-mb4-bf16-lrx1", "none", runs)
    assert row["collapsed"] == 2 and row["seeds"] == 4 and breaks(row)
    assert row["delta_median"] == pytest.approx(0.01)  # of -0.4, 0.0, 0.02, 0.1
    assert (row["delta_min"], row["delta_max"]) == (pytest.approx(-0.4), pytest.approx(0.1))
    assert row["log_ratio_std"] == pytest.approx(0.5)  # of 0.2, 0.4, 0.6, 0.8
    other = arm_row("s4-mb4-bf16-lrx1", "dppo topK-TV", runs[1:2])
    assert not breaks(other)
    lines = regime_table([row, other]).splitlines()
    assert lines[0].split()[:4] == ["regime", "arm", "collapsed", "start"]
    cells = lines[2].split()
    assert cells[:6] == ["s4-mb4-bf16-lrx1", "none", "2/4*", "0.500", "+0.010", "[-0.400,+0.100]"]
    assert cells[7] == "0.5000"  # lr std
    assert lines[3].split()[:5] == ["s4-mb4-bf16-lrx1", "dppo", "topK-TV", "0/1", "0.500"]


def test_regimes_are_named_and_parsed_back() -> None:
    regime = Regime(8, 8, "fp16", "x10")
    assert regime.name == "s8-mb8-fp16-lrx10"
    assert parse_regime(regime.name) == regime
    assert parse_regime("s4-mb4-bf16-lrx3.3") == Regime(4, 4, "bf16", "x3.3")
    for bad in ("s4-mb4-int8-lrx1", "s4-mb4-bf16-lrx2", "stale4"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_regime(bad)


def test_earlier_runs_join_with_other_seeds_of_the_same_regime_and_arms(tmp_path: Path) -> None:
    def entry(regime: str, arm: str, seed: int) -> dict:
        return {"regime": regime, "arm": arm, "seed": seed, "start": 0.3, "end": 0.2}

    old = tmp_path / "a.json"
    old.write_text(
        json.dumps(
            {
                "runs": [
                    entry("s4-mb4-bf16-lrx1", "none", 0),
                    entry("s4-mb4-bf16-lrx1", "none", 4),  # this invocation's seed: its own
                    entry("s4-mb4-bf16-lrx1", "ppo_clip", 1),  # not an arm here
                    entry("s8-mb8-fp16-lrx10", "none", 1),  # another regime
                ]
            }
        )
    )
    again = tmp_path / "b.json"
    again.write_text(json.dumps({"runs": [entry("s4-mb4-bf16-lrx1", "none", 0)]}))
    got = earlier_runs([old, again], "s4-mb4-bf16-lrx1", ["none", "dppo topK-TV"], range(4, 8))
    assert [(r["arm"], r["seed"]) for r in got] == [("none", 0)]
