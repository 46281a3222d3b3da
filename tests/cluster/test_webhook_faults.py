"""Bad input and a webhook that is down, as the apiserver sees them (issue 29, "Bad input
and faults").

The shipped configurations (``deploy/kubernetes/validatingwebhookconfiguration.yaml`` and
``components/cluster/mutatingwebhookconfiguration.yaml``), each with its rules as shipped,
its ``clientConfig`` pointed at a URL on loopback, its namespace selector narrowed to this
module's namespace ``faults`` (so no other module's objects reach it), a short
``timeoutSeconds`` and the failure policy under test. ``gatekeeper webhook --mutate`` runs
as its own process (``tests/support/webhook_process.py``) until a test kills it.

The apiserver reads webhook configurations through an informer, a moment after they
change: each test waits until the apiserver answers as the new configuration says (a
refusal where there was none, or its fail-open counter moving) before it asserts.

The tests run in order and build on each other (as ``test_agent.py``'s): the live webhook
denies, then it is killed, then a hung one stands in. Workloads are Deployments of 0 replicas (admission is the same; no pods are left behind,
since no garbage collector runs here) and bare Pods, deleted at the end.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, Client
from lightkube.codecs import from_dict
from lightkube.resources.admissionregistration_v1 import (
    MutatingWebhookConfiguration,
    ValidatingWebhookConfiguration,
)
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Namespace, Pod
from lightkube.types import PatchType

from bench.webhook_configs import MUTATING, VALIDATING, shipped_configuration
from gatekeeper.cluster.claim_annotation import CLAIM_ANNOTATION
from tests.support.kube_cluster import KubeCluster
from tests.support.polling import wait_for
from tests.support.webhook_process import WebhookProcess, start_webhook

pytestmark = pytest.mark.k8s

NAMESPACE = "faults"
KINDS: dict[Path, Any] = {VALIDATING: ValidatingWebhookConfiguration, MUTATING: MutatingWebhookConfiguration}  # fmt: skip
VALIDATING_NAME = "memory.vllm-gatekeeper.io"
MUTATING_NAME = "claims.vllm-gatekeeper.io"
H100 = "NVIDIA-H100-80GB-HBM3"
L4 = "NVIDIA-L4"
FITS = ["Qwen/Qwen2.5-7B-Instruct", "--max-model-len", "8192"]


def configuration(path: Path, url: str, ca_bundle: str, policy: str) -> dict[str, Any]:
    """The shipped configuration at ``path`` for namespace ``faults``, a 1 s timeout."""
    return shipped_configuration(path, url, ca_bundle, NAMESPACE, policy, timeout_seconds=1)


def set_policy(api: Client, path: Path, policy: str) -> None:
    name = f"faults-{yaml.safe_load(path.read_text())['metadata']['name']}"
    change = [{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": policy}]
    api.patch(KINDS[path], name, change, patch_type=PatchType.JSON)


def workload(name: str, args: list[str], product: str = H100, kind: str = "Deployment"):
    """A vLLM Deployment (0 replicas) or Pod as vLLM's docs write one, on ``product``."""
    labels = {"app": name}
    spec = {
        "nodeSelector": {"nvidia.com/gpu.product": product},
        "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.32.0",
                        "command": ["vllm", "serve"], "args": args,
                        "resources": {"limits": {"nvidia.com/gpu": 1}}}],
    }  # fmt: skip
    metadata = {"name": name, "namespace": NAMESPACE, "labels": labels}
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
    template = {"metadata": {"labels": labels}, "spec": spec}
    body = {"replicas": 0, "selector": {"matchLabels": labels}, "template": template}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata, "spec": body}


def refusal(api: Client, manifest: dict[str, Any], dry_run: bool = False) -> ApiError | None:
    """The apiserver's refusal of creating ``manifest``, or None when it was admitted."""
    try:
        api.create(from_dict(manifest), dry_run=dry_run)
    except ApiError as e:
        return e
    return None


def refused_naming(api: Client, manifest: dict[str, Any], text: str) -> ApiError:
    """Waits until a dry run of ``manifest`` is refused with ``text`` in the message (the
    configuration has reached the apiserver), then creates it for real: refused."""

    def named() -> bool:
        e = refusal(api, manifest, dry_run=True)
        return e is not None and text in str(e.status.message)

    wait_for(f"a refusal naming {text!r}", named)
    refused = refusal(api, manifest)
    assert refused is not None, f"{manifest['metadata']['name']} was admitted"
    return refused


def fail_open(cluster: KubeCluster, name: str, kind: str) -> float:
    """``apiserver_admission_webhook_fail_open_count`` of webhook ``name`` (type
    ``validating`` or ``admit``)."""
    text = cluster.get("/metrics").decode()
    pattern = rf'^apiserver_admission_webhook_fail_open_count\{{name="{re.escape(name)}",type="{kind}"\}} (\S+)$'  # fmt: skip
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


@pytest.fixture(scope="module")
def api(kube_cluster: KubeCluster) -> Iterator[Client]:
    client = kube_cluster.client()
    client.create(from_dict({"apiVersion": "v1", "kind": "Namespace",
                             "metadata": {"name": NAMESPACE}}))  # fmt: skip
    yield client
    for path, kind in KINDS.items():
        try:
            client.delete(kind, f"faults-{yaml.safe_load(path.read_text())['metadata']['name']}")
        except ApiError as e:
            if e.status.code != 404:
                raise
    resources: tuple[Any, ...] = (Deployment, Pod)
    for resource in resources:
        for found in client.list(resource, namespace=NAMESPACE):
            name = found.to_dict()["metadata"]["name"]
            client.delete(resource, name, namespace=NAMESPACE, grace_period=0)
    client.delete(Namespace, NAMESPACE)
    client.close()


@pytest.fixture(scope="module")
def webhook(
    kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WebhookProcess]:
    directory = tmp_path_factory.mktemp("webhook-faults")
    started = start_webhook(directory, "--mutate", "--kubeconfig", str(kube_cluster.kubeconfig))
    yield started
    started.kill()


@pytest.fixture
def hung() -> Iterator[str]:
    """A URL where a socket listens but never accepts: the apiserver's TLS handshake waits
    until the webhook's ``timeoutSeconds`` runs out."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"https://127.0.0.1:{listener.getsockname()[1]}"


def test_a_model_no_gpu_holds_is_denied_with_what_would_fit(api: Client, webhook: WebhookProcess):
    """The validating webhook behind the apiserver: Llama-3.1-8B with 128k tokens on an
    L4 is denied with the numbers and what would fit; nothing is created."""
    api.create(from_dict(configuration(VALIDATING, webhook.url(""), webhook.ca_bundle, "Fail")))
    long = workload("long", ["meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "131072"], L4)
    denied = refused_naming(api, long, "does not fit on L4")
    message = str(denied.status.message)
    print(f"denied: {message}")
    assert denied.status.code == 403
    assert f'admission webhook "{VALIDATING_NAME}" denied the request' in message
    assert re.search(r"at TP=1 it needs [\d.]+ GiB per GPU .* but the GPU has [\d.]+ GiB", message)
    assert re.search(r"Would fit: --tensor-parallel-size 2 .*; or --max-model-len \d+\.", message)
    assert "--tensor-parallel-size 2 (2 ranks, one GPU of DeviceClass gpu.gatekeeper.dev" in message
    assert refusal(api, workload("fits", FITS)) is None  # the same webhook admits what fits
    assert [d.metadata.name for d in api.list(Deployment, namespace=NAMESPACE)] == ["fits"]  # type: ignore[union-attr]


def test_the_mutating_webhook_denies_a_rank_no_gpu_holds(api: Client, webhook: WebhookProcess):
    """Mutating webhooks run first: a rank no L4 holds is denied with its need before the
    validating webhook sees it, and nothing is mutated or created."""
    api.create(from_dict(configuration(MUTATING, webhook.url(""), webhook.ca_bundle, "Fail")))
    big = workload("big", ["Qwen/Qwen2.5-14B-Instruct", "--max-model-len", "32768"], L4)
    denied = refused_naming(api, big, MUTATING_NAME)
    message = str(denied.status.message)
    print(f"denied: {message}")
    assert "does not fit on one L4" in message and "sized for 1 sequence of 32768 tokens" in message
    assert re.search(r"at TP=1 needs [\d.]+ GiB per GPU", message)
    assert "lower --max-model-len, raise --tensor-parallel-size or quantize" in message
    assert not list(api.list(Deployment, namespace=NAMESPACE, labels={"app": "big"}))


def test_a_killed_webhook_under_fail_refuses_and_under_ignore_admits_unmutated(
    kube_cluster: KubeCluster, api: Client, webhook: WebhookProcess
) -> None:
    webhook.kill()
    # Both Fail: the first webhook called (the mutating one) fails the request.
    for kind in ("Deployment", "Pod"):
        refused = refused_naming(api, workload("down", FITS, kind=kind), MUTATING_NAME)
        message = str(refused.status.message)
        assert refused.status.code == 500, message
        assert f'failed calling webhook "{MUTATING_NAME}"' in message
        assert "connection refused" in message
    print(f"refused: {message}")

    mutating_open = fail_open(kube_cluster, MUTATING_NAME, "admit")
    set_policy(api, MUTATING, "Ignore")  # the mutating one fails open, the validating not
    refused = refused_naming(
        api, workload("down", FITS), f'failed calling webhook "{VALIDATING_NAME}"'
    )
    assert refused.status.code == 500 and "connection refused" in str(refused.status.message)
    assert fail_open(kube_cluster, MUTATING_NAME, "admit") > mutating_open

    validating_open = fail_open(kube_cluster, VALIDATING_NAME, "validating")
    set_policy(api, VALIDATING, "Ignore")
    wait_for("admitted", lambda: refusal(api, workload("down", FITS), dry_run=True) is None)
    made: tuple[tuple[str, Any], ...] = (("Deployment", Deployment), ("Pod", Pod))
    for kind, resource in made:
        assert refusal(api, workload("down", FITS, kind=kind)) is None
        stored: dict[str, Any] = api.get(resource, "down", namespace=NAMESPACE).to_dict()
        template = stored if kind == "Pod" else stored["spec"]["template"]
        # Admitted as written: no claim, whole GPUs, the operator's flags.
        assert CLAIM_ANNOTATION not in (template["metadata"].get("annotations") or {})
        assert "resourceClaims" not in template["spec"]
        (container,) = template["spec"]["containers"]
        assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
        assert container["args"] == FITS
    assert fail_open(kube_cluster, VALIDATING_NAME, "validating") > validating_open


def test_a_webhook_that_hangs_costs_its_timeout_then_follows_its_policy(
    kube_cluster: KubeCluster, api: Client, hung: str
) -> None:
    """A webhook that takes connections and never answers: each request waits the
    configuration's ``timeoutSeconds`` (1 s), then ``Fail`` refuses and ``Ignore`` admits."""
    api.delete(MutatingWebhookConfiguration, "faults-gatekeeper-vllm-claims")
    api.create(from_dict(configuration(MUTATING, hung, "", "Fail")))
    refused = refused_naming(api, workload("slow", FITS), "context deadline exceeded")
    print(f"refused after the timeout: {refused.status.message}")
    assert f'failed calling webhook "{MUTATING_NAME}"' in str(refused.status.message)
    opened = fail_open(kube_cluster, MUTATING_NAME, "admit")
    set_policy(api, MUTATING, "Ignore")
    wait_for("admitted", lambda: refusal(api, workload("slow", FITS), dry_run=True) is None)
    start = time.monotonic()
    assert refusal(api, workload("slow", FITS)) is None
    seconds = time.monotonic() - start
    print(f"admitted through a hung webhook under Ignore in {seconds * 1000:.0f} ms")
    assert 1.0 <= seconds < 5.0
    assert fail_open(kube_cluster, MUTATING_NAME, "admit") > opened
