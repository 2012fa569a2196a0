"""`pdppo train` runs of the tiny model reported to the real trackers, read back with each
tool's reader: TensorBoard's event files, a local MLflow server (`conftest.mlflow_server`) through
`mlflow.MlflowClient`, W&B's offline run files. Every step's every metric reads back equal to
the run's own `metrics.jsonl`; a resumed run continues the same tracker runs with each step once."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.mlflow import MlflowServer
from tests.support.stack import REPO, pdppo_command
from tests.support.trainer_runs import TIMING
from tests.tracking.readers import tensorboard_scalars, tensorboard_texts, wandb_history

pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")
pytest.importorskip("wandb")


def spec(tmp_path: Path, steps: int, report_to: list[str]) -> Path:
    data: dict[str, Any] = yaml.safe_load((REPO / "examples" / "smoke.yaml").read_text())
    data["train"].update(steps=steps, report_to=report_to, log_samples_every=2)
    path = tmp_path / f"spec-{steps}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def pdppo_train(
    spec_path: Path, out: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    import os

    done = subprocess.run(
        [*pdppo_command(), "train", str(spec_path), "--out", str(out), "--quiet", *args],
        cwd=REPO,
        env={**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", **env},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def metrics_rows(out: Path) -> dict[int, dict[str, float]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {int(row["step"]): {k: v for k, v in row.items() if k != "step"} for row in rows}


def f32(value: float) -> float:
    """TensorBoard keeps scalars as 32-bit floats."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


def mlflow_history(server: MlflowServer, run_id: str) -> dict[str, list[tuple[int, float]]]:
    from mlflow import MlflowClient

    client = MlflowClient(server.url)
    keys = client.get_run(run_id).data.metrics
    return {
        key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        for key in keys
    }


def test_one_run_reported_to_all_three(tmp_path: Path, mlflow_server: MlflowServer) -> None:
    out = tmp_path / "run"
    env = {"PDPPO_MLFLOW_TRACKING_URI": mlflow_server.url, "PDPPO_MLFLOW_EXPERIMENT": "t1"}
    done = pdppo_train(spec(tmp_path, 4, ["tensorboard", "mlflow", "wandb"]), out, env)
    rows = metrics_rows(out)
    assert sorted(rows) == [1, 2, 3, 4]
    state = json.loads((out / "tracking.json").read_text())
    assert sorted(state) == ["mlflow", "tensorboard", "wandb"]
    run_id = state["mlflow"]["run_id"]
    assert state["mlflow"]["url"] == f"{mlflow_server.url}/#/experiments/1/runs/{run_id}"
    assert f"reporting to mlflow: {state['mlflow']['url']}" in done.stdout + done.stderr

    # TensorBoard: every metric of every step, as 32-bit floats
    scalars = tensorboard_scalars(out / "tensorboard")
    assert scalars == {
        f"train/{key}": [(step, f32(rows[step][key])) for step in sorted(rows)] for key in rows[1]
    }
    texts = tensorboard_texts(out / "tensorboard")
    assert [step for step, _ in texts["samples/text_summary"]] == [2, 4]
    assert [step for step, _ in texts["events/checkpoint/text_summary"]] == [2, 4]
    assert '"optim.lr": 0.001' in texts["config/text_summary"][0][1]

    # MLflow: the round trip, exact
    history = mlflow_history(mlflow_server, run_id)
    assert history == {
        f"train/{key}": [(step, rows[step][key]) for step in sorted(rows)] for key in rows[1]
    }
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_server.url)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params["optim.lr"] == "0.001" and run.data.params["steps"] == "4"
    samples = [a.path for a in client.list_artifacts(run_id, "samples")]
    assert samples == ["samples/00000002.json", "samples/00000004.json"]

    # W&B, offline: one history row per step, equal
    wandb_rows = wandb_history(out / "wandb")
    assert [row["_step"] for row in wandb_rows if "train/loss" in row] == [1, 2, 3, 4]
    for row in wandb_rows:
        if "train/loss" in row:
            assert {k: row[f"train/{k}"] for k in rows[1]} == rows[row["_step"]]


def test_resumed_run_continues_each_tracker_run_without_duplicates(
    tmp_path: Path, mlflow_server: MlflowServer
) -> None:
    """Killed after step 5 was reported but before its checkpoint: the run resumes from step 4's
    and trains step 5 again. Each tracker holds steps 1 to 6 once, in one run."""
    out = tmp_path / "run"
    env = {"PDPPO_MLFLOW_TRACKING_URI": mlflow_server.url, "PDPPO_MLFLOW_EXPERIMENT": "t2"}
    trackers = ["tensorboard", "mlflow", "wandb"]
    pdppo_train(spec(tmp_path, 5, trackers), out, env)
    first = json.loads((out / "tracking.json").read_text())
    assert first["mlflow"]["delivered"]["step"] == 5
    shutil.rmtree(out / "checkpoints" / "step-000005")  # as if killed before it was written
    shutil.rmtree(out / "final")
    done = pdppo_train(spec(tmp_path, 6, trackers), out, env, "--resume")
    assert "resumed from" in done.stdout + done.stderr
    second = json.loads((out / "tracking.json").read_text())
    assert {name: run["run_id"] for name, run in second.items()} == {
        name: run["run_id"] for name, run in first.items()
    }
    rows = metrics_rows(out)
    assert sorted(rows) == [1, 2, 3, 4, 5, 6]

    # every metric of every step once, equal to the run's own: a retrained step is the same,
    # but for its timings (which tracker kept which attempt's differs)
    keys = sorted(set(rows[1]) - TIMING)
    scalars = tensorboard_scalars(out / "tensorboard")
    assert sorted(scalars) == sorted(f"train/{key}" for key in rows[1])
    history = mlflow_history(mlflow_server, second["mlflow"]["run_id"])
    assert sorted(history) == sorted(scalars)
    for key in rows[1]:
        assert [step for step, _ in scalars[f"train/{key}"]] == [1, 2, 3, 4, 5, 6]
        assert [step for step, _ in history[f"train/{key}"]] == [1, 2, 3, 4, 5, 6]
    for key in keys:
        expected = [(step, rows[step][key]) for step in sorted(rows)]
        assert scalars[f"train/{key}"] == [(step, f32(value)) for step, value in expected]
        assert history[f"train/{key}"] == expected
    wandb_rows = [row for row in wandb_history(out / "wandb") if "train/loss" in row]
    assert [row["_step"] for row in wandb_rows] == [1, 2, 3, 4, 5, 6]
    for row in wandb_rows:
        assert {k: row[f"train/{k}"] for k in keys} == {k: rows[row["_step"]][k] for k in keys}
