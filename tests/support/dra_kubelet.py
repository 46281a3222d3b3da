"""kubelet's side of the DRA kubelet plugin, for tests/cluster/test_kubelet_plugin.py.

``Kubelet`` speaks to the plugin's sockets with kubelet's method names and messages (the
registration handshake, then prepare and unprepare); ``PluginNode`` runs one node's plugin
in this process on the NVML stand-in, restartable on the same directories; ``allocate``
has the real scheduler allocate a claim for a pod on the module's tainted Node.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import jsonschema  # type: ignore[import-untyped]
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.resources.resource_v1 import ResourceClaim
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from gatekeeper.cluster import DRIVER_NAME
from gatekeeper.cluster.agent import quantity_bytes
from gatekeeper.cluster.cdi import spec_file_name
from gatekeeper.cluster.dra_driver import DraDriver, DriverPaths
from gatekeeper.cluster.kubelet_api import dra_v1_pb2 as dra
from gatekeeper.cluster.kubelet_api import pluginregistration_v1_pb2 as reg
from gatekeeper.cluster.kubelet_plugin import KubeletPlugin, PluginSockets, claim_reader
from gatekeeper.cluster.prepared import ClaimRef
from gatekeeper.gpus.nvml import NvmlInventory
from gatekeeper.gpus.stand_in import FakeNvml, h100

NODE = "plugin-node"
NS = "plugin"
NODE_TAINT = {"key": "gatekeeper.dev/plugin-test", "value": "only", "effect": "NoSchedule"}
GiB = 2**30
TIMEOUT_SECONDS = 30.0
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DRA = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/"
REG = "/pluginregistration.Registration/"
# A pod's cgroup as kubelet's systemd driver names it (the uid with underscores).
CGROUP = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri.scope\n"


def node_manifest() -> dict[str, Any]:
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test"}
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
        "spec": {"taints": [NODE_TAINT]},
        "status": {"conditions": [ready], "capacity": capacity, "allocatable": capacity},
    }


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
) -> Allocated:
    """A claim for ``memory_bytes`` (on GPU ``gpu`` if given), or of ``requests``,
    allocated by the scheduler for a pod that references it."""
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
                {"name": "vllm", "image": "vllm", "resources": {"claims": [{"name": "gpu"}]}}
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


def claim_message(ref: ClaimRef) -> dra.Claim:
    return dra.Claim(namespace=ref.namespace, name=ref.name, uid=ref.uid)


class Kubelet:
    """kubelet's side: the registration handshake, then prepare and unprepare."""

    def __init__(self, registration_socket: Path) -> None:
        self._reg = grpc.insecure_channel(f"unix://{registration_socket}")
        self._dra: Any = None

    def _call(self, channel: Any, method: str, request: Any, response: Any) -> Any:
        call = channel.unary_unary(
            method,
            request_serializer=type(request).SerializeToString,
            response_deserializer=response.FromString,
        )
        return call(request, timeout=10)

    def register(self) -> reg.PluginInfo:
        info: reg.PluginInfo = self._call(
            self._reg, REG + "GetInfo", reg.InfoRequest(), reg.PluginInfo
        )
        self._dra = grpc.insecure_channel(f"unix://{info.endpoint}")
        status = reg.RegistrationStatus(plugin_registered=True)
        self._call(
            self._reg, REG + "NotifyRegistrationStatus", status, reg.RegistrationStatusResponse
        )
        return info

    def prepare(self, *refs: ClaimRef) -> dict[str, dra.NodePrepareResourceResponse]:
        request = dra.NodePrepareResourcesRequest(claims=[claim_message(r) for r in refs])
        method = DRA + "NodePrepareResources"
        answer = self._call(self._dra, method, request, dra.NodePrepareResourcesResponse)
        return dict(answer.claims)

    def unprepare(self, *refs: ClaimRef) -> dict[str, dra.NodeUnprepareResourceResponse]:
        request = dra.NodeUnprepareResourcesRequest(claims=[claim_message(r) for r in refs])
        method = DRA + "NodeUnprepareResources"
        answer = self._call(self._dra, method, request, dra.NodeUnprepareResourcesResponse)
        return dict(answer.claims)

    def close(self) -> None:
        for channel in (self._reg, self._dra):
            if channel is not None:
                channel.close()


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

    def start(self) -> Kubelet:
        self.inventory = NvmlInventory()
        driver = DraDriver(
            self.node_name,
            self.paths,
            claim_reader(self.client),
            self.inventory.snapshot,
            quantity_bytes,
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


def registered(sockets: PluginSockets, agent: subprocess.Popen[bytes], log: Path) -> Kubelet:
    """kubelet's handshake, tried until the agent answers (as kubelet retries): the killed
    agent's socket file stays behind and refuses until the new one replaces it."""
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while True:
        assert agent.poll() is None, log.read_text()
        kubelet = Kubelet(sockets.registration)
        try:
            assert kubelet.register().endpoint == str(sockets.dra)
        except grpc.RpcError:
            kubelet.close()
            assert time.monotonic() < deadline, f"no plugin answered: {log.read_text()}"
            time.sleep(0.05)
        else:
            return kubelet
