"""deploy/kubernetes/ rendered and validated offline, as .ci/kubernetes runs it
(`python -m tests.deploy.kubernetes`) and tests/deploy/test_kubernetes.py reads it.

No cluster runs here, so "valid" means what can be known without one: each overlay renders with
`kubectl kustomize` (the kustomize built into kubectl) from a copy of the tree whose `*.env`
files are made from their `*.env.example`, as an operator makes them; every object validates
against the Kubernetes schemas of a pinned release (kubernetes-validate, strict: an unknown
field is an error, and so is a kind it has no schema for, which its own CLI only warns about);
and every name an object refers to (a ConfigMap, a Secret, a claim, the pods a Service or a
Deployment selects) is an object of the same render.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBE_DIR = ROOT / "deploy" / "kubernetes"
# The Kubernetes release the manifests are validated against: the oldest the manifests promise
# to run on (docs/operators/kubernetes.md); kubectl here is 1.32 too.
KUBERNETES_VERSION = "1.32.0"

Manifest = dict[str, Any]


def overlays(kube_dir: Path = KUBE_DIR) -> list[str]:
    return sorted(p.parent.name for p in (kube_dir / "overlays").glob("*/kustomization.yaml"))


def prepared_tree(dest: Path, source: Path = KUBE_DIR) -> Path:
    """A copy of deploy/kubernetes at `dest` with each `X.env` made from `X.env.example` (an
    operator's own `X.env` in the checkout is left behind)."""

    def operators(folder: str, names: list[str]) -> set[str]:
        return {n for n in names if n.endswith(".env") and f"{n}.example" in names}

    shutil.copytree(source, dest, ignore=operators)
    for example in dest.rglob("*.env.example"):
        shutil.copyfile(example, example.with_suffix(""))
    return dest


def render(kustomization: Path) -> list[Manifest]:
    """`kubectl kustomize` of a folder, as objects; a failed render raises with kubectl's error."""
    if shutil.which("kubectl") is None:
        raise RuntimeError("kubectl is not on PATH: deploy/kubernetes renders with its kustomize")
    done = subprocess.run(
        ["kubectl", "kustomize", str(kustomization)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {kustomization} failed: {done.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def kind_name(manifest: Manifest) -> str:
    return f"{manifest['kind']}/{manifest['metadata']['name']}"


def schema_errors(manifest: Manifest, version: str = KUBERNETES_VERSION) -> list[str]:
    """Why `manifest` does not validate against Kubernetes `version`'s strict schemas (none when
    it does)."""
    try:
        kubernetes_validate.validate(manifest, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(str(part) for part in exc.path) or "(top)"
        return [f"{kind_name(manifest)}: {where}: {exc.message}"]
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [f"{kind_name(manifest)}: {exc.message}"]
    return []


def pod_templates(manifests: list[Manifest]) -> Iterator[tuple[Manifest, Manifest]]:
    """(workload, its pod template) for each Deployment and StatefulSet."""
    for manifest in manifests:
        if manifest["kind"] in ("Deployment", "StatefulSet"):
            yield manifest, manifest["spec"]["template"]


def containers(pod: Manifest) -> list[Manifest]:
    return [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]


def reference_errors(manifests: list[Manifest]) -> list[str]:
    """Names an object uses that the render does not define in the object's namespace: a
    ConfigMap or Secret a container reads, a claim a pod mounts, a selector that selects no pod
    template (or not its own)."""
    have = {(m["kind"], _namespace(m), m["metadata"]["name"]) for m in manifests}
    errors: list[str] = []

    def need(owner: Manifest, kind: str, wanted: str) -> None:
        if (kind, _namespace(owner), wanted) not in have:
            errors.append(
                f"{kind_name(owner)}: refers to {kind}/{wanted}, which is not rendered in its "
                f"namespace ({_namespace(owner)})"
            )

    claims = {
        t["metadata"]["name"]
        for workload, _ in pod_templates(manifests)
        for t in workload["spec"].get("volumeClaimTemplates", [])
    }
    for workload, pod in pod_templates(manifests):
        selector = workload["spec"]["selector"]["matchLabels"]
        labels = pod["metadata"]["labels"]
        if any(labels.get(k) != v for k, v in selector.items()):
            errors.append(f"{kind_name(workload)}: its selector does not select its own pods")
        for container in containers(pod):
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    need(workload, "ConfigMap", source["configMapRef"]["name"])
                if "secretRef" in source:
                    need(workload, "Secret", source["secretRef"]["name"])
            for var in container.get("env", []):
                ref = var.get("valueFrom", {})
                if "configMapKeyRef" in ref:
                    need(workload, "ConfigMap", ref["configMapKeyRef"]["name"])
                if "secretKeyRef" in ref:
                    need(workload, "Secret", ref["secretKeyRef"]["name"])
        for volume in pod["spec"].get("volumes", []):
            claim = volume.get("persistentVolumeClaim", {}).get("claimName")
            if claim is not None and claim not in claims:
                need(workload, "PersistentVolumeClaim", claim)
    pods = [(_namespace(w), pod["metadata"]["labels"]) for w, pod in pod_templates(manifests)]
    for service in (m for m in manifests if m["kind"] == "Service"):
        selector, where = service["spec"]["selector"], _namespace(service)
        if not any(
            ns == where and all(p.get(k) == v for k, v in selector.items()) for ns, p in pods
        ):
            errors.append(f"{kind_name(service)}: selects no pod in its namespace ({where})")
    return errors


def _namespace(manifest: Manifest) -> str:
    return str(manifest["metadata"].get("namespace", "default"))


def check(manifests: list[Manifest]) -> list[str]:
    """Every error of a render: the schemas' first, then the references'."""
    return [e for m in manifests for e in schema_errors(m)] + reference_errors(manifests)


def main(kube_dir: Path = KUBE_DIR) -> int:
    """Render every overlay of `kube_dir`, validate every object; print what was checked, and
    return 1 on any error."""
    import tempfile

    print(
        f"kubectl kustomize ({_kubectl_version()}), kubernetes-validate "
        f"{kubernetes_validate.__version__}, schemas of Kubernetes {KUBERNETES_VERSION} (strict)"
    )
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        tree = prepared_tree(Path(tmp) / "kubernetes", kube_dir)
        for overlay in overlays(tree):
            start = time.monotonic()
            manifests = render(tree / "overlays" / overlay)
            errors = check(manifests)
            kinds = Counter(m["kind"] for m in manifests)
            summary = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
            verdict = f"{len(errors)} error{'s' * (len(errors) != 1)}" if errors else "valid"
            print(
                f"overlays/{overlay}: {len(manifests)} objects ({summary}): {verdict} "
                f"({time.monotonic() - start:.1f}s)"
            )
            for error in errors:
                print(f"  {error}")
            failed += bool(errors)
    return 1 if failed else 0


def _kubectl_version() -> str:
    done = subprocess.run(
        ["kubectl", "version", "--client"], capture_output=True, text=True, timeout=60
    )
    return "; ".join(line.strip() for line in done.stdout.splitlines() if line.strip())


if __name__ == "__main__":
    sys.exit(main())
