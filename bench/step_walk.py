"""The files a reader opens to follow one training step, in the order the step enters them.

Runs examples/smoke.yaml on the CPU under a tracer that records each call into the tree's own
code (core/, workers/, pdppo/, api/) during the second step only (from the first step's
metrics to the second's, so model loading and the first step's warm-up are left out), and
prints the project files in the order first entered, with their line counts, how often the walk
re-enters each (a call into it from another file), and the totals. Issue 50 measured this walk
before and after the trainer became one recipe; run it against any checkout to compare:

    python bench/step_walk.py                          # this tree
    git worktree add /tmp/old 0bdff77
    PYTHONPATH=/tmp/old python bench/step_walk.py --root /tmp/old

`--root` must be the tree that `import core` loads (hence PYTHONPATH): the script refuses to
trace one tree while running another."""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

PACKAGES = ("core", "workers", "pdppo", "api")


class Walk:
    """While on, each call into one of the tree's files from another file: the file, in order."""

    def __init__(self, root: Path) -> None:
        self.prefixes = tuple(str(root / p) + "/" for p in PACKAGES)
        self.files: list[str] = []
        self.on = False

    def trace(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or not self.on:
            return None
        name = frame.f_code.co_filename
        caller = frame.f_back.f_code.co_filename if frame.f_back else ""
        if name.startswith(self.prefixes) and caller != name:
            self.files.append(name)
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args()
    root: Path = args.root.resolve()

    import torch

    import core
    from core.config import TrainConfig
    from core.training.trainer import TrainerCallback, train
    from pdppo.spec import load_spec

    loaded = Path(core.__file__).resolve().parents[1]
    if loaded != root:
        sys.exit(f"`import core` loads {loaded}, not --root {root}: set PYTHONPATH={root}")

    walk = Walk(root)

    class SecondStep(TrainerCallback):
        """Turns the tracer on after step 1's metrics and stops the run at step 2's."""

        def __init__(self) -> None:
            self.steps = 0

        def on_step(self, step: int, metrics: dict[str, float]) -> None:
            self.steps += 1
            walk.on = self.steps == 1
            if walk.on:  # the loop that called us is where a reader starts
                walk.files.append(sys._getframe(1).f_code.co_filename)

        def should_stop(self) -> bool:
            return self.steps >= 2

    config = TrainConfig.model_validate(
        load_spec(root / "examples" / "smoke.yaml").train.model_dump()
    )
    torch.set_num_threads(1)
    sys.setprofile(walk.trace)
    try:
        with tempfile.TemporaryDirectory() as out:
            train(config, Path(out), callback=SecondStep())
    finally:
        sys.setprofile(None)

    entries = Counter(walk.files)
    order = list(dict.fromkeys(walk.files))
    total_lines = 0
    print(f"one step of examples/smoke.yaml in {root}")
    print(f"{'#':>3} {'file':<44} {'lines':>6} {'entered':>8}")
    for i, name in enumerate(order, start=1):
        lines = len(Path(name).read_text(encoding="utf-8").splitlines())
        total_lines += lines
        print(f"{i:>3} {Path(name).relative_to(root)!s:<44} {lines:>6} {entries[name]:>8}")
    print(
        f"{len(order)} files, {total_lines} lines, {len(walk.files)} entries "
        f"({len(walk.files) - len(order)} re-entries)"
    )


if __name__ == "__main__":
    main()
