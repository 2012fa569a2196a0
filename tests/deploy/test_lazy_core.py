"""`core`'s public names load torch on first use, not on `import core`.

The API server and every CLI command import `core.config`, `core.budget` and friends; an eager
torch import there cost each `pdppo` process about 2 s of CPU (3.1 s against 1.2 s for
`import api.app; from pdppo.cli import main`), the API's and each `pdppo status` included.
Each case runs in a fresh interpreter, since this one has torch loaded already.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("module", ["core", "api.app", "pdppo.cli", "pdppo.client"])
def test_importing_the_server_or_the_cli_does_not_load_torch(module: str) -> None:
    assert _run(f"import sys, {module}; print('torch' in sys.modules)") == "False"


def test_core_and_its_torch_free_packages_load_no_torch() -> None:
    """What `pdppo submit --dry-run` and the API import: the config and the budget's report."""
    code = "import sys, core, core.config, core.budget; print('torch' in sys.modules)"
    assert _run(code) == "False"


def test_divergence_names_one_thing() -> None:
    """`core.divergence` is the function; its module is `core.objective.estimators`, and no
    module of that name hides behind it (it was `core.objective.divergence`)."""
    out = _run(
        "import importlib, types, core\n"
        "from core.objective import estimators\n"
        "f = core.divergence\n"
        "print(f is estimators.divergence, isinstance(f, types.FunctionType))\n"
        "try:\n    importlib.import_module('core.objective.divergence')\n"
        "except ModuleNotFoundError as e:\n    print(e)"
    )
    assert out == "True True\nNo module named 'core.objective.divergence'"


def test_a_public_name_loads_its_module_on_first_use() -> None:
    out = _run(
        "import sys, core\n"
        "from core.objective.loss import policy_loss\n"
        "from core.objective.masks import trust_region_mask\n"
        "print(core.policy_loss is policy_loss, core.trust_region_mask is trust_region_mask,"
        " sorted(set(core.__all__) - set(dir(core))) == [])"
    )
    assert out == "True True True"


def test_an_unknown_name_is_an_attribute_error() -> None:
    code = "import core\ntry:\n    core.nothing_here\nexcept AttributeError as e:\n    print(e)"
    assert _run(code) == "module 'core' has no attribute 'nothing_here'"


def test_without_torch_a_public_name_says_which_extra() -> None:
    code = (
        "import sys\nsys.modules['torch'] = None\nimport core\n"
        "try:\n    core.policy_loss\nexcept ImportError as e:\n    print(e)"
    )
    assert _run(code) == (
        "core.policy_loss needs the worker extra: pip install 'pdppo[worker]' (torch is missing)"
    )


def test_the_api_starts_without_scipy() -> None:
    """Experiment reports need scipy (about 1 s to import): loaded on the first report, not by
    every API process at start."""
    code = (
        "import sys, api.app, core.experiments\n"
        "before = 'scipy' in sys.modules\n"
        "core.experiments.report\n"
        "print(before, 'scipy' in sys.modules)"
    )
    assert _run(code) == "False True"
