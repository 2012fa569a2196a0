"""`task.name: reasoning_gym` through the real stack (redis-server, `pdppo serve`, a `pdppo
worker`): a spec naming an unknown dataset, an unknown config key or a value the dataset's config
class refuses is turned away by the API (422), `pdppo submit --dry-run` and `pdppo train`, each
naming the field; and a job trains on generated rows and evaluates on the held-out ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pdppo.cli import main
from pdppo.client import ApiError, Client
from tests.support.specs import smoke_spec, write_spec

SPELL = {"min_word_len": 3, "max_word_len": 3}


def _spec(**task: Any) -> dict[str, Any]:
    """builtin:tiny on spell_backward: byte prompts of about 55 characters."""
    spec = smoke_spec(steps=2, checkpoint_every=0)
    spec["name"] = "rg"
    spec["train"]["model"]["tiny"]["max_seq_len"] = 80
    spec["train"]["task"] = {"name": "reasoning_gym", "size": 20, "validation_size": 4, **task}
    return spec


REFUSED = [
    pytest.param(
        {"dataset": "spell_backwards"},
        "task.dataset='spell_backwards' is not a reasoning-gym dataset; did you mean "
        "spell_backward?",
        id="unknown-dataset",
    ),
    pytest.param(
        {"dataset": "spell_backward", "config": {"max_len": 3}},
        "task.config.max_len: spell_backward has no such key; did you mean max_word_len? "
        "(its keys: min_word_len, max_word_len, data_file)",
        id="unknown-key",
    ),
    pytest.param(
        {"dataset": "spell_backward", "config": {"min_word_len": 5, "max_word_len": 3}},
        "task.config: spell_backward refuses it: max_word_len must be >= min_word_len",
        id="bad-value",
    ),
]


def _run(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, args, env=env or {}, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(("task", "message"), REFUSED)
def test_the_api_refuses_it_with_422_naming_the_field(
    client: Client, task: dict[str, Any], message: str
) -> None:
    with pytest.raises(ApiError) as info:
        client.submit(_spec(**task))
    assert info.value.status_code == 422
    assert message in str(info.value.detail), info.value.detail


@pytest.mark.parametrize(("task", "message"), REFUSED)
def test_submit_dry_run_refuses_it(
    tmp_path: Path, cli_env: dict[str, str], task: dict[str, Any], message: str
) -> None:
    spec = write_spec(tmp_path / "rg.yaml", _spec(**task))
    code, out, err = _run(["submit", "--dry-run", str(spec)], cli_env)
    assert code != 0, (out, err)
    assert message in err, err


@pytest.mark.parametrize(("task", "message"), REFUSED)
def test_train_refuses_it_before_loading_a_model(
    tmp_path: Path, task: dict[str, Any], message: str
) -> None:
    spec = write_spec(tmp_path / "rg.yaml", _spec(**task))
    code, out, err = _run(["train", str(spec), "--out", str(tmp_path / "out")])
    assert code == 2, (out, err)
    assert message in err, err
    assert not (tmp_path / "out").exists()


def test_a_job_trains_on_generated_rows_and_evaluates_the_held_out_ones(client: Client) -> None:
    """The worker generates the rows (seed 5), samples them as plain prompts (builtin:tiny has
    no chat template), scores them with spell_backward's scorer and evaluates the 4 held-out
    questions."""
    spec = _spec(dataset="spell_backward", config=SPELL, seed=5)
    spec["train"] |= {"eval_every": 2, "log_samples_every": 1, "log_samples_count": 2}
    job = client.submit(spec)
    events = list(client.follow(job.id))
    assert events[-1].event == "done" and events[-1].json() == {"status": "succeeded"}, client.get(
        job.id
    ).error
    metrics = [e.json() for e in events if e.event == "metrics"]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert 0.0 <= m["metrics"]["reward_mean"] <= 1.0
        assert m["metrics"]["grader_errors"] == 0.0
    evals = [e.json()["metrics"] for e in events if e.event == "eval"]
    assert len(evals) == 1 and evals[0]["eval_prompts"] == 4
    assert 0.0 <= evals[0]["eval_reward_mean"] <= 1.0
    samples = [s for e in events if e.event == "samples" for s in e.json()["samples"]]
    assert len(samples) == 4
    prefix = "user: Spell this word backward (example: sun -> nus): "  # the turns, as shown
    for sample in samples:
        assert sample["prompt"].startswith(prefix)
        word = sample["prompt"][len(prefix) :]
        assert len(word) == 3 and sample["answer"] == word[::-1]


def test_an_experiment_over_reasoning_gym_children(
    tmp_path: Path, cli_env: dict[str, str], client: Client
) -> None:
    """`pdppo experiment`: each child is a reasoning_gym job (its rows follow the child's seed:
    the base sets no task.seed); a grid value that names no dataset, or that the dataset's config
    refuses, is turned away before any child exists."""
    base = _spec(dataset="spell_backward", config=SPELL)
    spec = write_spec(tmp_path / "base.yaml", base)
    before = [job.id for job in client.list(limit=100).items]
    bad_name = ["--grid", "task.dataset=spell_backward,spell_backwards", "--seeds", "1"]
    code, out, err = _run(["experiment", str(spec), *bad_name], cli_env)
    assert code != 0 and "arm 'dataset=spell_backwards', seed 0" in err, (out, err)
    assert "did you mean spell_backward?" in err
    bad_value = ["--grid", "task.size=0,20", "--seeds", "1"]
    code, out, err = _run(["experiment", str(spec), *bad_value], cli_env)
    assert code != 0 and "arm 'size=0', seed 0" in err, (out, err)
    assert [job.id for job in client.list(limit=100).items] == before

    args = ["--grid", "task.size=20,30", "--seeds", "1", "--name", "rg", "--follow"]
    code, out, err = _run(["experiment", str(spec), *args], cli_env)
    assert code == 0, (out, err)
    exp_id, status = out.strip().splitlines()[-1].split()
    assert status == "succeeded"
    table = out.strip().splitlines()
    assert table[1].startswith("size=20") and table[2].startswith("size=30")
    code, out, _ = _run(["experiments", "show", exp_id, "--json"], cli_env)
    runs = [run for arm in json.loads(out)["arms"] for run in arm["runs"]]
    specs = {(r["seed"], client.get(r["job_id"]).spec["train"]["task"]["size"]) for r in runs}
    assert specs == {(0, 20), (0, 30)}
    for r in runs:
        task = client.get(r["job_id"]).spec["train"]["task"]
        assert task["name"] == "reasoning_gym" and task["dataset"] == "spell_backward"
