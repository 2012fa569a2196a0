"""Grader plugins as an operator installs them: a module and its `*.dist-info` with entry points
in the `pdppo.graders` group, written to a folder that goes on `sys.path` or `PYTHONPATH` (the
way an unpackaged plugin is served)."""

from __future__ import annotations

from pathlib import Path

from core.graders.plugins import ENTRY_POINT_GROUP


def install_plugins(root: Path, module: str, source: str, functions: dict[str, str]) -> Path:
    """`root`, holding `module` (its code `source`) and a distribution whose entry points name
    `functions` ({entry point name: attribute of the module})."""
    (root / f"{module}.py").write_text(source)
    info = root / f"{module}-0.1.dist-info"
    info.mkdir()
    name = module.replace("_", "-")
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    entries = "".join(f"{entry} = {module}:{fn}\n" for entry, fn in functions.items())
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n" + entries)
    return root
