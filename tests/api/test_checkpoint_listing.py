"""The checkpoint listing (`api.routes.artifacts._scan`) while the trainer rotates checkpoints:
one removed between the folder's listing and its size is left out, not a 500."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.routes import artifacts
from core.disk.atomic_dir import discard_dir
from tests.support.seed import job


def make_run(root: Path) -> None:
    for step in (2, 4):
        folder = root / "checkpoints" / f"step-{step:06d}"
        folder.mkdir(parents=True)
        (folder / "meta.json").write_text("{}")
    (root / "final").mkdir()
    (root / "final" / "config.json").write_text("{}")


def test_a_checkpoint_rotated_away_while_listed_is_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_run(tmp_path)
    size = artifacts._size

    def rotated_meanwhile(path: Path) -> int:
        if path.name == "step-000002":
            discard_dir(path)  # what `save_checkpoint(keep=...)` does as step 6 lands
        return size(path)

    monkeypatch.setattr(artifacts, "_size", rotated_meanwhile)
    listing = artifacts._scan(tmp_path, job("running"))
    assert [c.name for c in listing.items] == ["step-000004"]
    assert listing.items[0].size_bytes == 2


@pytest.mark.parametrize(
    ("status", "url"),
    [
        ("succeeded", "/v1/jobs/j1/model"),
        ("running", None),
        ("cancelled", None),
        ("failed", None),
        ("paused", None),
        ("queued", None),
    ],
)
def test_the_final_model_is_advertised_for_succeeded_jobs_only(
    tmp_path: Path, status: str, url: str | None
) -> None:
    make_run(tmp_path)
    assert artifacts._scan(tmp_path, job(status)).final_model_url == url
