"""The validating webhook in cluster mode (``gatekeeper webhook --published-devices``)
judges workloads against the ResourceSlices the cluster publishes, called by the real
apiserver through the shipped ValidatingWebhookConfiguration over TLS on loopback.

The configuration's namespace selector is narrowed to this module's namespace, its
failure policy is ``Fail`` (a webhook that was not called fails the tests) and the
webhook reads the slices at every review (``--published-refresh-seconds 0``). Workloads
are sent as dry runs (``dryRun=All``: admission runs, nothing is stored) with the raw
HTTP API, so that the apiserver's ``Warning`` headers can be read. Slices other modules
left in the session (H100s) are set aside for this module and put back after it, so that
what is published is what each test says.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from lightkube import Client, KubeConfig
from lightkube.codecs import from_dict
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.admissionregistration_v1 import ValidatingWebhookConfiguration
from lightkube.resources.core_v1 import Namespace, Node
from lightkube.resources.resource_v1 import ResourceSlice

from bench.webhook_configs import DEPLOY, VALIDATING, shipped_configuration
from gatekeeper.cli.entry import build_parser
from gatekeeper.cluster import DRIVER_NAME, resource_slice
from gatekeeper.gpus.declared import parse_declared_node
from gatekeeper.k8s.published import PublishedDevices
from gatekeeper.placement.policy import PlacementPolicy
from tests.support.kube_cluster import KubeCluster, ready_node
from tests.support.polling import wait_for
from tests.support.prometheus_server import free_port
from tests.support.webhook_process import WebhookProcess, start_webhook

pytestmark = pytest.mark.k8s

NAMESPACE = "published"
NODES = ("published-a", "published-b")
LLAMA_70B = ["meta-llama/Llama-3.1-70B-Instruct", "--max-model-len", "8192"]
QWEN_14B = ["Qwen/Qwen2.5-14B-Instruct", "--max-model-len", "8192"]
QWEN_7B = ["Qwen/Qwen2.5-7B-Instruct", "--max-model-len", "8192"]
UNPUBLISHED = "cannot judge it by the cluster's GPUs: no node publishes a GPU"


def deployment(name: str, args: list[str]) -> dict[str, Any]:
    """A vLLM Deployment as production-stack writes one: no GPU product named."""
    labels = {"app": name}
    container = {"name": "vllm", "image": "vllm/vllm-openai:v0.32.0",
                 "command": ["vllm", "serve"], "args": args}  # fmt: skip
    template = {"metadata": {"labels": labels}, "spec": {"containers": [container]}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {"replicas": 0, "selector": {"matchLabels": labels}, "template": template},
    }


def dry_run(cluster: KubeCluster, manifest: dict[str, Any]) -> tuple[int, str, str]:
    """Status, the refusal's message and the ``Warning`` headers of creating ``manifest``."""
    url = f"{cluster.server}/apis/apps/v1/namespaces/{NAMESPACE}/deployments?dryRun=All"
    headers = {"Authorization": f"Bearer {cluster.token}"}
    context = ssl.create_default_context(cafile=str(cluster.ca_path))
    with httpx.Client(verify=context, timeout=30) as client:
        answer = client.post(url, json=manifest, headers=headers)
    message = answer.json().get("message", "") if answer.status_code >= 400 else ""
    return answer.status_code, message, "\n".join(answer.headers.get_list("warning"))


def delete_slice(client: Client, node: str) -> None:
    """Deletes ``node``'s slice if there is one."""
    name = f"{node}-{DRIVER_NAME}"
    if list(client.list(ResourceSlice, fields={"metadata.name": name})):
        client.delete(ResourceSlice, name)


@pytest.fixture(scope="module")
def webhook(
    kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WebhookProcess]:
    """``gatekeeper webhook --published-devices`` reading the slices at every review."""
    flags = ("--published-devices", "--published-refresh-seconds", "0")
    kubeconfig = ("--kubeconfig", str(kube_cluster.kubeconfig))
    running = start_webhook(tmp_path_factory.mktemp("published"), *flags, *kubeconfig)
    yield running  # pytest runs the rest after the module, whatever its tests did
    running.stop()


@pytest.fixture(scope="module")
def api(kube_cluster: KubeCluster, webhook: WebhookProcess) -> Iterator[Client]:
    """The namespace and the configuration; the session's other slices set aside."""
    client = kube_cluster.client()
    others = [s.to_dict() for s in client.list(ResourceSlice, fields={"spec.driver": DRIVER_NAME})]
    for other in others:
        client.delete(ResourceSlice, other["metadata"]["name"])
    client.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
    config = shipped_configuration(
        VALIDATING, webhook.url(""), webhook.ca_bundle, NAMESPACE, "Fail"
    )
    client.create(from_dict(config))
    try:
        yield client
    finally:
        client.delete(ValidatingWebhookConfiguration, config["metadata"]["name"])
        for name in NODES:
            delete_slice(client, name)
        for other in others:
            other["metadata"] = {"name": other["metadata"]["name"]}
            client.create(from_dict(other))
        client.close()


def test_nothing_published_allows_with_a_warning(api: Client, kube_cluster: KubeCluster) -> None:
    manifest = deployment("llama-70b", LLAMA_70B)
    # the apiserver reads a new configuration a moment later: wait until the webhook answers
    status, _, warnings = wait_for(
        "the webhook's warning",
        lambda: answered if (answered := dry_run(kube_cluster, manifest))[2] else None,
    )
    assert status == 201
    assert UNPUBLISHED in warnings and "start the node agents" in warnings
    assert "no GPU named" in warnings  # judged as before: nothing else to go by


def test_a_70b_at_fp16_fits_no_published_l4_and_is_denied_naming_them(
    api: Client, kube_cluster: KubeCluster
) -> None:
    for node in NODES:
        api.create(from_dict(resource_slice(node, parse_declared_node("2xL4"), PlacementPolicy())))
    status, message, _ = dry_run(kube_cluster, deployment("llama-70b", LLAMA_70B))
    print(f"denied: {message}")
    assert status == 403
    assert 'admission webhook "memory.vllm-gatekeeper.io" denied the request' in message
    for part in (
        "meta-llama/Llama-3.1-70B-Instruct does not fit on L4 (published by the cluster: "
        "4 x L4 (21.11 GiB claimable) on 2 nodes)",
        "at TP=1 it needs 138.02 GiB per GPU (CUDA context 0.50 GiB outside vLLM's budget; "
        "inside it 137.52 GiB: weights 131.45 GiB",
        "Nothing nearby fits",
        "no device the cluster publishes holds it",
    ):
        assert part in message
    status, message, _ = dry_run(kube_cluster, deployment("qwen-14b", QWEN_14B))
    assert status == 403
    assert "Would fit: --tensor-parallel-size 2 with nvidia.com/gpu: 2" in message


def test_a_model_a_published_device_holds_is_allowed(
    api: Client, kube_cluster: KubeCluster
) -> None:
    status, message, warnings = dry_run(kube_cluster, deployment("qwen-7b", QWEN_7B))
    assert (status, message) == (201, "")
    assert UNPUBLISHED not in warnings
    tp4 = deployment("qwen-7b-tp4", [*QWEN_7B, "--tensor-parallel-size", "4"])
    status, message, _ = dry_run(kube_cluster, tp4)
    assert status == 403
    assert "needs 4 GPUs on one node but no node publishes more than 2" in message


def test_the_cluster_component_runs_the_webhook_on_the_published_devices() -> None:
    """The component adds --published-devices to the webhook's arguments, and its RBAC
    lets the webhook list ResourceSlices and Nodes (the two calls ``PublishedDevices``
    makes) and the MutatingWebhookConfigurations (``ApiNamespaceScope``), and nothing
    else."""
    component = DEPLOY / "components" / "cluster"
    kustomization = yaml.safe_load((component / "kustomization.yaml").read_text())
    (patch,) = [p for p in kustomization["patches"] if p["target"]["kind"] == "Deployment"]
    added = [o["value"] for o in yaml.safe_load(patch["patch"]) if o["op"] == "add"]
    args = build_parser().parse_args(["webhook", "--cert", "c", "--key", "k", *added])
    assert (args.published_devices, args.published_refresh_seconds) == (True, 10.0)
    (role,) = [
        d
        for d in yaml.safe_load_all((component / "webhook-rbac.yaml").read_text())
        if d["kind"] == "ClusterRole"
    ]
    listed = [r for r in role["rules"] if r["verbs"] == ["list"]]
    assert listed == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]},  # node_scope's labels
        # the mutating webhook's namespace selector, checked in the webhook itself (#38)
        {"apiGroups": ["admissionregistration.k8s.io"],
         "resources": ["mutatingwebhookconfigurations"], "verbs": ["list"]},
        # the template sweep: which objects name a template (#39)
        {"apiGroups": ["", "apps", "batch", "leaderworkerset.x-k8s.io"],
         "resources": ["pods", "replicasets", "deployments", "statefulsets", "daemonsets",
                       "controllerrevisions", "jobs", "cronjobs", "leaderworkersets"],
         "verbs": ["list"]},
    ]  # fmt: skip


def test_the_reader_reads_again_only_after_its_refresh(api: Client) -> None:
    now = [0.0]
    reader = PublishedDevices(api, refresh_seconds=10, clock=lambda: now[0])
    before = reader()
    assert before.error is None and [s.devices for s in before.shapes] == [4]  # 2 nodes x 2
    extra = resource_slice("published-c", parse_declared_node("1xH100-80GB"), PlacementPolicy())
    api.create(from_dict(extra))
    try:
        now[0] = 9.9
        assert reader() is before  # within the refresh: not read again
        now[0] = 10.0
        assert [s.product for s in reader().shapes] == ["H100-80GB", "L4"]
    finally:
        api.delete(ResourceSlice, extra["metadata"]["name"])


def test_an_apiserver_that_cannot_be_reached_is_the_fleet_s_error(
    kube_cluster: KubeCluster,
) -> None:
    config = yaml.safe_load(Path(kube_cluster.kubeconfig).read_text())
    for cluster in config["clusters"]:  # the session's kubeconfig, on a port nobody serves
        cluster["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    down = Client(KubeConfig.from_dict(config), trust_env=False)
    error = PublishedDevices(down)().error
    assert error is not None and error.startswith("the apiserver cannot be reached ("), error


def test_a_pod_pinned_by_its_node_selector_is_judged_on_that_node_s_gpus_only(
    api: Client, kube_cluster: KubeCluster
) -> None:
    """Two labelled Nodes, one publishing L4s, one an H100: a 14B fits the H100, so it
    passed whatever its node selector said; pinned to the L4 node it is now denied, the
    denial naming the node judged and why the others were left out."""
    for name in NODES:  # the earlier tests' slices, of nodes with no Node object
        delete_slice(api, name)
    products = {"published-l4": ("2xL4", "NVIDIA-L4"),
                "published-h100": ("1xH100-80GB", "NVIDIA-H100-80GB-HBM3")}  # fmt: skip
    for name, (gpus, label) in products.items():
        node = ready_node(name, ({"key": "published", "effect": "NoSchedule"},))
        node["metadata"]["labels"]["nvidia.com/gpu.product"] = label
        api.create(from_dict(node))
        api.create(from_dict(resource_slice(name, parse_declared_node(gpus), PlacementPolicy())))
    try:
        read = PublishedDevices(api)()  # the Nodes' labels read beside the slices
        assert read.nodes is not None and read.nodes_error is None
        assert read.nodes["published-l4"]["nvidia.com/gpu.product"] == "NVIDIA-L4"
        assert dry_run(kube_cluster, deployment("qwen-14b", QWEN_14B))[:2] == (201, "")
        pinned = deployment("qwen-14b-l4", QWEN_14B)
        pinned["spec"]["template"]["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-L4"}
        status, message, _ = dry_run(kube_cluster, pinned)
        print(f"denied: {message}")
        assert status == 403
        assert "does not fit on L4 (published by the cluster: 2 x L4 (" in message
        assert "Would fit: --tensor-parallel-size 2 with nvidia.com/gpu: 2" in message
        assert (
            "no device on the nodes it may land on holds it (published: 2 x L4 (21.11 GiB "
            "claimable) on 1 node; judged on the nodes it may land on: published-l4; left "
            "out: published-h100 (nodeSelector nvidia.com/gpu.product=NVIDIA-L4: the node's "
            "is 'NVIDIA-H100-80GB-HBM3'))"
        ) in message
        away = deployment("qwen-14b-not-l4", QWEN_14B)
        term = {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "NotIn",
                                      "values": ["NVIDIA-L4"]}]}  # fmt: skip
        required = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        away["spec"]["template"]["spec"]["affinity"] = {"nodeAffinity": required}
        assert dry_run(kube_cluster, away)[:2] == (201, "")
    finally:
        for name in products:
            api.delete(ResourceSlice, f"{name}-{DRIVER_NAME}")
            api.delete(Node, name)
