"""pdppo's optional features and the pip extras that bring them (pyproject.toml).

`pip install pdppo` is the client only; each feature's packages come with an extra. A feature
whose packages are missing must say which extra to install, in one line, before it starts work:
an ImportError traceback from deep inside a job tells a user nothing they can act on. This module
imports nothing optional itself, so every layer (the trainer, the worker, the CLI) can ask.
"""

from __future__ import annotations

import importlib.util


class MissingExtra(ImportError):
    """A feature's packages are not installed; the message names the extra and its install."""

    def __init__(self, what: str, extra: str, missing: str) -> None:
        super().__init__(
            f"{what} needs the {extra} extra: pip install 'pdppo[{extra}]' ({missing} is missing)",
            name=missing,
        )
        self.extra = extra


def missing(modules: tuple[str, ...]) -> str | None:
    """The first of `modules` (top-level names) that cannot be imported here, or None.

    find_spec looks without importing, so asking costs no torch import; a module set to None in
    sys.modules counts as missing, as `import` itself treats it."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            return module
    return None


def require(what: str, extra: str, modules: tuple[str, ...]) -> None:
    """Raises MissingExtra when one of `modules` is missing: `what` names the feature."""
    absent = missing(modules)
    if absent is not None:
        raise MissingExtra(what, extra, absent)
