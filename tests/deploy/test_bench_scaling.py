"""bench/scaling.py compares fairly: configurations interleaved round by round, every run on the
same cores, medians with their spread and the speedup paired within each round."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.scaling import Config, Run, interleaved, parse_cores, report  # noqa: E402

ONE, TWO, FSDP = Config(1, "replicate"), Config(2, "replicate"), Config(2, "fsdp")


def test_runs_are_interleaved_round_by_round() -> None:
    assert interleaved([ONE, TWO, FSDP], 2) == [
        (0, ONE),
        (0, TWO),
        (0, FSDP),
        (1, ONE),
        (1, TWO),
        (1, FSDP),
    ]


@pytest.mark.parametrize(
    ("raw", "cores"),
    [(None, [0, 1, 2, 3]), ("2", [0, 1]), ("1,3", [1, 3]), ("3,", [3]), ("4", [0, 1, 2, 3])],
)
def test_parse_cores(raw: str | None, cores: list[int]) -> None:
    assert parse_cores(raw, {0, 1, 2, 3}) == cores


@pytest.mark.parametrize("raw", ["5", "0", "4,5"])
def test_parse_cores_refuses_cores_it_does_not_have(raw: str) -> None:
    with pytest.raises(SystemExit, match="--cores"):
        parse_cores(raw, {0, 1, 2, 3})


def run(step: float, tokens: float) -> Run:
    return Run(step=step, rollout=step / 2, update=step / 4, tokens_per_s=tokens, wall=10.0)


def test_report_gives_medians_spread_and_paired_speedups() -> None:
    # round 2 ran on a busier machine: both configurations slowed alike, the ratio held
    runs = {
        (0, ONE): run(1.0, 100.0),
        (0, TWO): run(0.5, 200.0),
        (1, ONE): run(2.0, 50.0),
        (1, TWO): run(1.0, 100.0),
        (2, ONE): run(1.2, 80.0),
        (2, TWO): run(0.8, 120.0),
    }
    assert report([ONE, TWO], runs, 3) == [
        "--nproc 1: step 1.200 s (runs 1.000-2.000; rollout 0.600, update 0.300), 80 tokens/s",
        "--nproc 2: step 0.800 s (runs 0.500-1.000; rollout 0.400, update 0.200), 120 tokens/s, "
        "x2.00 of one process (rounds 1.500-2.000)",
    ]
