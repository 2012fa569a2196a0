"""bench/loss_memory.py at a size CI affords: its figures parse, they are what it measured, and at
a vocabulary where the unfused logits dwarf everything else the fused path holds less."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "loss_memory.py"
ROW = re.compile(r"^\s*(\d+)\s+(fused|unfused)\s+([\d.]+)\s+([\d.]+)\s+(-?[\d.]+)$", re.M)


def _run(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, timeout=600
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_table_has_both_paths_and_the_fused_one_holds_less() -> None:
    # N 1024 x V 32768: each unfused fp32 [N, V] buffer is 128 MiB, the fused chunk 16 MiB
    out = _run("--n", "1024", "--h", "64", "--vocab", "4096", "32768")
    rows = {(int(v), path): (float(t), float(peak)) for v, path, t, peak, _ in ROW.findall(out)}
    assert set(rows) == {(v, p) for v in (4096, 32768) for p in ("fused", "unfused")}, out
    assert all(t > 0 and peak > 0 for t, peak in rows.values()), out
    fused, unfused = rows[(32768, "fused")][1], rows[(32768, "unfused")][1]
    assert fused < unfused / 4, out  # the logits alone are 128 MiB unfused, once
    # the ratio lines restate the table's own figures
    ratio = re.search(r"ratio V=32768: fused/unfused peak ([\d.]+)", out)
    assert ratio is not None, out
    assert abs(float(ratio.group(1)) - fused / unfused) < 0.01, out  # the table rounds MiB


def test_a_training_run_under_an_address_space_cap_says_which_path_completed() -> None:
    out = _run("--skip-loss", "--train-limit", "3")
    lines = {m.group(1): m.group(2) for m in re.finditer(r"^\s+(fused|unfused): (.*)$", out, re.M)}
    assert set(lines) == {"fused", "unfused"}, out
    assert lines["fused"].startswith("completed"), out
    assert not lines["unfused"].startswith("completed"), out
