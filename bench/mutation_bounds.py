"""pytest plugin for `bench/mutation.py`'s mutant runs: each test's own pytest-timeout bound.

Loaded with `-p mutation_bounds`; reads `{node id: seconds}` from `$PDPPO_MUTATION_BOUNDS`.
One bound for every test of a mutant had to be the slowest one's, so a mutant that hung a 2 s
test waited out the bound of a 100 s test run with it (419 s in one run of the sse group). The
marker goes first, before any `timeout` mark of the test's own: the closest mark wins.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    path = os.environ.get("PDPPO_MUTATION_BOUNDS")
    if not path:
        return
    bounds: dict[str, float] = json.loads(Path(path).read_text())
    for item in items:
        if item.nodeid in bounds:
            item.add_marker(pytest.mark.timeout(bounds[item.nodeid]), append=False)
