"""The compose deployment read as data: the properties that break a deployment silently.

The stack itself is built and run by `.ci/compose` (tests/compose/, real containers); these
checks run in the plain suite, in seconds and without Docker, and cover what the CPU-only run
cannot reach (the GPU service) or would only find late: Redis that evicts or forgets, a service
without a healthcheck, a worker that gets no GPU, an env var that no setting reads, a command the
CLI does not have, an install that is not pinned.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from pdppo.cli import main
from pdppo.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE_PATH = DEPLOY / "docker-compose.yml"
PDPPO_SERVICES = ("api", "worker-gpu", "worker-cpu")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_PATH.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return dict(compose["services"])


def _command(service: dict[str, Any]) -> list[str]:
    command = service["command"]
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def _named_volumes(service: dict[str, Any]) -> dict[str, str]:
    """volume name -> mount path, for short-syntax named volumes (not bind mounts)."""
    mounts = {}
    for entry in service.get("volumes", []):
        source, _, target = str(entry).partition(":")
        if not source.startswith((".", "/", "~", "$")):  # bind mounts are not volumes
            mounts[source] = target.split(":")[0]
    return mounts


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        return dict(str(item).partition("=")[::2] for item in env)
    return {str(k): str(v) for k, v in env.items()}


def test_compose_has_every_service(services: dict[str, Any]) -> None:
    assert {"redis", "api", "worker-gpu", "worker-cpu", "webhooks", "sample", "flower"} <= set(
        services
    )


def test_redis_persists_and_never_evicts(services: dict[str, Any]) -> None:
    redis = services["redis"]
    args = _command(redis)
    assert args[0] == "redis-server"
    options = dict(zip(args[1::2], args[2::2], strict=True))
    assert options["--appendonly"] == "yes"
    assert options["--maxmemory-policy"] == "noeviction"
    assert _named_volumes(redis) == {"redis-data": "/data"}
    assert "redis-cli" in redis["healthcheck"]["test"]


def test_api_has_a_readiness_healthcheck_and_waits_for_redis(services: dict[str, Any]) -> None:
    api = services["api"]
    test = " ".join(api["healthcheck"]["test"])
    assert "/readyz" in test or "/healthz" in test
    assert api["depends_on"]["redis"]["condition"] == "service_healthy"
    assert any(str(p).endswith(":8000") for p in api["ports"])


def test_gpu_worker_reserves_nvidia_gpus_and_runs_one_worker_per_gpu(
    services: dict[str, Any],
) -> None:
    gpu = services["worker-gpu"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    dockerfile = (ROOT / gpu["build"]["dockerfile"]).read_text()
    assert _default_base(dockerfile).startswith("nvidia/cuda:")
    assert _command(gpu) == ["pdppo-gpu-workers"]
    assert "deploy/gpu-workers.sh /usr/local/bin/pdppo-gpu-workers" in dockerfile
    assert _env(gpu)["PDPPO_ARTIFACT_DIR"] == "/artifacts"  # the anchor survived the merge


def test_cpu_worker_and_api_use_the_slim_image(services: dict[str, Any]) -> None:
    for name in ("api", "worker-cpu", "webhooks"):
        dockerfile = ROOT / services[name]["build"]["dockerfile"]
        assert re.fullmatch(r"python:3\.\d+-slim", _default_base(dockerfile.read_text()))
    assert _command(services["worker-cpu"])[-2:] == ["--queues", "cpu"]


def _default_base(dockerfile: str) -> str:
    """The image a user's build starts from: BASE_IMAGE's default, which every FROM names."""
    froms = re.findall(r"^FROM\s+(\S+)", dockerfile, re.MULTILINE)
    assert froms[0] == "${BASE_IMAGE}", froms
    found = re.search(r"^ARG BASE_IMAGE=(\S+)$", dockerfile, re.MULTILINE)
    assert found, "no default base image"
    return found.group(1)


def test_every_long_running_service_has_a_healthcheck(services: dict[str, Any]) -> None:
    """`docker compose ps` answers "all healthy?" only if each service says how it is."""
    for name, service in services.items():
        test = service["healthcheck"]["test"]
        assert test[0] == "CMD" and len(test) > 1, name
    for name in ("worker-cpu", "worker-gpu"):
        assert services[name]["healthcheck"]["test"] == ["CMD", "pdppo", "healthcheck"]


def test_artifacts_volume_is_shared_at_the_configured_dir(
    compose: dict[str, Any], services: dict[str, Any]
) -> None:
    for name in PDPPO_SERVICES:
        service = services[name]
        artifact_dir = _env(service)["PDPPO_ARTIFACT_DIR"]
        assert _named_volumes(service)["artifacts"] == artifact_dir, name
    declared = set(compose["volumes"])
    used = {v for s in services.values() for v in _named_volumes(s)}
    assert used <= declared
    assert {"redis-data", "artifacts"} <= declared


def test_workers_see_the_data_roots_read_only(services: dict[str, Any]) -> None:
    for name in ("worker-gpu", "worker-cpu"):
        service = services[name]
        roots = _env(service)["PDPPO_DATA_ROOTS"].split(",")
        # source:target[:mode], where the source may be `${VAR:-default}` (a colon of its own)
        parsed = [re.fullmatch(r"(.+):(/[^:]*)(?::(ro|rw))?", str(v)) for v in service["volumes"]]
        modes = {m.group(2): m.group(3) for m in parsed if m}
        for root in roots:
            assert modes[root] == "ro", (name, root)


def test_flower_sits_behind_a_profile(services: dict[str, Any]) -> None:
    assert services["flower"]["profiles"] == ["monitoring"]
    assert all("profiles" not in services[name] for name in ("redis", "api", "worker-cpu"))


def test_a_plain_up_starts_everything_but_the_gpu_workers_and_flower(
    services: dict[str, Any],
) -> None:
    """`docker compose up -d --build` with no service names is the docs' one command, on a
    machine with or without a GPU: the default set is every service in no profile, and the GPU
    workers sit behind `gpu` (their image and device reservation need NVIDIA's runtime; without
    a profile the plain command failed on `Service 'worker-gpu' needs to be built`)."""
    default = [name for name, service in services.items() if "profiles" not in service]
    assert default == ["redis", "api", "worker-cpu", "webhooks", "sample"]
    assert {name: services[name]["profiles"] for name in services if name not in default} == {
        "worker-gpu": ["gpu"],
        "flower": ["monitoring"],
    }
    text = COMPOSE_PATH.read_text()
    assert "docker compose -f deploy/docker-compose.yml up -d --build " in text
    assert "docker compose -f deploy/docker-compose.yml --profile gpu up -d --build" in text


@pytest.mark.parametrize("service", ["api", "worker-cpu", "webhooks", "sample", "worker-gpu"])
def test_compose_passes_every_build_argument_with_the_dockerfiles_default(
    services: dict[str, Any], service: str
) -> None:
    """Compose could not pass BASE_IMAGE (nor any build argument) to the builds: each one the
    Dockerfile declares with a default is now set from deploy/.env, `${NAME:-default}` (or
    `${NAME-default}`, where an empty value means something), and unset it is the Dockerfile's
    own default."""
    build = services[service]["build"]
    dockerfile = (ROOT / build["dockerfile"]).read_text()
    declared = dict(re.findall(r"^ARG (\w+)=(\S*)$", dockerfile, re.MULTILINE))
    assert set(build["args"]) == set(declared), service
    # the CPU image's variables are the Dockerfile's names, the GPU image's GPU_<name>
    prefix = "GPU_" if service == "worker-gpu" else ""
    for name, value in build["args"].items():
        found = re.fullmatch(r"\$\{(\w+):?-(.*)\}", value)
        assert found, (service, name, value)
        assert (found.group(1), found.group(2)) == (prefix + name, declared[name]), service


def test_the_api_and_the_webhook_deliverers_reach_the_host_by_name(
    services: dict[str, Any],
) -> None:
    """A receiver on the host is `host.docker.internal` (Docker's host-gateway), which every
    service that checks or sends a webhook (the API when one is registered, the webhooks service
    before each delivery) and the workers (a judge model on the host) resolve; the bridge's
    gateway address changes on every `down`/`up`."""
    for name in ("api", "webhooks", "worker-cpu", "worker-gpu"):
        assert services[name]["extra_hosts"] == ["host.docker.internal:host-gateway"], name


def test_every_pdppo_variable_is_a_setting(services: dict[str, Any]) -> None:
    fields = set(Settings.model_fields)
    env_example = DEPLOY / ".env.example"
    names: set[str] = set()
    for service in services.values():
        names |= {k for k in _env(service) if k.startswith("PDPPO_")}
    names |= set(re.findall(r"^(PDPPO_\w+)=", env_example.read_text(), re.MULTILINE))
    names |= set(re.findall(r"\$\{(PDPPO_\w+)", COMPOSE_PATH.read_text()))
    assert {"PDPPO_REDIS_URL", "PDPPO_API_KEYS", "PDPPO_ARTIFACT_DIR"} <= names
    unknown = sorted(n for n in names if n.removeprefix("PDPPO_").lower() not in fields)
    assert unknown == [], f"not fields of pdppo.settings.Settings: {unknown}"


def _shared_env_defaults() -> dict[str, str | None]:
    """x-pdppo-env, the variables every pdppo service gets: name -> the default its
    `${NAME:-default}` gives (None where the value is fixed or comes from another variable)."""
    text = COMPOSE_PATH.read_text()
    block = text[text.index("x-pdppo-env:") : text.index("\nx-worker:")]
    out: dict[str, str | None] = {}
    for name, value in re.findall(r"^  (PDPPO_\w+): (.*)$", block, re.MULTILINE):
        own = re.fullmatch(rf"\$\{{{name}:-(.*)\}}", value)
        out[name] = own.group(1) if own else None
    return out


def test_every_setting_the_env_example_offers_reaches_the_containers() -> None:
    """A container sees only the variables compose lists, whatever deploy/.env holds: nine
    settings that .env.example offered (the HTTP limits, the disk's, retention and quota) were
    set there and read by nothing."""
    offered = set(re.findall(r"(PDPPO_\w+)=", (DEPLOY / ".env.example").read_text()))
    assert {"PDPPO_HTTP_MAX_CONNECTIONS", "PDPPO_RETENTION_DAYS"} <= offered
    assert sorted(offered - set(_shared_env_defaults())) == []


def test_each_compose_default_is_the_settings_own() -> None:
    """Unset in deploy/.env, a setting behaves as `pdppo serve` alone would; but the
    environment, which compose deploys as production on purpose."""
    from pydantic import TypeAdapter

    checked = 0
    for name, default in _shared_env_defaults().items():
        field = Settings.model_fields[name.removeprefix("PDPPO_").lower()]
        if default is None or name == "PDPPO_ENVIRONMENT" or field.default_factory is not None:
            continue
        kind = TypeAdapter(field.annotation)
        parsed = kind.validate_json(default) if default.startswith("[") else default
        assert kind.validate_python(parsed, strict=False) == field.default, name
        checked += 1
    assert checked >= 20


def test_every_pdppo_service_reaches_redis_by_service_name(services: dict[str, Any]) -> None:
    for name in (*PDPPO_SERVICES, "webhooks"):
        assert _env(services[name])["PDPPO_REDIS_URL"].startswith("redis://redis:"), name
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"


def test_env_example_is_a_valid_production_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """Someone copies .env.example and edits only the keys: the rest must load as-is."""
    for line in (DEPLOY / ".env.example").read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep and name.startswith("PDPPO_"):
            monkeypatch.setenv(name, value)
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.environment == "production"
    assert settings.tenants_by_key


def _gpu_script_invocation() -> list[str]:
    script = (DEPLOY / "gpu-workers.sh").read_text()
    line = next(
        x for x in script.splitlines() if re.match(r"\s*CUDA_VISIBLE_DEVICES=\S+ pdppo ", x)
    )
    words = shlex.split(line.strip().rstrip("&"))
    return [w for w in words[1:] if w != "&"]


def test_webhooks_service_runs_the_webhook_worker_like_a_cpu_worker(
    services: dict[str, Any],
) -> None:
    """No GPU, the CPU image, restarted as the workers are, and a healthcheck that pings the
    node name its command sets (tests/client/test_webhooks_cli runs that check for real)."""
    hooks, cpu = services["webhooks"], services["worker-cpu"]
    assert _command(hooks) == ["pdppo", "webhook-worker", "--name", "pdppo-webhooks@%h"]
    assert hooks["image"] == cpu["image"] and hooks["build"] == cpu["build"]
    assert "deploy" not in hooks and "profiles" not in hooks
    assert hooks["restart"] == cpu["restart"] == "unless-stopped"
    assert _env(hooks) == _env(services["api"])  # the same settings as the API that registers
    assert "PDPPO_WEBHOOK_ALLOWED_NETWORKS" in _env(hooks)
    test = hooks["healthcheck"]["test"]
    assert (
        test[:3] == ["CMD", "python", "-c"]
        and "'pdppo-webhooks@' + socket.gethostname()" in (test[3])
    )


def test_sample_service_runs_the_sample_worker_on_the_artifacts(
    services: dict[str, Any],
) -> None:
    """The CPU image, the API's settings (its limits and timeout), the final models read-only
    where the API finds them, and a healthcheck that pings the node name its command sets."""
    sample, cpu = services["sample"], services["worker-cpu"]
    assert _command(sample) == ["pdppo", "sample-worker", "--name", "pdppo-sample@%h"]
    assert sample["image"] == cpu["image"] and sample["build"] == cpu["build"]
    assert "deploy" not in sample and "profiles" not in sample
    assert sample["restart"] == "unless-stopped"
    assert _env(sample) == _env(services["api"])
    assert sample["volumes"] == [f"artifacts:{_env(services['api'])['PDPPO_ARTIFACT_DIR']}:ro"]
    test = sample["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    assert "'pdppo-sample@' + socket.gethostname()" in test[3]
    assert "workers.sample_app" in test[3]


@pytest.mark.parametrize("service", [*PDPPO_SERVICES, "webhooks", "sample"])
def test_service_command_is_a_real_cli_invocation(services: dict[str, Any], service: str) -> None:
    """`pdppo serve/worker` with exactly these options must parse (checked via --help)."""
    argv = _command(services[service])
    if argv == ["pdppo-gpu-workers"]:
        argv = _gpu_script_invocation()
    assert argv[0] == "pdppo"
    subcommand = main.commands[argv[1]]
    known = {opt for param in subcommand.params for opt in getattr(param, "opts", [])}
    options = [a for a in argv[2:] if a.startswith("--")]
    assert set(options) <= known, f"{service}: {set(options) - known} unknown to pdppo {argv[1]}"
    result = CliRunner().invoke(main, [*argv[1:], "--help"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.gpu"])
def test_dockerfiles_copy_what_exists_and_install_pinned_versions(dockerfile: str) -> None:
    text = (DEPLOY / dockerfile).read_text()
    defaults = dict(re.findall(r"^ARG (\w+)=(\S*)$", text, re.MULTILINE))
    ignore = (DEPLOY / f"{dockerfile}.dockerignore").read_text()
    for sources in re.findall(r"^COPY\s+(.+)\s+\S+$", text, re.MULTILINE):
        if "--from=" in sources:  # from an earlier stage, not the build context
            continue
        for source in (w for w in sources.split() if not w.startswith("--")):
            source = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], source)
            assert (ROOT / source).exists(), f"{dockerfile} copies missing {source}"
            assert f"!{source}" in ignore, f"{source} is not in the build context"
    # every install that resolves dependencies is pinned (the CPU image's torch by its version)
    installs = [i for i in re.findall(r"pip install [^&]*", text) if "--no-deps" not in i]
    assert installs
    for install in installs:
        assert "--constraint /constraints.txt" in install or '"torch==${TORCH_VERSION}"' in install
    assert re.search(r"^USER\s+\w+", text, re.MULTILINE), "run as a non-root user"
    assert "!pdppo/" in ignore and "!core/" in ignore
