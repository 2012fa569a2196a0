"""deploy/kubernetes/ rendered by `kubectl kustomize` and read as data, against the compose file
it follows (deploy/docker-compose.yml, itself run for real by .ci/compose): the same images,
commands, health checks, settings and volumes; the GPU workers' devices; the security context;
Redis that persists and never evicts. The API is started with the rendered settings and answers
its probes' and Prometheus's paths. No cluster runs here (tests/deploy/kubernetes.py says what
"valid" means without one), so a broken manifest must fail the offline validation: shown below.
"""

from __future__ import annotations

import base64
import copy
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from pydantic import TypeAdapter

from pdppo.settings import Settings
from tests.deploy.kubernetes import (
    KUBE_DIR,
    Manifest,
    check,
    kind_name,
    main,
    overlays,
    pod_templates,
    prepared_tree,
    render,
    schema_errors,
)
from tests.support.stack import RedisServer, Service

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_PATH = ROOT / "deploy" / "docker-compose.yml"

# compose service -> (the overlay that has it, its workload's kind and name)
WORKLOADS = {
    "redis": ("cpu-only", "StatefulSet", "redis"),
    "api": ("cpu-only", "Deployment", "api"),
    "worker-cpu": ("cpu-only", "Deployment", "worker-cpu"),
    "webhooks": ("cpu-only", "Deployment", "webhooks"),
    "sample": ("cpu-only", "Deployment", "sample"),
    "worker-gpu": ("gpu", "Deployment", "worker-gpu"),
    "flower": ("monitoring", "Deployment", "flower"),
}
PDPPO_SERVICES = ("api", "worker-cpu", "worker-gpu", "webhooks", "sample")
SECRET_SETTINGS = {"PDPPO_API_KEYS", "PDPPO_WEBHOOK_SECRET_KEYS", "PDPPO_SCORE_MODEL_API_KEY"}
# Where Kubernetes differs from compose on purpose (each said in its manifest): the GPU workers'
# settings offer the vLLM their image has; a worker's torch threads follow its pod's CPU limit,
# which compose's containers do not have.
K8S_ONLY_VALUES = {"worker-gpu": {"PDPPO_ROLLOUT_ENGINES": '["hf","vllm"]'}}
K8S_ONLY_VARIABLES = {"worker-cpu": {"PDPPO_JOB_THREADS"}, "worker-gpu": {"PDPPO_JOB_THREADS"}}
K8S_ONLY_ARGS = {"redis": ["--maxmemory", "3gb"]}
# The users of the images compose does not build (redis:7.4-alpine's `redis`, mher/flower's
# `flower`), as their Dockerfiles create them.
UPSTREAM_UIDS = {"redis": (999, 1000), "mher/flower": (1000, 1000)}


# --- reading compose and the renders -----------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_PATH.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepared_tree(tmp_path_factory.mktemp("k8s") / "deploy" / "kubernetes")


@pytest.fixture(scope="module")
def renders(tree: Path) -> dict[str, list[Manifest]]:
    return {overlay: render(tree / "overlays" / overlay) for overlay in overlays()}


def default(value: str) -> str | None:
    """A compose value with each `${NAME:-default}` (or `${NAME-default}`) at its default; None
    for a required one (`${NAME:?message}`), which the operator must give."""
    if re.search(r"\$\{\w+:\?", value):
        return None
    return re.sub(r"\$\{\w+:?-([^}]*)\}", r"\1", value)


def compose_env(service: dict[str, Any]) -> dict[str, str | None]:
    return {str(k): default(str(v)) for k, v in service.get("environment", {}).items()}


def find(manifests: list[Manifest], kind: str, name: str) -> Manifest:
    """The object of that kind and name; generated ConfigMaps and Secrets by their name before
    kustomize's hash suffix."""
    for manifest in manifests:
        got = manifest["metadata"]["name"]
        generated = kind in ("ConfigMap", "Secret") and re.fullmatch(rf"{name}-[a-z0-9]{{10}}", got)
        if manifest["kind"] == kind and (got == name or generated):
            return manifest
    raise AssertionError(f"no {kind}/{name} in the render")


def data(manifest: Manifest) -> dict[str, str]:
    """A ConfigMap's data or a Secret's, decoded."""
    if manifest["kind"] == "Secret":
        return {k: base64.b64decode(v).decode() for k, v in manifest.get("data", {}).items()}
    return dict(manifest.get("data", {}))


def container(manifests: list[Manifest], service: str) -> Manifest:
    _, kind, name = WORKLOADS[service]
    pod = find(manifests, kind, name)["spec"]["template"]
    (only,) = pod["spec"]["containers"]
    return dict(only)


def pod_spec(manifests: list[Manifest], service: str) -> dict[str, Any]:
    _, kind, name = WORKLOADS[service]
    return dict(find(manifests, kind, name)["spec"]["template"]["spec"])


def by_name(manifests: list[Manifest], kind: str, name: str) -> Manifest:
    return next(m for m in manifests if m["kind"] == kind and m["metadata"]["name"] == name)


def env_of(manifests: list[Manifest], box: Manifest) -> dict[str, str]:
    """What a container's environment holds: its envFrom sources in order (a later one wins),
    then its `env` (a value from a resource field reads `resourceFieldRef:<resource>/<divisor>`)."""
    out: dict[str, str] = {}
    for source in box.get("envFrom", []):
        if "configMapRef" in source:
            out |= data(by_name(manifests, "ConfigMap", source["configMapRef"]["name"]))
        else:
            out |= data(by_name(manifests, "Secret", source["secretRef"]["name"]))
    for var in box.get("env", []):
        ref = var.get("valueFrom", {})
        if "value" in var:
            out[var["name"]] = var["value"]
        elif "secretKeyRef" in ref:
            secret = data(by_name(manifests, "Secret", ref["secretKeyRef"]["name"]))
            out[var["name"]] = secret[ref["secretKeyRef"]["key"]]
        elif "configMapKeyRef" in ref:
            config = data(by_name(manifests, "ConfigMap", ref["configMapKeyRef"]["name"]))
            out[var["name"]] = config[ref["configMapKeyRef"]["key"]]
        else:
            field = ref["resourceFieldRef"]
            out[var["name"]] = f"resourceFieldRef:{field['resource']}/{field['divisor']}"
    return out


def command_of(manifests: list[Manifest], box: Manifest) -> list[str]:
    """The container's command as it runs: `$(VAR)` replaced from its environment."""
    env = env_of(manifests, box)
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], str(a)) for a in box["command"]]


def quantity(value: str | int) -> float:
    """A Kubernetes quantity (or Redis's `3gb`) in its unit: bytes, cores."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "gb": 2**30, "mb": 2**20, "m": 1e-3}
    found = re.fullmatch(r"(\d+)([A-Za-z]*)", str(value))
    assert found, value
    return int(found.group(1)) * units.get(found.group(2), 1)


def seconds(duration: str) -> int:
    found = re.fullmatch(r"(\d+)([ms])", duration)
    assert found, duration
    return int(found.group(1)) * (60 if found.group(2) == "m" else 1)


# --- rendered and valid ------------------------------------------------------------------------


def test_the_overlays_are_those_the_docs_describe() -> None:
    assert overlays() == ["cpu-only", "external-redis", "gpu", "monitoring"]
    page = (ROOT / "docs" / "operators" / "kubernetes.md").read_text()
    for part in [*overlays(), "components/gpu", "components/flower", "components/external-redis"]:
        assert f"`{part}`" in page or f"{part}/" in page, part
    assert "operators/kubernetes.md" in (ROOT / "mkdocs.yml").read_text()
    run = (ROOT / ".ci" / "run").read_text()
    assert "beside kubernetes .ci/kubernetes\n" in run and "joined kubernetes\n" in run


@pytest.mark.parametrize(
    ("overlay", "workloads"),
    [
        (
            "cpu-only",
            {
                "Deployment": ["api", "sample", "webhooks", "worker-cpu"],
                "StatefulSet": ["redis"],
                "Service": ["api", "redis", "redis-headless"],
            },
        ),
        (
            "gpu",
            {
                "Deployment": ["api", "sample", "webhooks", "worker-cpu", "worker-gpu"],
                "StatefulSet": ["redis"],
                "Service": ["api", "redis", "redis-headless"],
            },
        ),
        (
            "external-redis",
            {
                "Deployment": ["api", "sample", "webhooks", "worker-cpu"],
                "StatefulSet": [],
                "Service": ["api"],
            },
        ),
        (
            "monitoring",
            {
                "Deployment": ["api", "flower", "sample", "webhooks", "worker-cpu"],
                "StatefulSet": ["redis"],
                "Service": ["api", "flower", "redis", "redis-headless"],
            },
        ),
    ],
)
def test_every_overlay_renders_valid_with_its_workloads(
    renders: dict[str, list[Manifest]], overlay: str, workloads: dict[str, list[str]]
) -> None:
    manifests = renders[overlay]
    assert check(manifests) == []
    for kind, names in workloads.items():
        assert sorted(m["metadata"]["name"] for m in manifests if m["kind"] == kind) == names
    assert {m["metadata"].get("namespace") for m in manifests if m["kind"] != "Namespace"} == {
        "pdppo"
    }


def test_the_components_combine(tree: Path) -> None:
    """GPU workers, Flower and an external Redis at once, as an operator's own overlay would."""
    mine = tree / "overlays" / "mine"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources: [../../base]\n"
        "components: [../../components/gpu, ../../components/flower,"
        " ../../components/external-redis]\n"
    )
    manifests = render(mine)
    assert check(manifests) == []
    assert [m for m in manifests if m["kind"] == "StatefulSet"] == []
    url = "redis://:change-me@redis.example.internal:6379/0"
    assert command_of(manifests, container(manifests, "flower"))[1] == f"--broker={url}"
    assert env_of(manifests, container(manifests, "worker-gpu"))["PDPPO_REDIS_URL"] == url


def test_the_docs_overlay_of_ones_own_renders_what_it_says(tree: Path) -> None:
    """docs/operators/kubernetes.md's example, at the root of a checkout: its images (the GPU
    one too), its setting and its replicas reach the render."""
    page = (ROOT / "docs" / "operators" / "kubernetes.md").read_text()
    (example,) = re.findall(r"```yaml\n# my-overlay/kustomization.yaml\n(.*?)```", page, re.S)
    mine = tree.parents[1] / "my-overlay"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(example)
    manifests = render(mine)
    assert check(manifests) == []
    images = {s: container(manifests, s)["image"] for s in ("api", "worker-cpu", "worker-gpu")}
    assert images == {
        "api": "registry.example.com/pdppo:1.0",
        "worker-cpu": "registry.example.com/pdppo:1.0",
        "worker-gpu": "registry.example.com/pdppo-gpu:1.0",
    }
    assert find(manifests, "Deployment", "worker-gpu")["spec"]["replicas"] == 8
    config = data(find(manifests, "ConfigMap", "pdppo-settings"))
    assert config["PDPPO_RETENTION_DAYS"] == "30"
    assert config["PDPPO_ROLLOUT_ENGINES"] == '["hf","vllm"]'  # the GPU component's


@pytest.mark.parametrize(
    ("overlay", "missing"),
    [
        ("cpu-only", "base/secrets.env"),
        ("gpu", "base/secrets.env"),
        ("monitoring", "components/flower/flower.env"),
        ("external-redis", "components/external-redis/redis.env"),
    ],
)
def test_no_render_without_the_operators_secrets(
    tmp_path: Path, overlay: str, missing: str
) -> None:
    """As compose refuses to start without PDPPO_API_KEYS: the example values are never
    deployed by accident, since the generators read only the files the operator makes."""
    tree = prepared_tree(tmp_path / "kubernetes")
    (tree / missing).unlink()
    with pytest.raises(RuntimeError, match=re.escape(Path(missing).name)):
        render(tree / "overlays" / overlay)


def _api(manifests: list[Manifest]) -> Manifest:
    return copy.deepcopy(find(manifests, "Deployment", "api"))


def _box(workload: Manifest) -> dict[str, Any]:
    box: dict[str, Any] = workload["spec"]["template"]["spec"]["containers"][0]
    return box


def _unknown_field(ms: list[Manifest]) -> None:
    api = _api(ms)
    _box(api)["readinessprobe"] = {"httpGet": {"path": "/readyz", "port": "http"}}
    ms[ms.index(find(ms, "Deployment", "api"))] = api


def _wrong_type(ms: list[Manifest]) -> None:
    api = _api(ms)
    _box(api)["ports"][0]["containerPort"] = "eight thousand"
    ms[ms.index(find(ms, "Deployment", "api"))] = api


def _no_name(ms: list[Manifest]) -> None:
    api = _api(ms)
    del _box(api)["name"]
    ms[ms.index(find(ms, "Deployment", "api"))] = api


def _removed_api(ms: list[Manifest]) -> None:
    api = _api(ms)
    api["apiVersion"] = "extensions/v1beta1"  # gone since Kubernetes 1.16
    ms[ms.index(find(ms, "Deployment", "api"))] = api


def _misspelled_config(ms: list[Manifest]) -> None:
    api = _api(ms)
    _box(api)["envFrom"][0]["configMapRef"]["name"] = "pdppo-setings"
    ms[ms.index(find(ms, "Deployment", "api"))] = api


def _selects_nothing(ms: list[Manifest]) -> None:
    service = copy.deepcopy(by_name(ms, "Service", "api"))
    service["spec"]["selector"]["app.kubernetes.io/component"] = "apii"
    ms[ms.index(by_name(ms, "Service", "api"))] = service


@pytest.mark.parametrize(
    ("breakage", "error"),
    [
        (
            _unknown_field,
            "Deployment/api: spec.template.spec.containers.0: Additional properties are not "
            "allowed ('readinessprobe' was unexpected)",
        ),
        (
            _wrong_type,
            "Deployment/api: spec.template.spec.containers.0.ports.0.containerPort: "
            "'eight thousand' is not of type 'integer'",
        ),
        (
            _no_name,
            "Deployment/api: spec.template.spec.containers.0: 'name' is a required property",
        ),
        (
            _removed_api,
            "Deployment/api: Couldn't find schema for kind Deployment with api version "
            "extensions/v1beta1 for kubernetes version 1.32",
        ),
        (
            _misspelled_config,
            "Deployment/api: refers to ConfigMap/pdppo-setings, which is not rendered in its "
            "namespace (pdppo)",
        ),
        (_selects_nothing, "Service/api: selects no pod in its namespace (pdppo)"),
    ],
)
def test_a_broken_manifest_fails_validation(
    renders: dict[str, list[Manifest]], breakage: Callable[[list[Manifest]], None], error: str
) -> None:
    manifests = list(renders["cpu-only"])
    assert check(manifests) == []
    breakage(manifests)
    assert check(manifests) == [error]


def test_the_ci_step_fails_on_a_broken_manifest_and_says_which(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """.ci/kubernetes (`python -m tests.deploy.kubernetes`) on a tree whose API Deployment has a
    misspelled field: every overlay that has the API fails, with the field named."""
    broken = tmp_path / "kubernetes"
    shutil.copytree(KUBE_DIR, broken)
    api = broken / "base" / "api.yaml"
    api.write_text(api.read_text().replace("readinessProbe:", "readinesProbe:"))
    assert main(broken) == 1
    out = capsys.readouterr().out
    said = "Additional properties are not allowed ('readinesProbe' was unexpected)"
    for overlay in overlays():
        assert re.search(rf"^overlays/{overlay}: \d+ objects .*: 1 error \(", out, re.M), out
    assert out.count(f"  Deployment/api: spec.template.spec.containers.0: {said}") == 4
    assert main(KUBE_DIR) == 0


def test_the_schemas_are_those_of_the_pinned_release(renders: dict[str, list[Manifest]]) -> None:
    """A field that a later release added is refused at the pinned one: a container's
    `lifecycle.stopSignal` came in Kubernetes 1.33, so a cluster of 1.32 would reject it."""
    api = _api(renders["cpu-only"])
    _box(api)["lifecycle"] = {"stopSignal": "SIGTERM"}
    assert schema_errors(api, "1.33.0") == []
    assert schema_errors(api) == [
        "Deployment/api: spec.template.spec.containers.0.lifecycle: Additional properties are "
        "not allowed ('stopSignal' was unexpected)"
    ]


# --- as compose runs it ------------------------------------------------------------------------


def test_every_compose_service_has_its_workload(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == set(WORKLOADS)


@pytest.mark.parametrize("service", list(WORKLOADS))
def test_images_and_commands_are_composes(
    renders: dict[str, list[Manifest]], compose: dict[str, Any], service: str
) -> None:
    overlay = WORKLOADS[service][0]
    manifests, theirs = renders[overlay], compose["services"][service]
    box = container(manifests, service)
    assert box["image"] == default(theirs["image"])
    assert command_of(manifests, box) == [*theirs["command"], *K8S_ONLY_ARGS.get(service, [])]


@pytest.mark.parametrize("service", list(WORKLOADS))
def test_health_checks_are_composes(
    renders: dict[str, list[Manifest]], compose: dict[str, Any], service: str
) -> None:
    """Each probe runs compose's healthcheck: the same command, or a GET of the same path and
    port; the API's liveness asks /healthz, which does not fail on a Redis outage (a restart
    would not cure it), and its readiness compose's /readyz."""
    manifests, theirs = renders[WORKLOADS[service][0]], compose["services"][service]
    box = container(manifests, service)
    test = theirs["healthcheck"]["test"]
    assert test[0] == "CMD"
    url = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", " ".join(test))
    probes = {k: box[k] for k in ("startupProbe", "readinessProbe", "livenessProbe") if k in box}
    assert "livenessProbe" in probes
    ports = {p["name"]: p["containerPort"] for p in box.get("ports", [])}
    if url is None:
        assert {k: p["exec"]["command"] for k, p in probes.items()} == dict.fromkeys(
            probes, test[1:]
        )
        return
    gets = {k: (ports[p["httpGet"]["port"]], p["httpGet"]["path"]) for k, p in probes.items()}
    theirs_get = (int(url.group(1)), url.group(2))
    if service == "api":
        assert gets == {
            "startupProbe": (8000, "/healthz"),
            "readinessProbe": theirs_get,
            "livenessProbe": (8000, "/healthz"),
        }
    else:
        assert gets == dict.fromkeys(probes, theirs_get)


GRACE = {"worker-cpu": 120, "worker-gpu": 120, "webhooks": 30, "sample": 30}


def test_every_service_compose_gives_a_grace_period_is_in_the_table(
    compose: dict[str, Any],
) -> None:
    services = compose["services"].items()
    graced = {n: seconds(s["stop_grace_period"]) for n, s in services if "stop_grace_period" in s}
    assert graced == GRACE


@pytest.mark.parametrize("service", list(GRACE))
def test_a_stopped_pod_has_composes_grace_period_to_checkpoint(
    renders: dict[str, list[Manifest]], service: str
) -> None:
    spec = pod_spec(renders[WORKLOADS[service][0]], service)
    assert spec["terminationGracePeriodSeconds"] == GRACE[service]


@pytest.mark.parametrize("service", PDPPO_SERVICES)
def test_every_setting_compose_passes_reaches_the_pods(
    renders: dict[str, list[Manifest]], compose: dict[str, Any], service: str
) -> None:
    """The same variables with the same values: compose's default where it has one, the
    operator's secret where compose requires one."""
    manifests = renders[WORKLOADS[service][0]]
    ours = env_of(manifests, container(manifests, service))
    theirs = compose_env(compose["services"][service])
    assert set(ours) - set(theirs) == K8S_ONLY_VARIABLES.get(service, set())
    secrets = data(find(manifests, "Secret", "pdppo-secrets"))
    expected = {
        name: secrets[name] if value is None else value for name, value in theirs.items()
    } | K8S_ONLY_VALUES.get(service, {})
    assert {name: ours[name] for name in theirs} == expected


def test_the_settings_are_split_between_the_configmap_and_the_secrets(
    renders: dict[str, list[Manifest]], compose: dict[str, Any]
) -> None:
    manifests = renders["cpu-only"]
    config = data(find(manifests, "ConfigMap", "pdppo-settings"))
    secrets = data(find(manifests, "Secret", "pdppo-secrets"))
    assert set(secrets) == SECRET_SETTINGS
    assert data(find(manifests, "Secret", "pdppo-redis")) == {
        "PDPPO_REDIS_URL": compose_env(compose["services"]["api"])["PDPPO_REDIS_URL"]
    }
    assert not set(config) & (SECRET_SETTINGS | {"PDPPO_REDIS_URL"})
    offered = set(re.findall(r"(PDPPO_\w+)=", (ROOT / "deploy" / ".env.example").read_text()))
    assert {"PDPPO_HTTP_MAX_CONNECTIONS", "PDPPO_RETENTION_DAYS"} <= offered
    assert sorted(offered - set(config) - set(secrets)) == []
    fields = set(Settings.model_fields)
    unknown = [n for n in [*config, *secrets] if n != "HF_HOME"]
    assert [n for n in unknown if n.removeprefix("PDPPO_").lower() not in fields] == []


def test_each_configmap_default_is_the_settings_own(renders: dict[str, list[Manifest]]) -> None:
    """Unset by the operator, a setting behaves as `pdppo serve` alone would; but the
    environment (production, as compose deploys) and the paths the pods mount."""
    config = data(find(renders["cpu-only"], "ConfigMap", "pdppo-settings"))
    fixed = {"PDPPO_ENVIRONMENT", "PDPPO_ARTIFACT_DIR", "PDPPO_DATA_ROOTS", "HF_HOME"}
    assert {k: config[k] for k in sorted(fixed)} == {
        "HF_HOME": "/home/pdppo/.cache/huggingface",
        "PDPPO_ARTIFACT_DIR": "/artifacts",
        "PDPPO_DATA_ROOTS": "/data",
        "PDPPO_ENVIRONMENT": "production",
    }
    checked = 0
    for name, value in config.items():
        field = Settings.model_fields.get(name.removeprefix("PDPPO_").lower())
        if name in fixed or field is None or field.default_factory is not None:
            continue  # rollout_engines' default is what this process can import (compose: hf)
        kind = TypeAdapter(field.annotation)
        parsed = kind.validate_json(value) if value.startswith("[") else value
        assert kind.validate_python(parsed, strict=False) == field.default, name
        checked += 1
    assert (checked, config["PDPPO_ROLLOUT_ENGINES"]) == (20, '["hf"]')


def test_the_example_secrets_are_a_valid_production_config(
    renders: dict[str, list[Manifest]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator who replaces only the keys gets settings that load, in production."""
    manifests = renders["cpu-only"]
    env = env_of(manifests, container(manifests, "api"))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.environment == "production"
    assert settings.tenants_by_key == {"change-me-to-a-long-random-key": "team-a"}
    example = (ROOT / "deploy" / ".env.example").read_text()
    for name in ("PDPPO_API_KEYS", "PDPPO_WEBHOOK_SECRET_KEYS"):
        assert f"{name}={env[name]}\n" in example  # the same placeholders as compose's


# --- the pods ----------------------------------------------------------------------------------


def test_gpu_workers_get_their_gpus_and_take_jobs_of_that_many(
    renders: dict[str, list[Manifest]], compose: dict[str, Any]
) -> None:
    """One pod, one worker, one job at a time on its GPUS_PER_WORKER GPUs (deploy/gpu-workers.sh
    starts one worker per GPUS_PER_WORKER GPUs it sees, and a pod sees the ones it was given):
    the GPUs it asks for, GPUS_PER_WORKER, the API's PDPPO_MAX_JOB_DEVICES and the share of
    the CPU limit each rank's threads get are one number."""
    manifests = renders["gpu"]
    box = container(manifests, "worker-gpu")
    env = env_of(manifests, box)
    gpus = box["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus == 1
    assert "nvidia.com/gpu" not in box["resources"].get("requests", {})
    assert int(env["GPUS_PER_WORKER"]) == gpus
    assert env["WORKER_GPUS"] == ""  # every GPU the pod sees
    api_env = env_of(manifests, container(manifests, "api"))
    assert int(api_env["PDPPO_MAX_JOB_DEVICES"]) == gpus
    assert env["PDPPO_JOB_THREADS"] == f"resourceFieldRef:limits.cpu/{gpus}"
    assert api_env["PDPPO_ROLLOUT_ENGINES"] == '["hf","vllm"]'
    assert (
        compose_env(compose["services"]["worker-gpu"])["GPUS_PER_WORKER"] == env["GPUS_PER_WORKER"]
    )
    spec = pod_spec(manifests, "worker-gpu")
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    shm = next(v for v in spec["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "shm", "mountPath": "/dev/shm"} in box["volumeMounts"]


@pytest.mark.parametrize("overlay", overlays())
def test_only_the_gpu_workers_ask_for_gpus(
    renders: dict[str, list[Manifest]], overlay: str
) -> None:
    asking = [
        workload["metadata"]["name"]
        for workload, pod in pod_templates(renders[overlay])
        for box in pod["spec"]["containers"]
        if "nvidia.com/gpu" in box["resources"].get("limits", {})
    ]
    assert asking == (["worker-gpu"] if overlay == "gpu" else [])


def test_the_cpu_workers_threads_follow_their_cpu_limit(
    renders: dict[str, list[Manifest]],
) -> None:
    manifests = renders["cpu-only"]
    box = container(manifests, "worker-cpu")
    assert env_of(manifests, box)["PDPPO_JOB_THREADS"] == "resourceFieldRef:limits.cpu/1"
    assert box["resources"]["limits"]["cpu"] == box["resources"]["requests"]["cpu"] == "4"


def _image_users() -> dict[str, tuple[int, int]]:
    """image -> (uid, gid) its processes run as: the pdppo images' from their Dockerfiles."""
    users = dict(UPSTREAM_UIDS)
    for image, dockerfile in (("pdppo", "Dockerfile"), ("pdppo-gpu", "Dockerfile.gpu")):
        text = (ROOT / "deploy" / dockerfile).read_text()
        uid = re.search(r"useradd --create-home --uid (\d+) pdppo", text)
        assert uid and re.search(r"^USER pdppo$", text, re.M), dockerfile
        users[image] = (int(uid.group(1)), int(uid.group(1)))  # useradd's group: its own gid
    return users


@pytest.mark.parametrize("overlay", overlays())
def test_every_pod_runs_as_its_images_user_and_meets_the_restricted_profile(
    renders: dict[str, list[Manifest]], overlay: str
) -> None:
    users = _image_users()
    assert users["pdppo"] == (1000, 1000)
    checked = 0
    for workload, pod in pod_templates(renders[overlay]):
        spec, where = pod["spec"], workload["metadata"]["name"]
        context = spec["securityContext"]
        (box,) = spec["containers"]
        image = box["image"].rsplit(":", 1)[0]
        assert (context["runAsUser"], context["runAsGroup"]) == users[image], where
        assert context["runAsNonRoot"] is True, where
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert box["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        }, where
        assert not {"hostNetwork", "hostPID", "hostIPC"} & set(spec), where
        kinds = {k for v in spec.get("volumes", []) for k in v if k != "name"}
        assert kinds <= {"persistentVolumeClaim", "emptyDir"}, where
        if spec.get("volumes") or workload["kind"] == "StatefulSet":
            assert context["fsGroup"] == users[image][1], where
        checked += 1
    assert checked == {"cpu-only": 5, "gpu": 6, "external-redis": 4, "monitoring": 6}[overlay]
    namespace = find(renders[overlay], "Namespace", "pdppo")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_redis_persists_never_evicts_and_refuses_writes_before_its_memory_limit(
    renders: dict[str, list[Manifest]], compose: dict[str, Any]
) -> None:
    manifests = renders["cpu-only"]
    box = container(manifests, "redis")
    args = box["command"]
    assert args[0] == "redis-server"
    options = dict(zip(args[1::2], args[2::2], strict=True))
    assert options["--appendonly"] == "yes"
    assert options["--appendfsync"] == "everysec"
    assert options["--maxmemory-policy"] == "noeviction"
    limit = quantity(box["resources"]["limits"]["memory"])
    assert box["resources"]["requests"]["memory"] == box["resources"]["limits"]["memory"]
    assert quantity(options["--maxmemory"]) == 0.75 * limit
    statefulset = find(manifests, "StatefulSet", "redis")
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert {"name": claim["metadata"]["name"], "mountPath": "/data"} in box["volumeMounts"]
    assert compose["services"]["redis"]["volumes"] == ["redis-data:/data"]
    policy = find(manifests, "NetworkPolicy", "redis")
    assert policy["spec"]["ingress"] == [
        {
            "from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "pdppo"}}}],
            "ports": [{"port": 6379}],
        }
    ]
    pdppo_pods = [pod for _, pod in pod_templates(manifests)]
    assert all(p["metadata"]["labels"]["app.kubernetes.io/part-of"] == "pdppo" for p in pdppo_pods)


# compose volume (or bind mount) -> the claim that stands for it
CLAIMS = {
    "artifacts": "pdppo-artifacts",
    "hf-cache": "pdppo-hf-cache",
    "${DATA_DIR:-./data}": "pdppo-data",
}


@pytest.mark.parametrize("service", PDPPO_SERVICES)
def test_the_shared_volumes_are_mounted_as_compose_mounts_them(
    renders: dict[str, list[Manifest]], compose: dict[str, Any], service: str
) -> None:
    """The same folders, read-only where compose mounts them so (the data root on the workers,
    the artifacts on the sample workers); every claim they share is ReadWriteMany."""
    manifests = renders[WORKLOADS[service][0]]
    theirs = set()
    for entry in compose["services"][service].get("volumes", []):
        # source:target[:mode], where the source may be `${VAR:-default}` (a colon of its own)
        found = re.fullmatch(r"(.+):(/[^:]*)(?::(ro|rw))?", str(entry))
        assert found, entry
        theirs.add((CLAIMS[found.group(1)], found.group(2), found.group(3) == "ro"))
    claims = {
        v["name"]: v["persistentVolumeClaim"]
        for v in pod_spec(manifests, service).get("volumes", [])
        if "persistentVolumeClaim" in v
    }
    ours = set()
    for mount in container(manifests, service).get("volumeMounts", []):
        if mount["name"] in claims:
            claim = claims[mount["name"]]
            read_only = mount.get("readOnly", False)
            assert read_only == claim.get("readOnly", False), (service, mount)
            ours.add((claim["claimName"], mount["mountPath"], read_only))
    assert ours == theirs
    for claim, _, _ in ours:
        assert find(manifests, "PersistentVolumeClaim", claim)["spec"]["accessModes"] == [
            "ReadWriteMany"
        ]


def test_prometheus_scrapes_the_apis_metrics_port(renders: dict[str, list[Manifest]]) -> None:
    manifests = renders["cpu-only"]
    pod = find(manifests, "Deployment", "api")["spec"]["template"]
    assert pod["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8000",
        "prometheus.io/path": "/metrics",
    }
    box = container(manifests, "api")
    assert box["ports"] == [{"name": "http", "containerPort": 8000}]
    assert box["command"][-2:] == ["--port", "8000"]
    service = by_name(manifests, "Service", "api")
    assert service["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http"}]


def test_external_redis_replaces_the_statefulset_and_the_url(
    renders: dict[str, list[Manifest]], tree: Path
) -> None:
    manifests = renders["external-redis"]
    names = [kind_name(m) for m in manifests if m["kind"] != "Secret"]
    assert [n for n in names if "redis" in n] == []
    example = (tree / "components" / "external-redis" / "redis.env.example").read_text()
    (url,) = re.findall(r"^PDPPO_REDIS_URL=(.+)$", example, re.M)
    for service in ("api", "worker-cpu", "webhooks", "sample"):
        assert env_of(manifests, container(manifests, service))["PDPPO_REDIS_URL"] == url


# --- the API, started with the rendered settings ----------------------------------------------


def test_the_api_starts_with_the_rendered_settings_and_answers_its_probes_and_prometheus(
    renders: dict[str, list[Manifest]], tmp_path: Path
) -> None:
    """`pdppo serve` with the API pod's environment (its ConfigMap and Secrets; Redis and the
    mounted folders moved to this machine's): the paths of its probes and of Prometheus's
    annotation answer 200, in production."""
    manifests = renders["cpu-only"]
    box = container(manifests, "api")
    env = env_of(manifests, box)
    redis = RedisServer(tmp_path)
    env |= {
        "PDPPO_REDIS_URL": redis.url(0),
        "PDPPO_ARTIFACT_DIR": str(tmp_path / "artifacts"),
        "PDPPO_DATA_ROOTS": str(tmp_path),
        "HF_HOME": str(tmp_path / "hf"),
    }
    service = Service(redis, tmp_path / "service", env=env)
    try:
        base = service.start_api()
        probes = ("startupProbe", "readinessProbe", "livenessProbe")
        paths = {box[probe]["httpGet"]["path"] for probe in probes}
        pod = find(manifests, "Deployment", "api")["spec"]["template"]
        paths.add(pod["metadata"]["annotations"]["prometheus.io/path"])
        assert paths == {"/healthz", "/readyz", "/metrics"}
        answers = {path: httpx.get(base + path, timeout=10) for path in sorted(paths)}
        assert {p: r.status_code for p, r in answers.items()} == dict.fromkeys(paths, 200)
        assert answers["/healthz"].json() == {"status": "ok", "detail": None}
        assert answers["/readyz"].json()["status"] == "ok"
        assert "pdppo_service_state_up 1.0" in answers["/metrics"].text
    finally:
        service.stop()
        redis.stop()
