"""The `plugin` grader: a reward function an operator installed, never code from a spec.

A plugin is an entry point in the `pdppo.graders` group of any installed distribution:

    [project.entry-points."pdppo.graders"]
    unit_tests = "my_rewards.code:run_tests"

`run_tests(completion: str, record: dict, **options) -> float`, where `options` are the spec's
`grader.options`. Entry points are found the standard way (`importlib.metadata`), over the
interpreter's `sys.path`: a package installed in the worker's environment, or a folder named on
`PYTHONPATH` that holds the module and its `*.dist-info/entry_points.txt` (handy for a plugin
that is not packaged; the grading server inherits the worker's environment).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from importlib.metadata import entry_points
from numbers import Real
from typing import Any

from core.config.graders import PluginGrader
from core.graders.base import Grader, Record

ENTRY_POINT_GROUP = "pdppo.graders"


def installed_plugins() -> list[str]:
    """The names of the installed grader plugins, sorted."""
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def check_installed(name: str, where: str) -> None:
    """A clear error when the spec names a plugin this worker does not have; checked when the
    task is built, without importing any plugin."""
    installed = installed_plugins()
    if name not in installed:
        raise ValueError(
            f"{where}.name={name!r}: no grader plugin of that name is installed (entry point "
            f"group {ENTRY_POINT_GROUP!r}; installed: {installed})"
        )


def load_plugin(name: str, where: str) -> Callable[..., Any]:
    """The plugin's function; importing it runs operator code, so only the grading server
    does it."""
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        check_installed(name, where)  # raises, listing what is installed
    fn = found[0].load()
    if not callable(fn):
        raise ValueError(f"{where}.name={name!r}: entry point {found[0].value!r} is not callable")
    return fn


class Plugin(Grader):
    """Calls the operator's function; its result, a real number (or a bool), is clipped to
    [0, 1]. A result
    that is not a finite number is an error of the grader (counted in `grader_errors`), not a
    reward of 0, so that a broken plugin shows."""

    def __init__(self, cfg: PluginGrader, where: str, *, load: bool) -> None:
        """`load=False` (the trainer's process) only checks that the plugin is installed;
        `load=True` (the grading server) imports it."""
        self.name = cfg.name
        self.options = dict(cfg.options)
        self.where = where
        self.fn: Callable[..., Any] | None = None
        if load:
            self.fn = load_plugin(cfg.name, where)
        else:
            check_installed(cfg.name, where)

    def score(self, completion: str, record: Record) -> float:
        if self.fn is None:
            raise RuntimeError(f"plugin {self.name!r} runs in the grading server only")
        result = self.fn(completion, dict(record), **self.options)
        if not isinstance(result, Real):  # bool is a Real: True scores 1
            raise TypeError(f"plugin {self.name!r} returned {type(result).__name__}, not a number")
        value = float(result)
        if not math.isfinite(value):
            raise ValueError(f"plugin {self.name!r} returned {value}, not a finite number")
        return min(1.0, max(0.0, value))
