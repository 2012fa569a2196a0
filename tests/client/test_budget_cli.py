"""Dry runs: `pdppo train --dry-run` (local, no service), `pdppo submit --dry-run` and
`Client.validate` (the API's `POST /v1/jobs:validate`) print or return the estimate and exit 1
when the job would not fit its queue."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pdppo.cli import main
from pdppo.client import ApiError, Client
from tests.support.specs import parked_spec, smoke_spec, write_spec

TINY_13B = {"tiny": {"d_model": 4096, "n_layers": 64, "n_heads": 64, "max_seq_len": 8192}}


def _run(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, args, env=env or {}, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def _big(queue: str) -> dict[str, Any]:
    return {"name": "big", "resources": {"device": queue}, "train": {"model": TINY_13B}}


def test_train_dry_run_prints_the_estimate_and_fits(tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "smoke.yaml", smoke_spec())
    code, out, err = _run(["train", "--dry-run", str(spec), "--out", str(tmp_path / "out")])
    assert code == 0, (out, err)
    lines = out.splitlines()
    assert "parameters       46.6K (46,560)" in lines
    assert "trainable        46.6K (46,560)" in lines
    assert "tokens/step      272 (272) = 16 sequences x 17 tokens (prompt <= 13)" in lines
    assert "total tokens     2.2K (2,176) over 8 steps" in lines
    assert any(line.startswith("peak memory      ") for line in lines)
    assert any(line.split()[:2] == ["weights", "182"] for line in lines)  # 4 * 46,560 bytes
    assert any(line.split()[0] == "optimizer" for line in lines)
    assert (
        "limits (cpu queue): memory 12 GiB, parameters 1B, tokens/step 16M, total tokens 50B"
        in lines
    )
    assert lines[-1] == "fits the cpu queue's limits"
    assert not (tmp_path / "out").exists()  # nothing trained, nothing written


def test_train_dry_run_exits_1_over_budget(tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "big.yaml", _big("cpu"))
    code, out, err = _run(["train", "--dry-run", str(spec)])
    assert code == 1
    assert "parameters       12.9B (12,926,066,688)" in out
    assert err.splitlines() == [
        "over budget: train.model.tiny: the job would need about 241 GiB of memory "
        "(limit 12 GiB on cpu workers)",
        "over budget: train.model.tiny: the model has about 12.9B parameters "
        "(limit 1B on cpu workers)",
    ]


def test_train_dry_run_reads_the_limits_from_the_environment(tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "smoke.yaml", smoke_spec())
    code, out, err = _run(
        ["train", "--dry-run", str(spec)], {"PDPPO_MAX_JOB_MEMORY_GB_CPU": "0.001"}
    )
    assert code == 1
    assert "limits (cpu queue): memory 1 MiB," in out
    assert err.startswith("over budget: ") and err.rstrip().endswith(
        "of memory (limit 1 MiB on cpu workers)"
    )


def test_submit_dry_run_asks_the_server_and_submits_nothing(
    tmp_path: Path, cli_env: dict[str, str], client: Client
) -> None:
    before = [job.id for job in client.list(limit=100).items]
    fits = write_spec(tmp_path / "smoke.yaml", parked_spec("dry"))
    code, out, err = _run(["submit", "--dry-run", str(fits)], cli_env)
    assert code == 0, (out, err)
    assert "parameters       46.6K (46,560)" in out.splitlines()
    assert "limits (gpu queue): memory 70 GiB," in out
    assert out.splitlines()[-1] == "the server would take it (gpu queue)"

    big = write_spec(tmp_path / "big.yaml", _big("gpu"))
    code, out, err = _run(["submit", "--dry-run", str(big)], cli_env)
    assert code == 1
    assert err.startswith("refused: train.model.tiny: the job would need about ")
    assert "(limit 70 GiB on gpu workers)" in err
    assert [job.id for job in client.list(limit=100).items] == before

    code, _, err = _run(["submit", "--dry-run", "--follow", str(fits)], cli_env)
    assert code == 2 and "--dry-run submits nothing to follow" in err


def test_client_validate(client: Client) -> None:
    fits = client.validate(parked_spec("validate"))
    assert fits.ok and fits.problems == []
    assert fits.estimate["params"] == 46_560 and fits.estimate["tokens_per_step"] == 272
    assert fits.limits["queue"] == "gpu"

    over = client.validate(_big("cpu"))
    assert not over.ok
    assert [(p.field, p.kind) for p in over.problems] == [
        ("train.model.tiny", "memory"),
        ("train.model.tiny", "params"),
    ]
    assert over.problems[1].estimate == 12_926_066_688
    assert over.problems[1].limit == 1_000_000_000

    with pytest.raises(ApiError) as info:
        client.validate({"train": {"stepz": 1}})
    assert info.value.status_code == 422 and "train.stepz" in str(info.value.detail)
