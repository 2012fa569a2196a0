"""The chat-math example end to end, as a user runs it: the model built by the documented script
into a folder under the workers' data roots, the spec and its data beside it, `pdppo submit
SPEC --follow` resolving the spec's relative paths, and a real worker training the hf: chat
model on chat records (chat template, warm-up on the answers, the spec's graders, evaluation on
the validation file and samples) to `succeeded`. Shortened to 2 steps; the rest is the shipped
spec unchanged."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import yaml
from click.testing import CliRunner

from pdppo.cli import main
from tests.support.stack import KEYS, REPO, Service
from tests.support.waits import read_events

EXAMPLES = REPO / "examples"


def place_example(root: Path) -> Path:
    """The example's spec and data under `root`, its model built there by the documented step,
    and the spec shortened to a 2-step run. Returns the spec's path."""
    (root / "data").mkdir(parents=True)
    for name in ("chat_math.jsonl", "chat_math_val.jsonl"):
        shutil.copy(EXAMPLES / "data" / name, root / "data" / name)
    script = EXAMPLES / "build_chat_model.py"
    out = root / "models" / "chat-llama"
    subprocess.run([sys.executable, str(script), "--out", str(out)], check=True)
    spec = yaml.safe_load((EXAMPLES / "chat_math.yaml").read_text())
    spec["name"] = "chat-math-e2e"
    train = spec["train"]
    train.update(steps=2, eval_every=2, log_samples_every=1, checkpoint_every=2)
    train["task"].update(warmup_steps=3)
    train["rollout"].update(prompts_per_step=4, group_size=4)
    path = root / "chat_math.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_chat_math_example_runs_through_the_service(service: Service, alice: httpx.Client) -> None:
    spec = place_example(service.data_dir / "chat-example")
    env = {"PDPPO_URL": service.base_url, "PDPPO_API_KEY": KEYS["alice"]}
    result = CliRunner().invoke(main, ["submit", str(spec), "--follow"], env=env)
    assert result.exit_code == 0, (result.stdout, result.stderr, service.worker_log()[-3000:])
    job_id, status = result.stdout.strip().splitlines()[-1].split()
    assert status == "succeeded"

    job = alice.get(f"/v1/jobs/{job_id}").json()
    model = job["spec"]["train"]["model"]["name"]  # made absolute by the client
    assert model == f"hf:{service.data_dir / 'chat-example' / 'models' / 'chat-llama'}"

    events = read_events(alice, job_id)
    logs = [e["data"]["message"] for e in events if e["event"] == "log"]
    assert any(m.startswith("answer warm-up: 3 steps") for m in logs), logs
    metrics = [e["data"]["metrics"] for e in events if e["event"] == "metrics"]
    assert len(metrics) == 2
    assert all({"grader/answer", "grader/short"} <= set(m) for m in metrics)
    evals = [e["data"] for e in events if e["event"] == "eval"]
    assert [e["step"] for e in evals] == [0, 2]  # the warm-up's model (eval_on_start), the last
    assert all(e["metrics"]["eval_prompts"] == 50 for e in evals)  # the whole validation file
    samples = [s for e in events if e["event"] == "samples" for s in e["data"]["samples"]]
    assert samples and all(s["prompt"].startswith("system: You are a calculator.") for s in samples)
    assert all(s["answer"].isdigit() for s in samples)
