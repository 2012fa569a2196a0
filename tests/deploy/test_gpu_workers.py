"""deploy/gpu-workers.sh, the GPU container's entry point, run for real with a stand-in `pdppo`.

No GPU here, so `WORKER_GPUS` names the devices and a fake `pdppo` on PATH records how it was
started; what is under test is the script: one worker per GPU, each pinned to its device, and
signals and deaths handled so that no worker outlives the container's main process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "gpu-workers.sh"
FAKE_PDPPO = """#!/usr/bin/env bash
echo "$CUDA_VISIBLE_DEVICES $*" > "$RECORD_DIR/$CUDA_VISIBLE_DEVICES.args"
trap 'echo term > "$RECORD_DIR/$CUDA_VISIBLE_DEVICES.stopped"; exit 0' TERM
if [[ "$CUDA_VISIBLE_DEVICES" == "$CRASH_GPU" ]]; then sleep 0.5; exit 3; fi
while true; do sleep 0.1; done
"""


def _start(
    tmp_path: Path, gpus: str, crash: str = "", per_worker: str = "1", visible: int = 0
) -> subprocess.Popen[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "pdppo"
    fake.write_text(FAKE_PDPPO)
    fake.chmod(0o755)
    # what `python -c "import torch; print(torch.cuda.device_count())"` answers
    fake_python = bin_dir / "python"
    fake_python.write_text(f"#!/bin/sh\necho {visible}\n")
    fake_python.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "WORKER_GPUS": gpus,
        "RECORD_DIR": str(tmp_path),
        "CRASH_GPU": crash,
        "GPUS_PER_WORKER": per_worker,
    }
    return subprocess.Popen(
        ["bash", str(SCRIPT)], env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def _wait_for(paths: list[Path], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"missing {[p for p in paths if not p.exists()]}"
        time.sleep(0.05)


def test_one_pinned_worker_per_gpu_and_sigterm_reaches_all(tmp_path: Path) -> None:
    proc = _start(tmp_path, "0,2")
    try:
        _wait_for([tmp_path / "0.args", tmp_path / "2.args"])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        proc.kill()
    for gpu in ("0", "2"):
        args = (tmp_path / f"{gpu}.args").read_text().split()
        assert args[:6] == [gpu, "worker", "--queues", "gpu", "--devices", "1"]
        assert args[6] == "--name" and args[7].startswith(f"pdppo-gpu{gpu}@")
        assert (tmp_path / f"{gpu}.stopped").exists()
    assert not (tmp_path / "1.args").exists()


def test_a_dead_worker_stops_the_others_and_the_container(tmp_path: Path) -> None:
    proc = _start(tmp_path, "0,1", crash="1")
    try:
        assert proc.wait(10) == 3  # non-zero: compose's restart policy brings the set back
    finally:
        proc.kill()
    assert (tmp_path / "0.stopped").exists()


def test_workers_of_several_gpus_each_own_their_group(tmp_path: Path) -> None:
    proc = _start(tmp_path, "0,1,2,3", per_worker="2")
    try:
        _wait_for([tmp_path / "0,1.args", tmp_path / "2,3.args"])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        proc.kill()
    for group in ("0,1", "2,3"):
        args = (tmp_path / f"{group}.args").read_text().split()
        assert args[:6] == [group, "worker", "--queues", "gpu", "--devices", "2"]
        assert args[7].startswith(f"pdppo-gpu{group.replace(',', '-')}@")
    assert sorted(p.name for p in tmp_path.glob("*.args")) == ["0,1.args", "2,3.args"]


def test_gpus_that_do_not_split_into_workers_are_refused(tmp_path: Path) -> None:
    proc = _start(tmp_path, "0,1,2", per_worker="2")
    try:
        assert proc.wait(10) == 1
    finally:
        proc.kill()
    assert not list(tmp_path.glob("*.args"))


def test_without_a_gpu_the_container_says_so_and_idles_with_no_worker(tmp_path: Path) -> None:
    proc = _start(tmp_path, gpus="", visible=0)
    time.sleep(1.5)
    assert proc.poll() is None, "it exited: the restart policy would start it again and again"
    assert not list(tmp_path.glob("*.args")), "a worker was started without a GPU"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=5)
    assert proc.returncode == 0
    assert "no GPU visible" in err and "no gpu job will run here" in err, err


def test_without_worker_gpus_it_starts_one_worker_per_visible_gpu(tmp_path: Path) -> None:
    proc = _start(tmp_path, gpus="", visible=2)
    _wait_for([tmp_path / "0.args", tmp_path / "1.args"])
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
