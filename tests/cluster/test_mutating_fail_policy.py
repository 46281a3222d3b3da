"""The mutating webhook's failure policy in cluster mode, as shipped (issue 38 item 4):
``failurePolicy: Fail``, scoped by the namespace selector and by a match condition that
sends only objects naming vLLM.

``gatekeeper webhook --mutate`` as its own process behind the shipped
MutatingWebhookConfiguration (its failure policy, match condition and timeout as shipped;
the namespace selector narrowed to this module's namespace). While it answers, a vLLM
Deployment is mutated; killed, a vLLM Deployment or Pod is refused (never admitted with
whole GPUs and no claim: the apiserver's fail-open count does not move) while a Pod that
runs no vLLM is admitted without calling it; started again, the Deployment applied again is
mutated, as a controller's retry would be.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import ApiError, Client
from lightkube.codecs import from_dict
from lightkube.resources.admissionregistration_v1 import MutatingWebhookConfiguration
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Namespace, Pod
from lightkube.types import PatchType

from bench.webhook_configs import MUTATING, shipped_configuration
from gatekeeper.cluster.claim_annotation import CLAIM_ANNOTATION
from tests.support.kube_cluster import KubeCluster
from tests.support.polling import wait_for
from tests.support.vllm_workloads import MODEL, deployment
from tests.support.webhook_process import WebhookProcess, start_webhook

pytestmark = pytest.mark.k8s

NAMESPACE = "fail-policy"
HOOK = "claims.vllm-gatekeeper.io"
ARGS = [MODEL, "--max-model-len", "8192"]


def _config(webhook: WebhookProcess) -> dict[str, Any]:
    config = shipped_configuration(MUTATING, webhook.url(""), webhook.ca_bundle, NAMESPACE, "Fail")
    (hook,) = config["webhooks"]
    shipped = shipped_configuration(MUTATING, "", "", NAMESPACE, "Fail")["webhooks"][0]
    assert hook["matchConditions"] == shipped["matchConditions"]
    return config


def _name() -> str:
    return str(shipped_configuration(MUTATING, "", "", NAMESPACE, "Fail")["metadata"]["name"])


@pytest.fixture(scope="module")
def api(kube_cluster: KubeCluster) -> Iterator[Client]:
    client = kube_cluster.client()
    client.create(from_dict({"apiVersion": "v1", "kind": "Namespace",
                             "metadata": {"name": NAMESPACE}}))  # fmt: skip
    yield client
    try:
        client.delete(MutatingWebhookConfiguration, _name())
    except ApiError as e:
        assert e.status.code == 404, e
    for resource in (Deployment, Pod):
        for found in client.list(resource, namespace=NAMESPACE):
            name = found.metadata.name  # type: ignore[attr-defined]
            client.delete(resource, name, namespace=NAMESPACE, grace_period=0)
    client.delete(Namespace, NAMESPACE)
    client.close()


def _start(kube_cluster: KubeCluster, tmp: pytest.TempPathFactory) -> WebhookProcess:
    return start_webhook(
        tmp.mktemp("fail-policy"), "--mutate", "--kubeconfig", str(kube_cluster.kubeconfig)
    )


def _workload(name: str, kind: str = "Deployment") -> dict[str, Any]:
    manifest = deployment(name, NAMESPACE, ARGS)
    manifest["spec"]["replicas"] = 0  # admission is the same; no pods left behind
    if kind == "Deployment":
        return manifest
    template = manifest["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {**template["metadata"], "name": name,
            "namespace": NAMESPACE}, "spec": template["spec"]}  # fmt: skip


def _create(api: Client, manifest: dict[str, Any], dry_run: bool = False) -> ApiError | Any:
    try:
        return api.create(from_dict(manifest), dry_run=dry_run)
    except ApiError as e:
        return e


def _fail_opens(cluster: KubeCluster) -> float:
    text = cluster.get("/metrics").decode()
    pattern = rf'^apiserver_admission_webhook_fail_open_count\{{name="{re.escape(HOOK)}",type="admit"\}} (\S+)$'  # fmt: skip
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def _mutated(made: Any) -> bool:
    if isinstance(made, ApiError):
        return False
    template = made.to_dict()["spec"]["template"]
    return CLAIM_ANNOTATION in (template["metadata"].get("annotations") or {})


def test_a_vllm_workload_waits_for_the_webhook_and_nothing_else_does(
    kube_cluster: KubeCluster, api: Client, tmp_path_factory: pytest.TempPathFactory
) -> None:
    webhook = _start(kube_cluster, tmp_path_factory)
    api.create(from_dict(_config(webhook)))
    wait_for("the configuration in force", lambda: _mutated(_create(api, _workload("qwen"), True)))
    assert _mutated(_create(api, _workload("qwen")))
    opened = _fail_opens(kube_cluster)

    webhook.kill()
    refused: list[str] = []
    for kind in ("Deployment", "Pod"):
        made = _create(api, _workload(f"down-{kind.lower()}", kind))
        assert isinstance(made, ApiError), f"a vLLM {kind} was admitted while the webhook was down"
        assert made.status.code == 500 and f'failed calling webhook "{HOOK}"' in str(
            made.status.message
        )
        refused.append(str(made.status.message))
    print(f"refused while down: {refused[0]}")
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain", "namespace": NAMESPACE},
             "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["sleep", "1"]}]}}  # fmt: skip
    assert not isinstance(_create(api, plain), ApiError)  # not sent: it names no vLLM
    assert _fail_opens(kube_cluster) == opened

    again = _start(kube_cluster, tmp_path_factory)
    config = _config(again)
    api.patch(MutatingWebhookConfiguration, _name(), [
        {"op": "replace", "path": "/webhooks/0/clientConfig", "value": config["webhooks"][0]["clientConfig"]},
    ], patch_type=PatchType.JSON)  # fmt: skip
    try:
        wait_for(
            "the Deployment applied again, mutated",
            lambda: _mutated(_create(api, _workload("down-deployment"), True)),
        )
        assert _mutated(_create(api, _workload("down-deployment")))
    finally:
        again.stop()
