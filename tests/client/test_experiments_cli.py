"""`pdppo experiment ... --follow` and `pdppo experiments ...` against the real stack, and the
CLI's own parsing and table (known values)."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from pdppo.cli import main
from pdppo.commands.experiments import parse_grid, report_lines
from tests.support.specs import smoke_spec, write_spec


def _run(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, args, env=env, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_grid_values_are_yaml_scalars() -> None:
    grid = parse_grid(("algorithm.mask=predictive,dppo", "algorithm.delta_high=0.1, 2,true,null"))
    assert grid == {
        "algorithm.mask": ["predictive", "dppo"],
        "algorithm.delta_high": [0.1, 2, True, None],
    }
    with pytest.raises(click.UsageError, match="PATH=VALUE"):
        parse_grid(("algorithm.mask",))
    with pytest.raises(click.UsageError, match="PATH=VALUE"):
        parse_grid(("algorithm.mask=",))


def test_report_table_shows_each_arm_against_the_baseline() -> None:
    arm = {
        "final": {"median": 0.5, "min": 0.25, "max": 0.75, "per_seed": {}},
        "steps_to_threshold": {"reached": 1, "of": 2, "median": 4, "per_seed": {}},
        "masked_fraction": {"mean": 0.125, "per_seed": {}},
    }
    report = {
        "metric": "reward_mean",
        "baseline": "mask=dppo",
        "threshold": 0.3,
        "paired_seeds": [0, 1],
        "arms": [
            {"name": "mask=dppo", **arm, "vs_baseline": None},
            {
                "name": "mask=predictive",
                **arm,
                "vs_baseline": {
                    "mean_diff": -0.0625,
                    "ci95": [-0.125, 0.0],
                    "per_seed": {},
                    "sign_test": {"wins": 0, "losses": 2, "ties": 0, "p_value": 0.5},
                },
            },
        ],
    }
    lines = report_lines(report)
    assert lines[0].split() == [
        "ARM",
        "FINAL",
        "reward_mean",
        "REACHED",
        "MASKED",
        "VS",
        "BASELINE",
        "SIGN",
    ]
    assert lines[1].split() == [
        "mask=dppo",
        "0.500",
        "[0.250,",
        "0.750]",
        "1/2",
        "0.125",
        "(baseline)",
    ]
    assert "-0.062 [-0.125, 0.000]" in lines[2] and "0-2-0 p=0.500" in lines[2]
    assert lines[-1] == "paired seeds: 0, 1; baseline mask=dppo"
    # an arm whose comparison says nothing gets the report's reason under the table
    report["arms"][1]["vs_baseline"]["note"] = "identical to the baseline on every paired seed"
    assert report_lines(report)[-2:] == [
        "paired seeds: 0, 1; baseline mask=dppo",
        "mask=predictive: identical to the baseline on every paired seed",
    ]


def test_experiment_follow_reports_and_the_experiments_commands(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    spec = write_spec(tmp_path / "base.yaml", smoke_spec(steps=3))
    args = ["experiment", str(spec), "--grid", "algorithm.mask=predictive,dppo", "--seeds", "2"]
    code, out, err = _run([*args, "--name", "cli", "--follow"], cli_env)
    assert code == 0, (out, err)
    exp_id, status = out.strip().splitlines()[-1].split()
    assert status == "succeeded"
    assert f"submitted {exp_id}: 2 arms x 2 seeds" in err
    assert "mask=dppo: 2 succeeded; steps 6/6" in err  # the last progress line of an arm
    table = out.strip().splitlines()
    assert table[0].startswith("ARM") and "(baseline)" in table[1]
    assert table[1].startswith("mask=predictive") and table[2].startswith("mask=dppo")
    assert table[3] == "paired seeds: 0, 1; baseline mask=predictive"

    code, out, _ = _run(["experiments", "list"], cli_env)
    assert code == 0 and any(line.startswith(f"{exp_id}  succeeded") for line in out.splitlines())
    code, out, _ = _run(["experiments", "show", exp_id], cli_env)
    assert code == 0 and out.count("  seed ") == 4 and "cli" in out.splitlines()[0]
    code, out, _ = _run(["experiments", "report", exp_id, "--csv"], cli_env)
    assert code == 0 and "mask=dppo" in out and "arm" in out.splitlines()[0]
    code, out, _ = _run(
        ["experiments", "report", exp_id, "--json", "--baseline", "mask=dppo"], cli_env
    )
    assert code == 0 and json.loads(out)["baseline"] == "mask=dppo"
    code, out, _ = _run(["experiments", "delete", exp_id], cli_env)
    assert code == 0 and out.strip() == f"{exp_id} deleted"
