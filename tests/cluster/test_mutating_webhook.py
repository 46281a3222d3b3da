"""The mutating webhook as the apiserver calls it (issue 29 item 2).

``gatekeeper webhook --mutate`` runs as its own process over TLS on loopback, with the
session's kubeconfig to create claim templates; a real MutatingWebhookConfiguration (URL
and CA bundle, failure policy ``Fail`` so that a webhook that was not called fails the
test) sends it the Deployments and Pods of one labelled namespace. One Node of its own,
``mutate-node``, tainted so that only these tests' pods land there, publishes two recorded
H100s through ``gatekeeper.cluster.resource_slice``. The controller manager's deployment
and replica-set controllers make the pods, the resource-claim controller their claims, and
the real scheduler allocates and binds them.
"""

from __future__ import annotations

import dataclasses
import json
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from lightkube import ApiError, Client
from lightkube.codecs import from_dict
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimTemplate
from lightkube.utils.quantity import parse_quantity

from bench.cluster_fleet import device_class
from gatekeeper.cluster import DRIVER_NAME, resource_slice
from gatekeeper.cluster.claim_annotation import CLAIM_ANNOTATION
from gatekeeper.cluster.claims import CLAIM_NAME
from gatekeeper.gpus import InventorySnapshot, StaticInventory
from gatekeeper.k8s.review import AdmissionRequest
from gatekeeper.k8s.server import webhook_from_settings
from gatekeeper.placement.policy import PlacementPolicy
from gatekeeper.settings import Settings
from tests.support import vllm_workloads
from tests.support.kube_cluster import (
    KubeCluster,
    create_unless_present,
    mutating_route,
    ready_node,
)
from tests.support.webhook_process import WebhookProcess, start_webhook

pytestmark = pytest.mark.k8s

NODE = "mutate-node"
NAMESPACE = "mutate"
CONFIGURATION = "claims"  # its webhook: claims.vllm-gatekeeper.io, as the apiserver names it
TAINT = {"key": "gatekeeper-test", "value": "mutate", "effect": "NoSchedule"}
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpus"
TIMEOUT_SECONDS = 60.0
MODEL = vllm_workloads.MODEL


def _gpus() -> InventorySnapshot:
    recorded = StaticInventory.from_json(FIXTURES / "h100_80g_x8.json").snapshot()
    gpus = tuple(dataclasses.replace(g, uuid=f"GPU-{NODE}-{g.index}") for g in recorded.gpus[:2])
    return dataclasses.replace(recorded, gpus=gpus)


@pytest.fixture(scope="module")
def webhook(
    kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WebhookProcess]:
    """``gatekeeper webhook --mutate`` running, with the session's kubeconfig."""
    directory = tmp_path_factory.mktemp("mutate")
    running = start_webhook(directory, "--mutate", "--kubeconfig", str(kube_cluster.kubeconfig))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def client(kube_cluster: KubeCluster, webhook: WebhookProcess) -> Iterator[Client]:
    """The node, its slice, the namespace and the webhook's configuration."""
    api = kube_cluster.client()
    try:
        yield from _configured(api, webhook)
    finally:
        api.close()


def _configured(api: Client, webhook: WebhookProcess) -> Iterator[Client]:
    slice_ = resource_slice(NODE, _gpus(), PlacementPolicy())
    for manifest in (device_class(), ready_node(NODE, (TAINT,)), slice_):
        create_unless_present(api, manifest)  # the DeviceClass may come from another module
    with mutating_route(api, CONFIGURATION, webhook, NAMESPACE):
        yield api


def deployment(name: str, args: list[str], **container: Any) -> dict[str, Any]:
    """A Deployment as vLLM's docs write one, tolerating this module's node and pinned to it."""
    pod = {"tolerations": [{**TAINT, "operator": "Equal"}],
           "nodeSelector": {"kubernetes.io/hostname": NODE}}  # fmt: skip
    return vllm_workloads.deployment(name, NAMESPACE, args, pod=pod, **container)


SERVED = deployment(
    "qwen", [MODEL, "--max-model-len", "8192", "--tensor-parallel-size", "2", "--quantization",
             "fp8", "--gpu-memory-utilization", "0.9"],
)  # fmt: skip


def _pod_spec(found: Any) -> dict[str, Any]:
    spec: dict[str, Any] = found.to_dict()["spec"]["template"]
    return spec


def _pod_spec_of(found: Any) -> dict[str, Any]:
    pod: dict[str, Any] = found.to_dict()
    return pod


def _wait_bound(api: Client, app: str) -> dict[str, Any]:
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        for pod in api.list(Pod, namespace=NAMESPACE, labels={"app": app}):
            if pod.spec is not None and pod.spec.nodeName:
                found: dict[str, Any] = pod.to_dict()
                return found
        time.sleep(0.05)
    raise AssertionError(f"no pod of {app} was bound in {TIMEOUT_SECONDS} s")


@pytest.fixture(scope="module")
def served(client: Client) -> dict[str, Any]:
    """The Deployment created, its pod bound, and what the apiserver holds of both."""
    start = time.monotonic()
    created = client.create(from_dict(SERVED))
    pod = _wait_bound(client, "qwen")
    seconds = time.monotonic() - start
    claim = next(iter(client.list(ResourceClaim, namespace=NAMESPACE))).to_dict()
    return {"template": _pod_spec(created), "pod": pod, "claim": claim, "seconds": seconds}


def test_a_deployment_gets_its_claim_template_and_flags(client: Client, served: dict[str, Any]):
    template = served["template"]
    record = json.loads(template["metadata"]["annotations"][CLAIM_ANNOTATION])["vllm"]
    (container,) = template["spec"]["containers"]
    args = container["args"]
    assert args[-4:] == ["--kv-cache-memory-bytes", str(record["kvCacheMemoryBytes"]),
                         "--gpu-memory-utilization", f"{record['gpuMemoryUtilization']:.4f}"]  # fmt: skip
    assert "0.9" not in args  # the fraction of a GPU nobody knows gave way to the byte budget
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    assert container["resources"]["claims"] == [{"name": CLAIM_NAME}]
    (pod_claim,) = template["spec"]["resourceClaims"]
    assert pod_claim == {"name": CLAIM_NAME, "resourceClaimTemplateName": record["template"]}
    made = client.get(ResourceClaimTemplate, record["template"], namespace=NAMESPACE).to_dict()
    requests = made["spec"]["spec"]["devices"]["requests"]
    assert [r["name"] for r in requests] == ["rank0", "rank1"]
    for request in requests:
        exactly = request["exactly"]
        assert parse_quantity(exactly["capacity"]["requests"]["memory"]) == record["memoryBytes"]
        assert record["memoryBytes"] % 2**20 == 0
        assert "cudaComputeCapability" in exactly["selectors"][0]["cel"]["expression"]
    kinds = {
        next(k for k in c if k != "requests")
        for c in made["spec"]["spec"]["devices"]["constraints"]
    }
    assert kinds == {"matchAttribute", "distinctAttribute"}


def test_the_scheduler_allocates_the_bytes_and_binds_the_pod(served: dict[str, Any]):
    record = json.loads(served["template"]["metadata"]["annotations"][CLAIM_ANNOTATION])["vllm"]
    assert served["pod"]["spec"]["nodeName"] == NODE
    results = served["claim"]["status"]["allocation"]["devices"]["results"]
    assert sorted(r["request"] for r in results) == ["rank0", "rank1"]
    assert len({r["device"] for r in results}) == 2  # distinct GPUs for the TP group
    for result in results:
        assert (result["driver"], result["pool"]) == (DRIVER_NAME, NODE)
        assert parse_quantity(result["consumedCapacity"]["memory"]) == record["memoryBytes"]
    print(f"create to bound through the mutating webhook: {served['seconds'] * 1000:.0f} ms")


def test_applying_again_does_not_mutate_twice(client: Client, served: dict[str, Any]):
    templates_before = _template_names(client)
    live = client.get(Deployment, "qwen", namespace=NAMESPACE)
    again = client.replace(live)  # the mutated object as it is: left alone
    assert _pod_spec(again)["spec"] == served["template"]["spec"]
    # The manifest as written, without what the webhook added (as a server-side apply of
    # it drops the fields the applier no longer names): mutated again, to the same result.
    original = json.loads(json.dumps(SERVED))
    original["metadata"]["resourceVersion"] = again.to_dict()["metadata"]["resourceVersion"]
    replaced = client.replace(from_dict(original))
    assert _pod_spec(replaced)["spec"] == served["template"]["spec"]
    assert _pod_spec(replaced)["metadata"] == served["template"]["metadata"]
    assert _template_names(client) == templates_before  # no second template
    (pod,) = [p.to_dict() for p in client.list(Pod, namespace=NAMESPACE, labels={"app": "qwen"})]
    (claim,) = pod["spec"]["resourceClaims"]  # the same pod: nothing rolled out
    assert claim["resourceClaimTemplateName"] in templates_before


def _template_names(client: Client) -> set[str]:
    return {
        t.to_dict()["metadata"]["name"]
        for t in client.list(ResourceClaimTemplate, namespace=NAMESPACE)
    }


def test_an_edited_command_line_applied_client_side_is_mutated_again(
    client: Client, served: dict[str, Any]
):
    """kubectl apply (client-side) of a manifest whose args changed replaces the args on
    the live object but keeps the claims and annotation the webhook added: the record no
    longer holds, so the template is claimed again for the new line, once."""
    live = _pod_spec_of(client.get(Deployment, "qwen", namespace=NAMESPACE))
    edited_args = [*SERVED["spec"]["template"]["spec"]["containers"][0]["args"]]
    edited_args[edited_args.index("8192")] = "16384"
    live["spec"]["template"]["spec"]["containers"][0]["args"] = edited_args
    after = _pod_spec(client.replace(from_dict(live)))
    record = json.loads(after["metadata"]["annotations"][CLAIM_ANNOTATION])["vllm"]
    before = json.loads(served["template"]["metadata"]["annotations"][CLAIM_ANNOTATION])["vllm"]
    assert record["kvCacheMemoryBytes"] > 1.9 * before["kvCacheMemoryBytes"]  # twice the length
    assert record["template"] != before["template"]
    args = after["spec"]["containers"][0]["args"]
    assert args.count("--kv-cache-memory-bytes") == 1 and "16384" in args
    assert after["spec"]["resourceClaims"] == [
        {"name": CLAIM_NAME, "resourceClaimTemplateName": record["template"]}
    ]
    assert after["spec"]["containers"][0]["resources"]["claims"] == [{"name": CLAIM_NAME}]


def test_a_dry_run_creates_no_template(client: Client, served: dict[str, Any]):
    manifest = deployment("dry", [MODEL, "--max-model-len", "4096"])
    answered = client.create(from_dict(manifest), dry_run=True)
    record = json.loads(_pod_spec(answered)["metadata"]["annotations"][CLAIM_ANNOTATION])["vllm"]
    names = {
        t.to_dict()["metadata"]["name"]
        for t in client.list(ResourceClaimTemplate, namespace=NAMESPACE)
    }
    assert record["template"] not in names


def _denial(client: Client, manifest: dict[str, Any]) -> str:
    with pytest.raises(ApiError) as caught:
        client.create(from_dict(manifest))
    assert caught.value.status.code in (400, 403)
    return str(caught.value.status.message)


@pytest.fixture(scope="module")
def small(client: Client) -> str:
    """A hand-written claim template of 1 GiB."""
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "small", "namespace": NAMESPACE},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": DRIVER_NAME, "capacity": {"requests": {"memory": "1Gi"}}}}]}}},
    }  # fmt: skip
    client.create(from_dict(template))
    return "small"


def test_a_hand_written_claim_smaller_than_a_rank_is_denied(client: Client, small: str):
    manifest = deployment("own-claim", [MODEL, "--max-model-len", "4096"],
                          resources={"claims": [{"name": "gpu"}]})  # fmt: skip
    manifest["spec"]["template"]["spec"]["resourceClaims"] = [
        {"name": "gpu", "resourceClaimTemplateName": "small"}
    ]
    message = _denial(client, manifest)
    assert "claim template small requests 1073741824 bytes" in message
    assert "raise capacity.requests.memory to" in message


def test_an_unreadable_vllm_line_is_denied_with_the_reason(client: Client, served: dict[str, Any]):
    message = _denial(client, deployment("bad", [MODEL, "--max-model-len", "banana"]))
    assert "vllm serve line cannot be read" in message and "max-model-len" in message
    script = deployment(
        "script", [], command=["sh", "-c", "exec vllm serve $MODEL --max-model-len ${LEN}"]
    )
    message = _denial(client, script)
    assert "expansions gatekeeper cannot resolve" in message and "$MODEL" in message
    quote = deployment("quote", [], command=["sh", "-c", "exec vllm serve 'Qwen/Qwen2.5-7B"])
    message = _denial(client, quote)
    assert "its shell script names vLLM but cannot be split as the shell would" in message
    for name in ("bad", "script", "quote"):
        assert not list(client.list(Deployment, namespace=NAMESPACE, labels={"app": name}))


def test_the_validating_webhook_counts_the_claimed_gpus(served: dict[str, Any]):
    """The mutated template asks for no nvidia.com/gpu: the validating webhook (which runs
    after the mutating ones) reads the claim's ranks instead of warning that TP 2 has no
    GPUs."""
    validating = webhook_from_settings(Settings(webhook_default_gpu="H100-80GB"))
    review = {"uid": "u", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
              "operation": "CREATE", "namespace": NAMESPACE,
              "object": {**SERVED, "spec": {**SERVED["spec"], "template": served["template"]}}}  # fmt: skip
    decision = validating.decide(AdmissionRequest.model_validate(review))
    assert decision.allowed and not any("nvidia.com/gpu" in w for w in decision.warnings)
    bare = json.loads(json.dumps(served["template"]))
    del bare["metadata"]["annotations"][CLAIM_ANNOTATION]  # a claim gatekeeper did not write
    unrecorded = {**review, "object": {**SERVED, "spec": {**SERVED["spec"], "template": bare}}}
    before = validating.decide(AdmissionRequest.model_validate(unrecorded))
    assert any("requests no nvidia.com/gpu" in w for w in before.warnings)


def test_a_bare_pod_and_a_statefulset_are_mutated(client: Client, served: dict[str, Any]):
    template = deployment("bare", [MODEL, "--max-model-len", "4096"])["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "bare", "namespace": NAMESPACE, "labels": {"app": "bare"}},
           "spec": template["spec"]}  # fmt: skip
    created = _pod_spec_of(client.create(from_dict(pod)))
    assert created["spec"]["resourceClaims"][0]["name"] == CLAIM_NAME
    assert _wait_bound(client, "bare")["spec"]["nodeName"] == NODE
    stateful = deployment("stateful", [MODEL, "--max-model-len", "2048"])
    stateful["kind"] = "StatefulSet"
    stateful["spec"]["serviceName"] = "stateful"
    made = _pod_spec(client.create(from_dict(stateful)))
    (container,) = made["spec"]["containers"]
    assert "--kv-cache-memory-bytes" in container["args"]
    assert CLAIM_ANNOTATION in made["metadata"]["annotations"]


def test_the_webhook_counts_its_answers(webhook: WebhookProcess, served: dict[str, Any]):
    context = ssl.create_default_context(cadata=webhook.ca_pem.decode())
    text = httpx.get(webhook.url("/metrics"), verify=context).text
    counts = {
        line.split('"')[1]: float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("gatekeeper_webhook_mutations_total{")
    }
    assert counts["mutated"] >= 2 and counts["unchanged"] >= 1  # the Deployment, its pod


def test_the_apiserver_measures_the_webhooks_latency(kube_cluster: KubeCluster, served):
    """The apiserver's own histogram of calls to the webhook (what an operator alerts on),
    over every resource and operation."""
    totals = {"_sum": 0.0, "_count": 0.0}
    for line in kube_cluster.get("/metrics").decode().splitlines():
        name = line.split("{")[0]
        family = "apiserver_admission_webhook_admission_duration_seconds"
        if name.startswith(family) and 'name="claims.vllm-gatekeeper.io"' in line:
            suffix = name.removeprefix(family)
            if suffix in totals:
                totals[suffix] += float(line.split()[-1])
    calls, mean = totals["_count"], totals["_sum"] / max(totals["_count"], 1)
    assert calls >= 4 and mean < 5  # the Deployments, their pods, the updates
    print(
        f"mutating webhook, as the apiserver measures it: {calls:.0f} calls, mean {mean * 1000:.0f} ms"
    )
