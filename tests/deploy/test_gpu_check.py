"""bench/gpu_check.py --tiny: the GPU check's CPU form, so that the script a GPU session runs
once, with minutes to spend, still works when it gets there. Its table has every row; the rows
CPU can run are ok with the figures of the model it built (known by hand, not read back from
the script); a row that raises, a child that dies and one that hangs fail the run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu_check import TINY, run_group
from bench.gpu_check_rows import FAIL_ENV, GROUPS, Row, Skipped, exit_code, run_row

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.py"
ROW = re.compile(r"^([\w-]+) +(ok|skipped|FAILED) +(.*)$", re.M)
# the tiny Llama: embedding and output layer 640 x 128 each; per layer q, k, v, o 128 x 128,
# gate, up, down 128 x 256, two norms of 128; a final norm of 128
TINY_PARAMS = 2 * 640 * 128 + 2 * (4 * 128 * 128 + 3 * 128 * 256 + 2 * 128) + 128
NON_EMBEDDING = TINY_PARAMS - 640 * 128
# the memory rows' models: the Qwen2 adds the biases of q, k and v (3 x 128 a layer); LoRA r 16
# adds 16 x (in + out) to q, k, v, o (128 x 128), gate, up (128 -> 256) and down (256 -> 128);
# builtin:tiny of the same width, depth and vocabulary, 24 positions (8 + BOS + 8, rounded up
# to 8): embeddings, positions, 12 d^2 + 13 d a block, the final norm, an untied head
MEMORY_PARAMS = {
    "memory": TINY_PARAMS,
    "mem-qwen2": TINY_PARAMS + 2 * 3 * 128,
    "mem-lora": TINY_PARAMS + 2 * 16 * (4 * 256 + 3 * 384),
    "mem-builtin": 2 * 640 * 128 + 24 * 128 + 2 * (12 * 128 * 128 + 13 * 128) + 2 * 128,
    "mem-unfused": TINY_PARAMS,
}
Table = dict[str, tuple[str, dict[str, str], str]]  # row: status, figures, the text after it


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k != FAIL_ENV}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        env={**clean, "OMP_NUM_THREADS": "1", **(env or {})},
    )


def _table(out: str) -> Table:
    rows: Table = {}
    for name, status, text in ROW.findall(out):
        figures = dict(kv.split("=", 1) for kv in text.split()) if status == "ok" else {}
        rows[name] = (status, figures, text)
    return rows


def test_tiny_has_every_row_and_the_cpu_rows_pass_with_the_figures_of_its_model() -> None:
    """One run (a minute on 2 cores) for every check of its table, so that a parallel test
    runner cannot run it once per test."""
    done = _run("--tiny")
    rows = _table(done.stdout)
    assert list(rows) == ["train", *MEMORY_PARAMS, "dp", "fsdp", "vllm"], done.stdout
    for name in ("train", *MEMORY_PARAMS, "dp", "fsdp"):
        assert rows[name][0] == "ok", done.stdout + done.stderr
    try:
        import vllm  # noqa: F401
    except ImportError:
        assert rows["vllm"][:1] == ("skipped",) and rows["vllm"][2] == "vllm not installed"
    else:
        assert rows["vllm"][0] == "ok", done.stdout
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^[\d.]+ s, 0 failed$", done.stdout, re.M), done.stdout
    _check_train(rows, done.stdout)
    _check_memory(rows, done.stdout)
    _check_group_of_one(rows, done.stdout)


def _check_train(rows: Table, out: str) -> None:
    train = rows["train"][1]
    assert int(train["params"]) == TINY_PARAMS == 492_160, out
    # one minibatch in one piece per step, two steps: every loss piece took the fused path
    assert int(train["fused_pieces"]) == 2, out
    step, speed = float(train["step_s"]), float(train["tokens_per_s"])
    assert 0 < float(train["rollout_s"]) < step and 0 < float(train["update_s"]) < step, out
    completion_tokens = speed * step  # 16 completions of 1 to 8 tokens
    assert 16 * 0.99 <= completion_tokens <= 16 * 8 * 1.01, out
    # 8N FLOPs per token of the 4 prompts of 8 tokens and of every completion token
    flops = 8 * NON_EMBEDDING * (4 * 8 + completion_tokens) / step
    assert float(train["model_tflops"]) == pytest.approx(flops / 1e12, rel=2e-3), out
    assert "mfu" not in train, out  # no peak is known for a CPU
    assert 0 <= float(train["masked_fraction"]) <= 1 and float(train["grad_norm"]) > 0, out


def _check_memory(rows: Table, out: str) -> None:
    """Every memory row: the model it sized (from the safetensors header, or builtin:tiny's
    dims), the loss it counted (the row itself fails where the step ran the other one), a real
    peak (RSS above the imports) and an estimate above it. The fsdp row measures the same."""
    for name, params in MEMORY_PARAMS.items():
        figures = rows[name][1]
        fused = "no" if name == "mem-unfused" else "yes"
        assert (int(figures["estimate_params"]), figures["estimate_fused"]) == (params, fused), out
    for name in (*MEMORY_PARAMS, "fsdp"):
        memory = {k: float(rows[name][1][k]) for k in ("estimate_gib", "measured_gib", "ratio")}
        assert 0.01 < memory["measured_gib"] < 2, out
        ratio = memory["estimate_gib"] / memory["measured_gib"]
        assert memory["ratio"] == pytest.approx(ratio, rel=2e-3), out
        assert memory["ratio"] > 1, out  # the estimate is an upper bound


def _check_group_of_one(rows: Table, out: str) -> None:
    dp, fsdp = rows["dp"][1], rows["fsdp"][1]
    assert dp["backend"] == fsdp["backend"] == "gloo", out
    assert int(dp["dcp_files"]) == 0 and int(fsdp["dcp_files"]) >= 1, out
    assert float(dp["tokens_per_s"]) > 0 and float(fsdp["tokens_per_s"]) > 0, out
    # the same rollouts (a rank's seeds do not depend on sharding), so the same gradient
    assert float(fsdp["grad_norm"]) == pytest.approx(float(dp["grad_norm"]), rel=2e-3), out


def test_a_row_that_raises_fails_the_run_and_only_itself() -> None:
    done = _run("--tiny", "--only", "train,vllm", env={FAIL_ENV: "vllm"})
    rows = _table(done.stdout)
    assert done.returncode == 1, done.stdout + done.stderr
    assert {name: row[0] for name, row in rows.items()} == {
        "train": "ok",
        "memory": "ok",
        "vllm": "FAILED",
    }, done.stdout
    assert rows["vllm"][2] == f"RuntimeError: forced by {FAIL_ENV}", done.stdout
    assert re.search(r"^[\d.]+ s, 1 failed$", done.stdout, re.M), done.stdout


def test_the_gpu_jobs_budget_is_had_without_a_gpu() -> None:
    """`--estimate`: the train row's budget from the model's config.json alone (no weights, no
    GPU), under the GPU queue's default limit. Issue 49: 106 GiB, refused, before the estimate
    counted the fused loss (and each prompt once)."""
    done = _run("--estimate")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[1] == "parameters       797M (796,706,304)"
    assert "peak memory      35 GiB (cuda; counting persistent, overhead, update)" in lines
    assert "loss             fused (the [tokens x vocabulary] logits are never held)" in lines
    assert lines[-1].startswith("limits (gpu queue): memory 70 GiB,")


def test_the_row_runner() -> None:
    def broken() -> dict[str, int | float | str]:
        raise ZeroDivisionError("a\nb")

    def unavailable() -> dict[str, int | float | str]:
        raise Skipped("no such engine")

    rows = [run_row("a", lambda: {"x": 1}), run_row("b", unavailable)]
    assert rows == [Row("a", "ok", {"x": 1}), Row("b", "skipped", detail="no such engine")]
    assert exit_code(rows) == 0
    rows.append(run_row("c", broken))
    assert rows[-1] == Row("c", "FAILED", detail="ZeroDivisionError: a b")
    assert exit_code(rows) == 1


@pytest.mark.parametrize(
    ("timeout", "why"),
    [(600.0, "the process exited with 1 before reporting: FileNotFoundError"), (0.5, "timed out")],
)
def test_a_child_that_dies_or_hangs_fails_its_rows(
    tmp_path: Path, timeout: float, why: str
) -> None:
    plan = tmp_path / "plan.json"  # never written: the child dies reading it
    rows = run_group("train", plan, timeout, {**os.environ, "OMP_NUM_THREADS": "1"})
    assert [r.name for r in rows] == list(GROUPS["train"])
    for r in rows:
        assert r.status == "FAILED" and r.detail.startswith(why), r
    assert exit_code(rows) == 1


def test_the_tiny_setup_is_the_one_the_counts_above_assume() -> None:
    s = TINY.shape
    assert (s.hidden, s.layers, s.intermediate, TINY.vocab) == (128, 2, 256, 640)
    assert (TINY.prompts, TINY.group, TINY.prompt_tokens, TINY.new_tokens) == (4, 4, 8, 8)
