"""kubelet's side of the DRA kubelet plugin, for tests/cluster/test_kubelet_plugin.py.

``Kubelet`` speaks to the plugin's sockets with kubelet's method names and messages (the
registration handshake, then prepare and unprepare); ``PluginNode`` runs one node's plugin
in this process on the NVML stand-in, restartable on the same directories; ``allocate``
has the real scheduler allocate a claim for a pod on the module's tainted Node;
``plugin_cluster`` and ``plugin_node`` are the bodies of the test modules' fixtures.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from bench.dra_kubelet import Kubelet
from gatekeeper.cluster import DRIVER_NAME, resource_slice
from gatekeeper.cluster.agent import quantity_bytes
from gatekeeper.cluster.cdi import spec_file_name
from gatekeeper.cluster.claims import RankSizing, size_ranks
from gatekeeper.cluster.dra_driver import DraDriver, DriverPaths
from gatekeeper.cluster.kubelet_plugin import (
    KubeletPlugin,
    PluginSockets,
    claim_reader,
    pod_reader,
    slice_reader,
)
from gatekeeper.cluster.pod_cgroup import pod_uid
from gatekeeper.cluster.prepared import ClaimRef
from gatekeeper.cluster.reserves import rank_sizer
from gatekeeper.gpus import StaticInventory
from gatekeeper.gpus.nvml import NvmlInventory
from gatekeeper.gpus.products import gpu_products
from gatekeeper.gpus.stand_in import FakeNvml, h100
from gatekeeper.k8s.pod_patch import with_budget_flags
from gatekeeper.placement.policy import PlacementPolicy
from gatekeeper.settings import Settings, model_resolver
from gatekeeper.vllm.command import parse_vllm_command
from tests.support.agent_node import AgentNode
from tests.support.agent_node import registered as registered_node
from tests.support.kube_cluster import KubeCluster

NODE = "plugin-node"
NS = "plugin"
NODE_TAINT = AgentNode(NODE, NS).taint
GiB = 2**30
TIMEOUT_SECONDS = 30.0
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# A pod's cgroup as kubelet's systemd driver names it (the uid with underscores).
CGROUP = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri.scope\n"


def cgroups(root: Path, pods: dict[int, str | None]) -> Callable[[int], str | None]:
    """``/proc/PID/cgroup`` under ``root`` for each pid (its pod's uid, or a host cgroup)."""
    for pid, uid in pods.items():
        (root / str(pid)).mkdir(parents=True)
        text = CGROUP.format(uid.replace("-", "_")) if uid else "0::/system.slice/ssh.service\n"
        (root / str(pid) / "cgroup").write_text(text)
    return lambda pid: pod_uid(pid, root)


@dataclasses.dataclass
class Allocated:
    ref: ClaimRef
    pod_uid: str
    device: str


def allocate(
    client: Client,
    name: str,
    memory_bytes: int,
    gpu: int | None = None,
    requests: list[dict[str, Any]] | None = None,
    container: dict[str, Any] | None = None,
) -> Allocated:
    """A claim for ``memory_bytes`` (on GPU ``gpu`` if given), or of ``requests``,
    allocated by the scheduler for a pod that references it (in its container ``vllm``,
    whose image, command and args ``container`` gives; none by default)."""
    request: dict[str, Any] = {
        "deviceClassName": DRIVER_NAME,
        "capacity": {"requests": {"memory": str(memory_bytes)}},
    }
    if gpu is not None:
        expression = f'device.attributes["{DRIVER_NAME}"].index == {gpu}'
        request["selectors"] = [{"cel": {"expression": expression}}]
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": requests or [{"name": "rank0", "exactly": request}]}},
    }
    toleration = {k: NODE_TAINT[k] for k in ("key", "value", "effect")} | {"operator": "Equal"}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "tolerations": [toleration],
            "containers": [
                {"image": "vllm", **(container or {})}
                | {"name": "vllm", "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
        },
    }
    client.create(from_dict(claim))
    client.create(from_dict(pod))
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        raw = client.get(ResourceClaim, name, namespace=NS).to_dict()
        status = raw.get("status") or {}
        if status.get("allocation") and status.get("reservedFor"):
            result = status["allocation"]["devices"]["results"][0]
            ref = ClaimRef(NS, name, raw["metadata"]["uid"])
            return Allocated(ref, status["reservedFor"][0]["uid"], result["device"])
        time.sleep(0.02)
    raise AssertionError(f"claim {name} not allocated in {TIMEOUT_SECONDS} s")


def release(client: Client, name: str) -> None:
    """Delete ``allocate``'s pod and claim ``name``, so its bytes go back to the pool."""
    client.delete(Pod, name, namespace=NS, grace_period=0)
    client.delete(ResourceClaim, name, namespace=NS)


def webhook_sized(
    model: str = "Qwen/Qwen2.5-7B-Instruct", max_model_len: int = 8192
) -> tuple[dict[str, Any], RankSizing]:
    """A vLLM container (image, command) with the two flags as the mutating webhook writes
    them (``size_ranks`` on the largest GPU in the table, no GPU named), and its sizing."""
    largest = max(gpu_products(), key=lambda p: p.total_bytes)
    image = "vllm/vllm-openai:v0.11.0"
    line = ["vllm", "serve", model, "--max-model-len", str(max_model_len)]
    command = parse_vllm_command(line, [], image, {})
    assert command is not None
    options = dataclasses.replace(command.options, gpu_memory_utilization=None)
    spec = model_resolver(Settings())(model)
    sizing = size_ranks(spec, options, largest.total_bytes, largest.name, PlacementPolicy())
    kv, u = sizing.kv_cache_memory_bytes, sizing.gpu_memory_utilization
    edited = with_budget_flags({"image": image, "command": line}, kv, u)
    assert isinstance(edited, dict)
    return edited, sizing


@dataclasses.dataclass
class PluginNode:
    """One node's plugin (restartable on the same directories) and kubelet's client."""

    client: Client
    fake: FakeNvml
    paths: DriverPaths
    sockets: PluginSockets
    node_name: str = NODE
    plugin: KubeletPlugin | None = None
    inventory: NvmlInventory | None = None
    kubelet: Kubelet | None = None
    wait_seconds: float = 0.0
    """The driver's wait for bytes not free (``DraDriver(wait_seconds=)``); set, then restart."""
    poll_seconds: float = 0.5

    def start(self) -> Kubelet:
        self.inventory = NvmlInventory()
        driver = DraDriver(
            self.node_name,
            self.paths,
            claim_reader(self.client),
            self.inventory.snapshot,
            quantity_bytes,
            read_pod=pod_reader(self.client),
            size_rank=rank_sizer(model_resolver(Settings()), PlacementPolicy()),
            read_published=slice_reader(self.client, self.node_name),
            wait_seconds=self.wait_seconds,
            poll_seconds=self.poll_seconds,
        )
        self.plugin = KubeletPlugin(driver, self.sockets)
        self.plugin.start()
        self.kubelet = Kubelet(self.sockets.registration)
        self.kubelet.register()
        return self.kubelet

    def stop(self) -> None:
        if self.kubelet is not None:
            self.kubelet.close()
        if self.plugin is not None:
            self.plugin.stop()
        if self.inventory is not None:
            self.inventory.close()

    def restart(self) -> Kubelet:
        self.stop()
        return self.start()

    def spec(self, ref: ClaimRef) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(
            (self.paths.cdi_dir / spec_file_name(DRIVER_NAME, ref.uid)).read_text()
        )
        return loaded


def set_gpus(fake: FakeNvml, used: tuple[int, int] = (0, 0), processes: Any = ()) -> None:
    fake.set(gpus=[h100(i, used_bytes=u) for i, u in enumerate(used)], processes=processes)


def validate_cdi(spec: dict[str, Any]) -> None:
    schema = json.loads((FIXTURES / "cdi" / "schema.json").read_text())
    defs = json.loads((FIXTURES / "cdi" / "defs.json").read_text())
    registry: Registry[Any] = Registry().with_resource(
        "defs.json", Resource.from_contents(defs, default_specification=DRAFT7)
    )
    jsonschema.Draft7Validator(schema, registry=registry).validate(spec)


def plugin_cluster(kube_cluster: KubeCluster) -> Iterator[Client]:
    """The Node, the DeviceClass and the node's slice: two recorded H100s (77.1 GiB each)."""
    client = kube_cluster.client()
    recorded = StaticInventory.from_json(FIXTURES / "gpus" / "h100_80g_x8.json").snapshot()
    two = dataclasses.replace(recorded, gpus=recorded.gpus[:2])
    with registered_node(client, AgentNode(NODE, NS)):
        client.create(from_dict(resource_slice(NODE, two, PlacementPolicy())))
        yield client
    client.close()


def plugin_node(client: Client, fake_nvml: FakeNvml, tmp_path: Path) -> Iterator[PluginNode]:
    """A started plugin on two free stand-in H100s; /dev holds nvidia0, nvidia1, nvidiactl."""
    set_gpus(fake_nvml)
    short = Path(tempfile.mkdtemp(prefix="kp", dir="/tmp"))  # unix socket paths: 107 bytes
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        (dev / name).touch()
    (tmp_path / "proc").mkdir()
    paths = DriverPaths(short / "plugins" / DRIVER_NAME, tmp_path / "cdi", dev, tmp_path / "proc")
    sockets = PluginSockets(paths.plugin_dir, short / "plugins_registry", DRIVER_NAME)
    started = PluginNode(client, fake_nvml, paths, sockets)
    started.start()
    yield started
    started.stop()
    shutil.rmtree(short)
