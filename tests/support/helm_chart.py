"""gatekeeper's Helm chart and its kustomize tree, rendered, for the chart tests (issue 39).

``helm`` is the command ``scripts/helm.sh`` builds from the Go module ``helm.sh/helm/v4`` into
``build/helm/`` (or ``$GATEKEEPER_HELM_BIN``); ``helm_missing_reason()`` says how to build it
when it is not there. ``template(values)`` renders ``deploy/helm/gatekeeper`` as release
``gatekeeper`` in ``vllm-gatekeeper`` (the names ``deploy/kubernetes`` uses);
``kustomize(components)`` builds ``deploy/kubernetes`` with those components through
``kubectl kustomize``, as the kustomize tests do (``kubectl_missing_reason()`` when kubectl
is absent). ``comparable`` keys the objects by kind, namespace and name, without the labels
only Helm adds, so that the two renderings compare as dicts. ``pod_of`` makes a workload's
pod template a Pod, for the apiserver's admission (there is no kubelet or DaemonSet
controller in the test control plane to make one).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "CHART",
    "HELM_BIN_ENV",
    "HELM_LABELS",
    "KUSTOMIZE",
    "RELEASE",
    "RELEASE_NAMESPACE",
    "comparable",
    "helm",
    "helm_binary",
    "helm_missing_reason",
    "kubectl_missing_reason",
    "kustomize",
    "pod_of",
    "template",
]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gatekeeper"
KUSTOMIZE = ROOT / "deploy" / "kubernetes"
HELM_BIN_ENV = "GATEKEEPER_HELM_BIN"
RELEASE, RELEASE_NAMESPACE = "gatekeeper", "vllm-gatekeeper"
HELM_LABELS = (
    "helm.sh/chart",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
)
"""Helm's standard labels, on every object's metadata (never on pod templates or selectors)."""

Doc = dict[str, Any]


def helm_binary() -> Path:
    return Path(os.environ.get(HELM_BIN_ENV) or ROOT / "build" / "helm") / "helm"


def helm_missing_reason() -> str | None:
    if os.access(helm_binary(), os.X_OK):
        return None
    return (
        f"helm is not built at {helm_binary()}: run `bash scripts/helm.sh` (Helm v4 from the "
        f"Go module proxy; ${HELM_BIN_ENV} names another folder)"
    )


def kubectl_missing_reason() -> str | None:
    return None if shutil.which("kubectl") else "kubectl (its kustomize) is not installed"


def helm(*args: str, env: Mapping[str, str] | None = None, timeout: float = 120.0) -> str:
    """``helm ARGS`` with its cache, configuration and data in a directory of its own; its
    standard output, or AssertionError with its standard error."""
    with tempfile.TemporaryDirectory(prefix="helm-home") as home:
        own = {f"HELM_{d}_HOME": str(Path(home) / d.lower()) for d in ("CACHE", "CONFIG", "DATA")}
        done = subprocess.run(
            [str(helm_binary()), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **own, **(env or {})},
        )
    if done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {done.returncode}: {done.stderr}")
    return done.stdout


def _documents(text: str) -> list[Doc]:
    return [d for d in yaml.safe_load_all(text) if d]


def template(
    values: Mapping[str, Any] | None = None,
    *,
    release: str = RELEASE,
    namespace: str = RELEASE_NAMESPACE,
    extra: Sequence[str] = (),
) -> list[Doc]:
    """``helm template`` of the chart with ``values`` (a values file's content)."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
        yaml.safe_dump(dict(values or {}), file)
        file.flush()
        out = helm("template", release, str(CHART), "--namespace", namespace, "-f", file.name,
                   *extra)  # fmt: skip
    return _documents(out)


def kustomize(components: Iterable[str]) -> list[Doc]:
    """``deploy/kubernetes`` with ``components`` (names under its ``components/``), built by
    ``kubectl kustomize`` from an overlay in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="overlay") as folder:
        overlay = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [os.path.relpath(KUSTOMIZE, folder)],
            "components": [
                os.path.relpath(KUSTOMIZE / "components" / c, folder) for c in components
            ],
        }
        (Path(folder) / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
        built = subprocess.run(
            ["kubectl", "kustomize", "--load-restrictor=LoadRestrictionsNone", folder],
            capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
    return _documents(built.stdout)


def comparable(docs: Iterable[Doc]) -> dict[tuple[str, str, str, str], Doc]:
    """The objects by (apiVersion, kind, namespace, name), without Helm's own labels."""
    keyed: dict[tuple[str, str, str, str], Doc] = {}
    for doc in docs:
        doc = yaml.safe_load(yaml.safe_dump(doc))  # a copy
        labels = doc["metadata"].get("labels", {})
        for label in HELM_LABELS:
            labels.pop(label, None)
        meta = doc["metadata"]
        key = (doc["apiVersion"], doc["kind"], meta.get("namespace", ""), meta["name"])
        assert key not in keyed, f"{key} rendered twice"
        keyed[key] = doc
    return keyed


def pod_of(workload: Doc, namespace: str) -> Doc:
    """The Pod a controller would make of ``workload``'s pod template in ``namespace``,
    named as the workload."""
    template = workload["spec"]["template"]
    meta = {"name": workload["metadata"]["name"], "namespace": namespace,
            "labels": template["metadata"]["labels"]}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}
