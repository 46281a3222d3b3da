"""The shipped manifests as the real apiserver admits them (issue 39 item 1).

PodSecurity admission: the node agent's pod (components/cluster/agent-daemonset.yaml) is
refused in a namespace labelled as gatekeeper's own (namespace.yaml, "restricted": hostPID,
hostPath, runAsUser=0), which is what kept cluster mode from installing as shipped, and
admitted in one labelled as the agent's (components/cluster/agent-namespace.yaml,
"privileged"); the webhook's and the sidecar's pods are admitted under "restricted". There
is no kubelet or DaemonSet controller here, so each pod template goes to the apiserver as a
Pod, server-side dry run: admission runs in full, nothing is stored.

``kubectl apply -f deploy/llm-d/``: every document kubectl reads there (the folder's
``.yaml``, ``.yml`` and ``.json`` files, not its subfolders) is an object the apiserver
admits (dry run), and the real kubectl, where installed, applies the folder with
``--dry-run=server``.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, Client
from lightkube.codecs import from_dict

from tests.support.helm_chart import pod_of
from tests.support.kube_cluster import KubeCluster, create_unless_present

pytestmark = pytest.mark.k8s

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
LLM_D = ROOT / "deploy" / "llm-d"
RESTRICTED, PRIVILEGED = "shipped-restricted", "shipped-privileged"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _one(path: Path, kind: str) -> dict[str, Any]:
    (doc,) = [d for d in _docs(path) if d["kind"] == kind]
    return doc


def _labelled_as(path: Path, name: str) -> dict[str, Any]:
    """A namespace ``name`` with the labels of the Namespace in ``path``."""
    labels = _one(path, "Namespace")["metadata"]["labels"]
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


@pytest.fixture(scope="module")
def api(kube_cluster: KubeCluster) -> Iterator[Client]:
    client = kube_cluster.client()
    create_unless_present(client, _labelled_as(DEPLOY / "namespace.yaml", RESTRICTED))
    agent_namespace = DEPLOY / "components" / "cluster" / "agent-namespace.yaml"
    create_unless_present(client, _labelled_as(agent_namespace, PRIVILEGED))
    # The namespace deploy/llm-d's Service names, as the cluster component makes it.
    create_unless_present(client, _one(agent_namespace, "Namespace"))
    yield client
    client.close()


def _admit(api: Client, manifest: dict[str, Any]) -> None:
    answered = api.create(from_dict(manifest), dry_run=True)
    assert answered.metadata is not None and answered.metadata.name == manifest["metadata"]["name"]


AGENT = DEPLOY / "components" / "cluster" / "agent-daemonset.yaml"


def test_the_agents_pod_is_refused_under_restricted(api: Client) -> None:
    with pytest.raises(ApiError) as refused:
        _admit(api, pod_of(_one(AGENT, "DaemonSet"), RESTRICTED))
    message = str(refused.value.status.message)
    assert refused.value.status.code == 403, message
    assert 'violates PodSecurity "restricted:latest"' in message
    for reason in ("hostPID=true", 'restricted volume type "hostPath"', "runAsUser=0"):
        assert reason in message, message


def test_the_agents_pod_is_admitted_in_its_privileged_namespace(api: Client) -> None:
    daemonset = _one(AGENT, "DaemonSet")
    namespace = _one(AGENT.parent / "agent-namespace.yaml", "Namespace")
    assert daemonset["metadata"]["namespace"] == namespace["metadata"]["name"]
    _admit(api, pod_of(daemonset, PRIVILEGED))


@pytest.mark.parametrize(("path", "kind"), [("webhook-deployment.yaml", "Deployment"),
                                            ("daemonset.yaml", "DaemonSet")])  # fmt: skip
def test_the_webhooks_and_the_sidecars_pods_pass_restricted(
    api: Client, path: str, kind: str
) -> None:
    _admit(api, pod_of(_one(DEPLOY / path, kind), RESTRICTED))


def _applied_by_kubectl_f(folder: Path) -> list[Path]:
    """What ``kubectl apply -f FOLDER`` reads: its files with kubectl's extensions."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in (".yaml", ".yml",
                                                                              ".json"))  # fmt: skip


def test_kubectl_apply_f_applies_the_llm_d_folder(api: Client, kube_cluster: KubeCluster) -> None:
    files = _applied_by_kubectl_f(LLM_D)
    assert files, "deploy/llm-d has nothing kubectl apply -f would read"
    for path in files:
        for doc in _docs(path):
            assert {"apiVersion", "kind", "metadata"} <= doc.keys(), f"{path.name}: not an object"
            _admit(api, doc)
    kubectl = shutil.which("kubectl")
    if kubectl is None:  # the apiserver has answered for every document already
        return
    done = subprocess.run(
        [kubectl, "--kubeconfig", str(kube_cluster.kubeconfig), "apply", "--dry-run=server",
         "-f", str(LLM_D)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "gatekeeper-agent-local created (server dry run)" in done.stdout
