"""`pdppo train` with `rollout.engine: vllm`, as a user runs it (a process per run): the chat
example's data and model shape, five steps, the weights synced into the engine before every
rollout, and a resume from a checkpoint.

Each step trains one minibatch, one epoch: its `offpolicy_logratio_abs` is |log pi - log mu|
of the step's tokens under the weights the engine was given, before the step's update. It
stays at precision (fp32 both sides) only if every sync took; without them the engine samples
from the step-0 weights and the gap grows with every update (lr 1e-2)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.models.local_hf import make_chat_hf
from tests.support.stack import REPO, pdppo_command
from tests.vllm.specs import chat_spec as spec

PRECISION = 1e-4
STEPS = 5


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("vllm-train")
    model = make_chat_hf(root / "chat-llama")
    data = root / "data"
    data.mkdir()
    shutil.copy(REPO / "examples" / "data" / "chat_math.jsonl", data)
    return model, data


def train(tmp: Path, body: dict[str, Any], out: Path, *extra: str) -> list[dict[str, float]]:
    path = tmp / f"spec-{body['train']['steps']}.yaml"
    path.write_text(yaml.safe_dump(body))
    env_cmd = [*pdppo_command(), "train", str(path), "--out", str(out), "--quiet", *extra]
    done = subprocess.run(env_cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    # nor an error at exit (vLLM's groups inside a data-parallel run's, torn down in order)
    assert "Traceback" not in done.stderr, done.stderr[-4000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_five_steps_sampled_by_vllm_stay_on_policy_and_resume(
    setup: tuple[Path, Path], tmp_path: Path
) -> None:
    model, data = setup
    full = train(tmp_path, spec(model, data, STEPS), tmp_path / "full")
    assert [m["step"] for m in full] == [1.0, 2.0, 3.0, 4.0, 5.0]
    for m in full:
        assert m["offpolicy_logratio_abs"] < PRECISION, m
        assert 0 < m["weight_sync_time"] < 10
        assert m["tokens_per_s"] > 0
    assert full[-1]["grad_norm"] > 0  # it trained: the syncs carried changed weights

    part = tmp_path / "part"
    train(tmp_path, spec(model, data, 3), part)
    resumed = train(tmp_path, spec(model, data, STEPS), part, "--resume")
    assert [m["step"] for m in resumed] == [1.0, 2.0, 3.0, 4.0, 5.0]
    for m in resumed[3:]:  # the engine restarted from disk and was given the checkpoint's weights
        assert m["offpolicy_logratio_abs"] < PRECISION, m
    # the engine's seeds come from the run's checkpointed generator: the same rollouts
    for a, b in zip(full, resumed, strict=True):
        assert a["reward_mean"] == b["reward_mean"], (a, b)


def test_with_staleness_the_engine_samples_the_policy_k_steps_old(
    setup: tuple[Path, Path], tmp_path: Path
) -> None:
    """Staleness 2: from step 3 on the engine holds the weights of two updates ago, and the
    gap shows it; steps 1 and 2 sample from the initial weights, which are the current ones
    at step 1 only."""
    model, data = setup
    metrics = train(tmp_path, spec(model, data, 4, staleness=2), tmp_path / "stale")
    gaps = [m["offpolicy_logratio_abs"] for m in metrics]
    assert gaps[0] < PRECISION
    assert all(g > 100 * PRECISION for g in gaps[1:]), gaps


@pytest.mark.parametrize("staleness", [0, 1])
def test_lora_runs_are_sampled_from_the_merged_policy(
    setup: tuple[Path, Path], tmp_path: Path, staleness: int
) -> None:
    """With LoRA the engine is given the base weights with the adapters merged in before every
    rollout (with staleness 1, the merge of the snapshot a step old, which at step 1 is the
    current policy): on policy to precision where the engine holds the current adapters."""
    model, data = setup
    metrics = train(
        tmp_path, spec(model, data, 3, lora=True, staleness=staleness), tmp_path / "lora"
    )
    gaps = [m["offpolicy_logratio_abs"] for m in metrics]
    current = gaps if staleness == 0 else gaps[:1]
    assert all(g < PRECISION for g in current), gaps
    assert all(g > 100 * PRECISION for g in gaps[len(current) :]), gaps
    assert metrics[-1]["grad_norm"] > 0


def test_two_processes_sample_with_an_engine_each_and_resume_on_two_and_on_one(
    setup: tuple[Path, Path], tmp_path: Path
) -> None:
    """`--nproc 2`: each rank samples its two prompts with an engine of its own (vLLM's
    external launcher inside the run's gloo group) and syncs its own weights into it; the
    global off-policy gap stays at precision only if both engines took every sync. Sharded
    (fsdp), the ranks gather the weights for the sync and draw the same rollouts. A resume
    on 2 processes draws the same rollouts again; on 1 it goes on from the shared checkpoint
    with one engine, still on policy."""
    model, data = setup
    full = train(tmp_path, spec(model, data, STEPS), tmp_path / "full", "--nproc", "2")
    assert [m["step"] for m in full] == [1.0, 2.0, 3.0, 4.0, 5.0]
    for m in full:
        assert m["offpolicy_logratio_abs"] < PRECISION, m
        assert 0 < m["weight_sync_time"] < 10
    assert full[-1]["grad_norm"] > 0

    # sharded, each rank gathers the weights for its engine: the same rollouts, on policy
    body = spec(model, data, STEPS)
    body["train"]["sharding"] = "fsdp"
    sharded = train(tmp_path, body, tmp_path / "sharded", "--nproc", "2")
    for a, b in zip(full, sharded, strict=True):
        assert a["reward_mean"] == b["reward_mean"], (a, b)
        assert b["offpolicy_logratio_abs"] < PRECISION, b

    part = tmp_path / "part"
    train(tmp_path, spec(model, data, 3), part, "--nproc", "2")
    one = tmp_path / "one"
    shutil.copytree(part, one)
    resumed = train(tmp_path, spec(model, data, STEPS), part, "--resume", "--nproc", "2")
    assert [m["step"] for m in resumed] == [1.0, 2.0, 3.0, 4.0, 5.0]
    for a, b in zip(full, resumed, strict=True):
        assert a["reward_mean"] == b["reward_mean"], (a, b)
    for m in resumed[3:]:
        assert m["offpolicy_logratio_abs"] < PRECISION, m

    alone = train(tmp_path, spec(model, data, STEPS), one, "--resume", "--nproc", "1")
    assert [m["step"] for m in alone] == [1.0, 2.0, 3.0, 4.0, 5.0]
    for m in alone[3:]:
        assert m["offpolicy_logratio_abs"] < PRECISION, m
