"""The DRA kubelet plugin driven over its unix sockets as kubelet drives it (issue 30 item 1).

A grpc client speaks to the plugin's two sockets with kubelet's own method names and
messages: ``/pluginregistration.Registration/GetInfo`` and ``NotifyRegistrationStatus`` on
the registration socket, then ``/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/
NodePrepareResources`` and ``NodeUnprepareResources`` on the DRA socket GetInfo names. The
claims are allocated by the real kube-scheduler on the session's apiserver (a Pod references
each claim; no kubelet: the Node is Ready by its registered status, and tainted so that only
these pods land there); the GPUs are the NVML stand-in driver's, read through NvmlInventory.
The CDI specs validate against the CDI JSON schema (tests/fixtures/cdi).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import jsonschema  # type: ignore[import-untyped]
import pytest
from lightkube import ApiError, Client
from lightkube.codecs import from_dict
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Node
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceSlice
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from gatekeeper.cluster import DRIVER_NAME, resource_slice
from gatekeeper.cluster.agent import quantity_bytes
from gatekeeper.cluster.cdi import spec_file_name
from gatekeeper.cluster.checkpoint import Checkpoint, CheckpointError
from gatekeeper.cluster.dra_driver import DraDriver, DriverPaths
from gatekeeper.cluster.kubelet_api import dra_v1_pb2 as dra
from gatekeeper.cluster.kubelet_api import pluginregistration_v1_pb2 as reg
from gatekeeper.cluster.kubelet_plugin import KubeletPlugin, PluginSockets, claim_reader
from gatekeeper.cluster.prepared import ClaimRef
from gatekeeper.gpus import StaticInventory
from gatekeeper.gpus.nvml import NvmlInventory
from gatekeeper.gpus.stand_in import FakeNvml, FakeProcess, h100, subprocess_env, write_state
from gatekeeper.placement.types import PlacementPolicy
from tests.support.kube_cluster import KubeCluster

pytestmark = pytest.mark.k8s

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


def _node() -> dict[str, Any]:
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test"}
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
        "spec": {"taints": [NODE_TAINT]},
        "status": {"conditions": [ready], "capacity": capacity, "allocatable": capacity},
    }


@pytest.fixture(scope="module")
def client(kube_cluster: KubeCluster) -> Iterator[Client]:
    """The Node, the DeviceClass and the node's slice: two recorded H100s (77.1 GiB each)."""
    client = kube_cluster.client()
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER_NAME},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER_NAME}"'}}]},
    }
    recorded = StaticInventory.from_json(FIXTURES / "gpus" / "h100_80g_x8.json").snapshot()
    two = dataclasses.replace(recorded, gpus=recorded.gpus[:2])
    published = resource_slice(NODE, two, PlacementPolicy())
    client.create(from_dict(_node()))
    made_class = True
    try:
        client.create(from_dict(device_class))
    except ApiError as e:  # another cluster test module made it first
        assert e.status.code == 409, e
        made_class = False
    client.create(from_dict(published))
    client.create(Namespace(metadata=ObjectMeta(name=NS)))
    yield client
    client.delete(Node, NODE)
    client.delete(ResourceSlice, published["metadata"]["name"])
    if made_class:  # the other modules create it as their own
        client.delete(DeviceClass, DRIVER_NAME)
    client.close()


@dataclasses.dataclass
class Allocated:
    ref: ClaimRef
    pod_uid: str
    device: str


def allocate(client: Client, name: str, memory_bytes: int, gpu: int | None = None) -> Allocated:
    """A claim for ``memory_bytes`` (on GPU ``gpu`` if given), allocated by the scheduler
    for a pod that references it."""
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
        "spec": {"devices": {"requests": [{"name": "rank0", "exactly": request}]}},
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
            (result,) = status["allocation"]["devices"]["results"]
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


@pytest.fixture
def node(client: Client, fake_nvml: FakeNvml, tmp_path: Path) -> Iterator[PluginNode]:
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


def validate_cdi(spec: dict[str, Any]) -> None:
    schema = json.loads((FIXTURES / "cdi" / "schema.json").read_text())
    defs = json.loads((FIXTURES / "cdi" / "defs.json").read_text())
    registry: Registry[Any] = Registry().with_resource(
        "defs.json", Resource.from_contents(defs, default_specification=DRAFT7)
    )
    jsonschema.Draft7Validator(schema, registry=registry).validate(spec)


def test_registration_handshake_names_the_driver_and_its_dra_socket(node: PluginNode) -> None:
    assert node.kubelet is not None and node.plugin is not None
    info = node.kubelet.register()
    assert (info.type, info.name, info.endpoint) == (
        "DRAPlugin",
        DRIVER_NAME,
        str(node.sockets.dra),
    )
    assert list(info.supported_versions) == ["v1.DRAPlugin"]
    assert node.sockets.registration.name == f"{DRIVER_NAME}-reg.sock"
    status = node.plugin.registration_status
    assert status is not None and status.plugin_registered


def test_prepare_returns_the_cdi_device_and_survives_a_restart(
    node: PluginNode, client: Client
) -> None:
    claim = allocate(client, "first", 12 * GiB, gpu=1)
    assert node.kubelet is not None
    start = time.perf_counter()
    answer = node.kubelet.prepare(claim.ref)[claim.ref.uid]
    first_ms = (time.perf_counter() - start) * 1000
    assert answer.error == ""
    (device,) = answer.devices
    cdi_id = f"{DRIVER_NAME}/gpu={claim.ref.uid}-gpu-1"
    assert (list(device.request_names), device.pool_name, device.device_name) == (
        ["rank0"],
        NODE,
        "gpu-1",
    )
    assert list(device.cdi_device_ids) == [cdi_id]
    spec = node.spec(claim.ref)
    validate_cdi(spec)
    assert spec["kind"] == f"{DRIVER_NAME}/gpu"
    assert spec["devices"] == [
        {
            "name": f"{claim.ref.uid}-gpu-1",
            "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}]},
        }
    ]
    uuid = h100(1).uuid
    assert spec["containerEdits"] == {
        "env": [
            f"NVIDIA_VISIBLE_DEVICES={uuid}",
            f"CUDA_VISIBLE_DEVICES={uuid}",
            f"GATEKEEPER_CLAIMED_MEMORY_BYTES={12 * GiB}",
            f"GATEKEEPER_CLAIM={NS}/first",
        ],
        "deviceNodes": [{"path": "/dev/nvidiactl"}],
    }
    # Asked twice (kubelet retries, or two pods share the claim): the same answer, once.
    start = time.perf_counter()
    assert node.kubelet.prepare(claim.ref)[claim.ref.uid] == answer
    again_ms = (time.perf_counter() - start) * 1000
    print(f"prepare over the socket: {first_ms:.1f} ms, again (checkpointed) {again_ms:.1f} ms")
    assert list(Checkpoint(node.paths.checkpoint).load()) == [claim.ref.uid]

    # The worker started and filled the GPU; the agent restarts (a new plugin, the same
    # checkpoint): the claim is answered as before, not checked against NVML again.
    set_gpus(node.fake, used=(0, 78 * GiB))
    kubelet = node.restart()
    assert kubelet.prepare(claim.ref)[claim.ref.uid] == answer

    assert kubelet.unprepare(claim.ref)[claim.ref.uid].error == ""
    assert not (node.paths.cdi_dir / spec_file_name(DRIVER_NAME, claim.ref.uid)).exists()
    assert Checkpoint(node.paths.checkpoint).load() == {}
    assert kubelet.unprepare(claim.ref)[claim.ref.uid].error == ""  # already released
    refused = kubelet.prepare(claim.ref)[claim.ref.uid]  # checked again: the GPU is full
    assert "needs 12884901888 bytes" in refused.error and not refused.devices
    set_gpus(node.fake)
    assert kubelet.prepare(claim.ref)[claim.ref.uid] == answer


def test_bytes_not_free_are_refused_with_the_claim_and_the_numbers(
    node: PluginNode, client: Client
) -> None:
    claim = allocate(client, "crowded", 12 * GiB, gpu=0)
    set_gpus(node.fake, used=(70 * GiB, 0), processes=[FakeProcess(0, 4242, 70 * GiB)])
    assert node.kubelet is not None
    answer = node.kubelet.prepare(claim.ref)[claim.ref.uid]
    print(f"refused: {answer.error}")
    assert not answer.devices
    for part in (
        f"claim {NS}/crowded (uid {claim.ref.uid})",
        "device gpu-0",
        "needs 12884901888 bytes (12.00 GiB)",
        "pid 4242: 75161927680 bytes (70.00 GiB)",
        "kubelet retries the prepare",
    ):
        assert part in answer.error
    free = node.inventory.snapshot().gpus[0].free_bytes  # type: ignore[union-attr]
    assert f"NVML shows {free} bytes" in answer.error
    assert not (node.paths.cdi_dir / spec_file_name(DRIVER_NAME, claim.ref.uid)).exists()
    assert Checkpoint(node.paths.checkpoint).load() == {}


def test_a_claim_of_another_node_or_not_allocated_is_refused(
    node: PluginNode, client: Client, fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    claim = allocate(client, "elsewhere", GiB)
    short = Path(tempfile.mkdtemp(prefix="kp", dir="/tmp"))
    other_paths = DriverPaths(short / "plugins", tmp_path / "other-cdi")
    other = PluginNode(
        client,
        fake_nvml,
        other_paths,
        PluginSockets(other_paths.plugin_dir, short / "registry", DRIVER_NAME),
        node_name="other-node",
    )
    try:
        error = other.start().prepare(claim.ref)[claim.ref.uid].error
    finally:
        other.stop()
        shutil.rmtree(short)
    assert error.startswith(f"claim {NS}/elsewhere (uid {claim.ref.uid}): it is allocated")
    assert f"pool {NODE}, not to this node other-node" in error

    lone = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "lone", "namespace": NS},
        "spec": {
            "devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": DRIVER_NAME}}]}
        },
    }
    client.create(from_dict(lone))
    made: dict[str, Any] = client.get(ResourceClaim, "lone", namespace=NS).to_dict()
    ref = ClaimRef(NS, "lone", made["metadata"]["uid"])
    assert node.kubelet is not None
    error = node.kubelet.prepare(ref)[ref.uid].error
    assert "it is not allocated (no status.allocation)" in error
    gone = ClaimRef(NS, "never-made", "0000")
    assert "the apiserver answered 404" in node.kubelet.prepare(gone)[gone.uid].error


def test_two_prepares_racing_for_the_last_bytes_of_a_gpu_one_is_refused(
    node: PluginNode, client: Client
) -> None:
    # GPU 0 has 20 GiB free; each claim needs 12.
    free = node.inventory.snapshot().gpus[0].free_bytes  # type: ignore[union-attr]
    set_gpus(node.fake, used=(free - 20 * GiB, 0))
    claims = [allocate(client, f"racer-{i}", 12 * GiB, gpu=0) for i in range(2)]
    socket = node.sockets.registration
    answers: dict[str, dra.NodePrepareResourceResponse] = {}
    start = threading.Barrier(2)

    def race(claim: Allocated) -> None:
        kubelet = Kubelet(socket)
        kubelet.register()
        start.wait()
        answers.update(kubelet.prepare(claim.ref))
        kubelet.close()

    threads = [threading.Thread(target=race, args=(c,)) for c in claims]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    won = [c for c in claims if answers[c.ref.uid].devices]
    lost = [c for c in claims if answers[c.ref.uid].error]
    assert len(won) == 1 and len(lost) == 1
    error = answers[lost[0].ref.uid].error
    print(f"the race's loser: {error}")
    assert f"{NS}/{won[0].ref.name}: 12884901888 bytes (12.00 GiB) promised, not yet taken" in error
    assert "needs 12884901888 bytes (12.00 GiB) but 8589934592 bytes (8.00 GiB) are free" in error


def test_memory_a_prepared_claim_s_pod_already_holds_is_not_counted_twice(
    node: PluginNode, client: Client
) -> None:
    first = allocate(client, "running", 20 * GiB, gpu=1)
    assert node.kubelet is not None
    assert node.kubelet.prepare(first.ref)[first.ref.uid].devices
    # Its worker now holds its 20 GiB (a process in the pod's cgroup), beside 20 GiB of a
    # process of no pod.
    pid = os.getpid()
    (node.paths.proc_dir / str(pid)).mkdir()
    (node.paths.proc_dir / str(pid) / "cgroup").write_text(
        CGROUP.format(first.pod_uid.replace("-", "_"))
    )
    held = [FakeProcess(1, pid, 20 * GiB), FakeProcess(1, 1, 20 * GiB)]
    set_gpus(node.fake, used=(0, 40 * GiB), processes=held)
    second = allocate(client, "beside", 30 * GiB, gpu=1)
    # 39.2 GiB free; counting the first claim's 20 GiB again would leave 19.2 < 30.
    assert node.kubelet.prepare(second.ref)[second.ref.uid].devices
    third = allocate(client, "third", 10 * GiB, gpu=1)
    error = node.kubelet.prepare(third.ref)[third.ref.uid].error
    assert f"{NS}/beside: 32212254720 bytes (30.00 GiB) promised, not yet taken" in error
    assert f"{NS}/running" not in error


def test_a_checkpoint_that_does_not_match_its_checksum_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    Checkpoint(path).save({})
    raw = json.loads(path.read_text())
    raw["data"]["claims"]["x"] = {}
    path.write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="checksum does not match"):
        Checkpoint(path).load()
    assert not list(tmp_path.glob(".checkpoint.json.*"))  # no temporary file left


def test_gatekeeper_agent_serves_the_plugin_and_answers_the_same_after_a_sigkill(
    client: Client, kube_cluster: KubeCluster, nvml_stub_lib: Path, tmp_path: Path
) -> None:
    """The installed ``gatekeeper agent --kubelet-plugin``, killed between a prepare and the
    pod's start and started again, answers the prepare the same from its checkpoint."""
    state = tmp_path / "nvml_state.txt"
    write_state(state, [h100(0), h100(1)])
    short = Path(tempfile.mkdtemp(prefix="kp", dir="/tmp"))
    sockets = PluginSockets(short / "plugins", short / "registry", DRIVER_NAME)
    argv = [
        str(Path(sys.executable).with_name("gatekeeper")),
        "agent",
        f"--node-name={NODE}",
        "--gpus=nvml",
        f"--kubeconfig={kube_cluster.kubeconfig}",
        "--interval=3600",
        "--kubelet-plugin",
        f"--plugin-dir={sockets.plugin_dir}",
        f"--registry-dir={sockets.registry_dir}",
        f"--cdi-dir={tmp_path / 'cdi'}",
    ]
    env = subprocess_env(nvml_stub_lib.parent, state)
    claim = allocate(client, "agent-made", 2 * GiB, gpu=0)
    answers = []
    try:
        for _ in range(2):
            with (tmp_path / "agent.log").open("ab") as log:
                agent = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
            kubelet = _registered(sockets, agent, tmp_path / "agent.log")
            answers.append(kubelet.prepare(claim.ref)[claim.ref.uid])
            kubelet.close()
            agent.send_signal(signal.SIGKILL)
            agent.wait(timeout=10)
            write_state(state, [h100(0, used_bytes=79 * GiB), h100(1)])  # the worker started
    finally:
        if agent.poll() is None:
            agent.kill()
        shutil.rmtree(short)
    assert answers[0].error == "" and answers[0].devices
    assert answers[1] == answers[0]


def _registered(sockets: PluginSockets, agent: subprocess.Popen[bytes], log: Path) -> Kubelet:
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
