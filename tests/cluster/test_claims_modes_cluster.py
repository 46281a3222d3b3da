"""The claims modes on the real apiserver and kube-scheduler (issue 29 item 3).

``nvidia-dra``: a Node whose GPUs NVIDIA's DRA driver publishes, as it publishes them with
``--consumable-shares=memory`` (driver and DeviceClass ``gpu.nvidia.com``, its attribute
names, a ``memory`` capacity of the GPU's total with ``allowMultipleAllocations`` and a
1 MiB-step requestPolicy; ``gatekeeper.cluster.claims.NVIDIA_DRIVER`` cites the source);
the mutating webhook (``Mutator``, mode ``nvidia-dra``, the real template store) writes the
claim, and the scheduler allocates two distinct GPUs of that slice, each consuming the
requested bytes.

``hami``: ``gatekeeper webhook --mutate --claims-mode hami`` as its own process behind a
real MutatingWebhookConfiguration; the Pod gets HAMi's ``nvidia.com/gpu`` and
``nvidia.com/gpumem`` and no claim. There is no HAMi scheduler here: the Node carries both
as allocatable in its status, so kube-scheduler binds by them (a second Pod that would
pass the node's ``nvidia.com/gpumem`` waits, "Insufficient nvidia.com/gpumem"). HAMi's
scheduler would place per GPU instead (its extender ignores these names in
kube-scheduler's own accounting).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.utils.quantity import parse_quantity

from gatekeeper.cluster.claim_annotation import CLAIM_ANNOTATION
from gatekeeper.cluster.claims import HAMI_GPU, HAMI_GPUMEM, NVIDIA_DRIVER
from gatekeeper.k8s.mutate import Mutator
from gatekeeper.k8s.server import webhook_from_settings
from gatekeeper.k8s.template_store import ApiTemplateStore
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

MiB = 2**20
NVIDIA = "gpu.nvidia.com"
NODE, HAMI_NODE = "nvidia-node", "hami-node"
NAMESPACE, HAMI_NAMESPACE = "nvidia-dra", "hami"
HAMI_CONFIGURATION = "gatekeeper-test-hami"
TAINT = {"key": "gatekeeper-test", "value": "claims-modes", "effect": "NoSchedule"}
H100_BYTES = 85520809984  # tests/fixtures/gpus/h100_80g_x8.json
TIMEOUT_SECONDS = 60.0
POD = {"group": "", "version": "v1", "kind": "Pod"}


def nvidia_slice(node: str, gpus: int = 2) -> dict[str, Any]:
    """A ResourceSlice as NVIDIA's kubelet plugin publishes full GPUs with
    ``--consumable-shares=memory`` (``deviceinfo.go``, ``consumable_shares.go``)."""
    memory = f"{H100_BYTES // MiB}Mi"
    policy = {"default": memory, "validRange": {"min": "1Mi", "max": memory, "step": "1Mi"}}
    versions = {"cudaComputeCapability": "9.0.0", "driverVersion": "580.65.6",
                "cudaDriverVersion": "13.0.0"}  # fmt: skip
    strings = {"type": "gpu", "productName": "NVIDIA H100 80GB HBM3", "brand": "Nvidia",
               "architecture": "Hopper"}  # fmt: skip
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                **{k: {"string": v} for k, v in strings.items()},
                "uuid": {"string": f"GPU-{node}-{i}"},
                **{k: {"version": v} for k, v in versions.items()},
            },
            "capacity": {"memory": {"value": memory, "requestPolicy": policy}},
            "allowMultipleAllocations": True,
        }
        for i in range(gpus)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{NVIDIA}"},
        "spec": {"driver": NVIDIA, "nodeName": node, "devices": devices,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}},
    }  # fmt: skip


def nvidia_device_class() -> dict[str, Any]:
    """NVIDIA's DeviceClass (its chart's ``deviceclass-gpu.yaml``, without the
    ``extendedResourceName`` that needs the DRAExtendedResource gate)."""
    expression = f"device.driver == '{NVIDIA}' && device.attributes['{NVIDIA}'].type == 'gpu'"
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": NVIDIA}, "spec": {"selectors": [{"cel": {"expression": expression}}]}}  # fmt: skip


def _pod(name: str, namespace: str, node: str, args: list[str]) -> dict[str, Any]:
    """vLLM's docs' container on 2 whole GPUs, as a bare Pod pinned to ``node``."""
    pod_spec = {"tolerations": [{**TAINT, "operator": "Equal"}],
                "nodeSelector": {"kubernetes.io/hostname": node}}  # fmt: skip
    template = vllm_workloads.deployment(name, namespace, args, pod=pod_spec)["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod", **template,
            "metadata": {**template["metadata"], "name": name, "namespace": namespace}}  # fmt: skip


def _wait(api: Client, name: str, namespace: str, done: Any) -> dict[str, Any]:
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        pod: dict[str, Any] = api.get(Pod, name, namespace=namespace).to_dict()
        if done(pod):
            return pod
        time.sleep(0.05)
    raise AssertionError(f"pod {namespace}/{name} not as awaited in {TIMEOUT_SECONDS} s")


def _bound(pod: dict[str, Any]) -> bool:
    return bool(pod["spec"].get("nodeName"))


@pytest.fixture(scope="module")
def client(kube_cluster: KubeCluster) -> Iterator[Client]:
    api = kube_cluster.client()
    try:
        yield api
    finally:
        api.close()


def test_nvidia_dra_mode_claims_nvidias_devices_and_the_scheduler_allocates_them(
    client: Client,
):
    for manifest in (nvidia_device_class(), ready_node(NODE, (TAINT,)), nvidia_slice(NODE),
                     {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}):  # fmt: skip
        create_unless_present(client, manifest)
    args = [vllm_workloads.MODEL, "--max-model-len", "8192", "-tp", "2", "--quantization", "fp8"]
    pod = _pod("qwen", NAMESPACE, NODE, args)
    mutator = Mutator(
        webhook_from_settings(Settings()), ApiTemplateStore(client), mode="nvidia-dra"
    )
    m = mutator.decide(vllm_workloads.review(POD, pod, NAMESPACE))
    assert m.outcome == "mutated" and not m.denials, m
    (template,) = m.templates
    for request in template["spec"]["spec"]["devices"]["requests"]:
        assert request["exactly"]["deviceClassName"] == NVIDIA
    client.create(from_dict(vllm_workloads.patched(pod, m.patch)))
    bound = _wait(client, "qwen", NAMESPACE, _bound)
    assert bound["spec"]["nodeName"] == NODE
    record = json.loads(bound["metadata"]["annotations"][CLAIM_ANNOTATION])["vllm"]
    assert record["mode"] == "nvidia-dra" and record["template"] == template["metadata"]["name"]
    (claim,) = [c.to_dict() for c in client.list(ResourceClaim, namespace=NAMESPACE)]
    results = claim["status"]["allocation"]["devices"]["results"]
    assert sorted(r["device"] for r in results) == ["gpu-0", "gpu-1"]  # distinct uuids
    for result in results:
        assert (result["driver"], result["pool"]) == (NVIDIA_DRIVER.device_class, NODE)
        assert parse_quantity(result["consumedCapacity"]["memory"]) == record["memoryBytes"]


@pytest.fixture(scope="module")
def hami_webhook(
    kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory, client: Client
) -> Iterator[WebhookProcess]:
    """``gatekeeper webhook --mutate --claims-mode hami`` behind a real configuration for
    the Pods of one namespace (``failurePolicy: Fail``: a webhook not called fails)."""
    running = start_webhook(
        tmp_path_factory.mktemp("hami"), "--mutate", "--claims-mode", "hami",
        "--kubeconfig", str(kube_cluster.kubeconfig),
    )  # fmt: skip
    try:
        with mutating_route(client, HAMI_CONFIGURATION, running, HAMI_NAMESPACE):
            yield running
    finally:
        running.stop()


def _hami_node(gpumem_mib: int) -> dict[str, Any]:
    """A Node as HAMi's device plugin leaves it: ``nvidia.com/gpu`` its vGPU count (2 GPUs
    split 10 ways, HAMi's default), plus ``nvidia.com/gpumem`` (MiB) for kube-scheduler."""
    node = ready_node(HAMI_NODE, (TAINT,))
    extra = {HAMI_GPU: "20", HAMI_GPUMEM: str(gpumem_mib)}
    for key in ("capacity", "allocatable"):
        node["status"][key] = {**node["status"][key], **extra}
    return node


def test_hami_mode_writes_hamis_resources_and_kube_scheduler_binds_by_them(
    client: Client, hami_webhook: WebhookProcess
):
    args = [vllm_workloads.MODEL, "--max-model-len", "8192", "-tp", "2"]
    client.create(from_dict(_pod("first", HAMI_NAMESPACE, HAMI_NODE, args)))
    first: dict[str, Any] = client.get(Pod, "first", namespace=HAMI_NAMESPACE).to_dict()
    (container,) = first["spec"]["containers"]
    limits = container["resources"]["limits"]
    record = json.loads(first["metadata"]["annotations"][CLAIM_ANNOTATION])["vllm"]
    assert record["mode"] == "hami" and "template" not in record
    mib = record["memoryBytes"] // MiB
    assert (limits[HAMI_GPU], limits[HAMI_GPUMEM]) == ("2", str(mib))
    assert "claims" not in container["resources"] and not first["spec"].get("resourceClaims")
    assert container["args"][-4:-2] == [
        "--kv-cache-memory-bytes",
        str(record["kvCacheMemoryBytes"]),
    ]
    create_unless_present(client, _hami_node(mib * 3 // 2))  # room for one such pod, not two
    assert _wait(client, "first", HAMI_NAMESPACE, _bound)["spec"]["nodeName"] == HAMI_NODE
    client.create(from_dict(_pod("second", HAMI_NAMESPACE, HAMI_NODE, args)))
    waiting = _wait(client, "second", HAMI_NAMESPACE, _unschedulable)
    assert not waiting["spec"].get("nodeName")
    (condition,) = [c for c in waiting["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert f"Insufficient {HAMI_GPUMEM}" in condition["message"]


def _unschedulable(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(
        c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions
    )


def test_hami_mode_checks_a_workloads_own_gpumem(client: Client):
    """A container that names HAMi's memory itself is left alone unless its MiB are fewer
    than a rank needs; a percentage of a GPU nobody knows yet is not compared."""
    mutator = Mutator(webhook_from_settings(Settings()), ApiTemplateStore(client), mode="hami")
    kind = {"group": "apps", "version": "v1", "kind": "Deployment"}
    args = [vllm_workloads.MODEL, "--max-model-len", "8192"]

    def decided(limits: dict[str, Any]) -> Any:
        resources = {"limits": {HAMI_GPU: 1, **limits}}
        manifest = vllm_workloads.deployment("own", HAMI_NAMESPACE, args, resources=resources)
        return mutator.decide(vllm_workloads.review(kind, manifest, HAMI_NAMESPACE))

    small = decided({HAMI_GPUMEM: 1024})
    assert small.outcome == "denied" and not small.patch
    (text,) = small.denials
    assert "nvidia.com/gpumem: 1024 requests 1073741824 bytes (1.00 GiB)" in text
    assert "raise it to" in text
    assert decided({HAMI_GPUMEM: 80000}).outcome == "unchanged"
    assert decided({"nvidia.com/gpumem-percentage": 50}).outcome == "unchanged"
    assert decided({}).outcome == "mutated"


def test_every_mode_writes_the_same_flags(client: Client):
    """The worker reserves what was requested whoever keeps the books: one Deployment,
    the same command line in all three modes; only the request's form differs."""
    kind = {"group": "apps", "version": "v1", "kind": "Deployment"}
    args = [vllm_workloads.MODEL, "--max-model-len", "8192", "-tp", "2", "--quantization", "fp8"]
    manifest = vllm_workloads.deployment("same", NAMESPACE, args)
    lines, resources = {}, {}
    for mode in ("gatekeeper", "nvidia-dra", "hami"):
        store = ApiTemplateStore(client)
        m = Mutator(webhook_from_settings(Settings()), store, mode=mode).decide(
            vllm_workloads.review(kind, manifest, NAMESPACE)
        )
        assert m.outcome == "mutated", (mode, m)
        (container,) = vllm_workloads.patched(manifest, m.patch)["spec"]["template"]["spec"][
            "containers"
        ]
        lines[mode] = container["args"]
        resources[mode] = container["resources"]
    assert lines["gatekeeper"] == lines["nvidia-dra"] == lines["hami"]
    assert "--kv-cache-memory-bytes" in lines["hami"]
    assert resources["gatekeeper"] == resources["nvidia-dra"]
    assert resources["nvidia-dra"]["claims"] == [{"name": "vllm-gpus"}]
    assert set(resources["hami"]["limits"]) == {HAMI_GPU, HAMI_GPUMEM}
