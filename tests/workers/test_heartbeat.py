"""The worker's heartbeat file and `pdppo healthcheck`, the worker containers' healthcheck: a
worker that reached Redis lately is healthy; one that has not, one whose process is gone, or
none at all is not. The end-to-end check (a real worker, its real reaper thread) is in
tests/integration/test_worker_health.py; the compose stack waits on it for real in
tests/compose."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from pdppo.cli import main
from pdppo.settings import get_settings
from workers.upkeep.heartbeat import Beat, Heartbeat, read_beats, verdict


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_beat_records_this_process_and_the_time(tmp_path: Path) -> None:
    before = time.time()
    Heartbeat(tmp_path / "beats", "pdppo-cpu@host-1").beat()
    written = json.loads((tmp_path / "beats" / "pdppo-cpu@host-1").read_text())
    assert written["pid"] == os.getpid()
    assert before <= written["at"] <= time.time()
    assert [p.name for p in (tmp_path / "beats").iterdir()] == ["pdppo-cpu@host-1"]  # no .tmp


def test_beats_closer_than_the_interval_write_once(tmp_path: Path) -> None:
    heartbeat = Heartbeat(tmp_path, "w", every=0.3)
    heartbeat.beat()
    first = json.loads((tmp_path / "w").read_text())["at"]
    heartbeat.beat()
    assert json.loads((tmp_path / "w").read_text())["at"] == first
    time.sleep(0.35)
    heartbeat.beat()
    assert json.loads((tmp_path / "w").read_text())["at"] > first


def test_a_node_name_becomes_a_plain_file_name(tmp_path: Path) -> None:
    Heartbeat(tmp_path, "../gpu 0/1").beat()
    assert [p.name for p in tmp_path.iterdir()] == [".._gpu_0_1"]


def test_read_beats_skips_processes_that_are_gone_and_files_that_are_not_beats(
    tmp_path: Path,
) -> None:
    (tmp_path / "alive").write_text(json.dumps({"pid": os.getpid(), "at": 1000.0}))
    (tmp_path / "gone").write_text(json.dumps({"pid": dead_pid(), "at": 1000.0}))
    (tmp_path / "garbage").write_text("not json")
    (tmp_path / ".alive.tmp").write_text(json.dumps({"pid": os.getpid(), "at": 1000.0}))
    assert read_beats(tmp_path, now=1012.5) == [Beat("alive", os.getpid(), 12.5)]


def test_verdict_needs_a_worker_and_every_worker_recent() -> None:
    assert verdict([], 60) == (False, "no worker process has reached Redis yet")
    fresh, late = Beat("a", 1, 5.0), Beat("b", 2, 61.0)
    assert verdict([fresh], 60) == (True, "1 worker process(es) alive; Redis reached 5s ago")
    assert verdict([Beat("a", 1, 60.0)], 60)[0] is True  # at the limit: still alive
    healthy, message = verdict([late, fresh], 60)
    assert not healthy
    assert message == "last reached Redis more than 60s ago: b (61s ago)"


@pytest.fixture
def beats_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("PDPPO_WORKER_HEARTBEAT_DIR", str(tmp_path))
    get_settings.cache_clear()
    yield tmp_path
    get_settings.cache_clear()


def test_the_healthcheck_command_exits_by_the_verdict(beats_dir: Path) -> None:
    runner = CliRunner()
    empty = runner.invoke(main, ["healthcheck"])
    assert (empty.exit_code, empty.output) == (1, "no worker process has reached Redis yet\n")

    Heartbeat(beats_dir, "w").beat()
    fresh = runner.invoke(main, ["healthcheck"])
    assert fresh.exit_code == 0, fresh.output
    assert fresh.output.startswith("1 worker process(es) alive")

    time.sleep(0.2)
    late = runner.invoke(main, ["healthcheck", "--max-age", "0.1"])
    assert late.exit_code == 1
    assert late.output.startswith("last reached Redis more than 0s ago: w (")
