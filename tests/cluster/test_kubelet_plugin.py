"""The DRA kubelet plugin driven over its unix sockets as kubelet drives it (issue 30 items 1
and 2: a pod whose vLLM flags let vLLM take more than its claim is refused at prepare).

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

import contextlib
import math
import os
import re
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

import pytest
from lightkube import ApiError, Client
from lightkube.codecs import from_dict
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from bench.dra_kubelet import Kubelet, registered
from bench.dra_objects import allocated_claim
from gatekeeper.cluster import DRIVER_NAME
from gatekeeper.cluster.cdi import spec_file_name
from gatekeeper.cluster.checkpoint import Checkpoint
from gatekeeper.cluster.dra_driver import DriverPaths
from gatekeeper.cluster.kubelet_api import dra_v1_pb2 as dra
from gatekeeper.cluster.kubelet_plugin import PluginSockets
from gatekeeper.cluster.prepared import ClaimRef
from gatekeeper.cluster.slices import slice_name, uuid_device_name
from gatekeeper.gpus.stand_in import FakeNvml, FakeProcess, h100, subprocess_env, write_state
from tests.support.dra_kubelet import (
    CGROUP,
    NODE,
    NS,
    GiB,
    PluginNode,
    allocate,
    plugin_cluster,
    plugin_node,
    release,
    set_gpus,
    validate_cdi,
    webhook_sized,
)
from tests.support.kube_cluster import KubeCluster

pytestmark = pytest.mark.k8s
GPU = [uuid_device_name(h100(i).uuid) for i in (0, 1)]
"""The two GPUs' device names (their uuids'), as the slice publishes them."""


@pytest.fixture(scope="module")
def client(kube_cluster: KubeCluster) -> Iterator[Client]:
    """The Node, the DeviceClass and the node's slice: two recorded H100s (77.1 GiB each)."""
    yield from plugin_cluster(kube_cluster)


@pytest.fixture
def node(client: Client, fake_nvml: FakeNvml, tmp_path: Path) -> Iterator[PluginNode]:
    """A started plugin on two free stand-in H100s; /dev holds nvidia0, nvidia1, nvidiactl."""
    yield from plugin_node(client, fake_nvml, tmp_path)


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
    cdi_id = f"{DRIVER_NAME}/gpu={claim.ref.uid}-{GPU[1]}"
    assert (list(device.request_names), device.pool_name, device.device_name) == (
        ["rank0"],
        NODE,
        GPU[1],
    )
    assert list(device.cdi_device_ids) == [cdi_id]
    spec = node.spec(claim.ref)
    validate_cdi(spec)
    assert spec["kind"] == f"{DRIVER_NAME}/gpu"
    assert spec["devices"] == [
        {
            "name": f"{claim.ref.uid}-{GPU[1]}",
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
    error = node.kubelet.refused(claim.ref)
    for part in (
        f"claim {NS}/crowded (uid {claim.ref.uid})",
        f"device {GPU[0]} (GPU 0,",
        "needs 12884901888 bytes (12.00 GiB)",
        "pid 4242: 75161927680 bytes (70.00 GiB)",
        "kubelet retries the prepare",
    ):
        assert part in error
    free = node.inventory.snapshot().gpus[0].free_bytes  # type: ignore[union-attr]
    assert f"NVML shows {free} bytes" in error
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


def _with_free(node: PluginNode, free_bytes: int) -> None:
    """GPU 0 with ``free_bytes`` free, the rest held by a process no claim books."""
    total_free = node.inventory.snapshot().gpus[0].free_bytes  # type: ignore[union-attr]
    held = total_free - free_bytes
    set_gpus(node.fake, used=(held, 0), processes=[FakeProcess(0, 4242, held)])


class Prepare(threading.Thread):
    """One kubelet's prepare of ``ref`` on its own connection, timed: ``answer`` and the
    ``perf_counter`` it came back at."""

    def __init__(self, node: PluginNode, ref: ClaimRef, start: threading.Barrier | None = None):
        super().__init__()
        self.node, self.ref, self.barrier = node, ref, start
        self.answer: dra.NodePrepareResourceResponse | None = None
        self.started = self.answered = 0.0

    def run(self) -> None:
        kubelet = Kubelet(self.node.sockets.registration)
        kubelet.register()
        if self.barrier is not None:
            self.barrier.wait()
        self.started = time.perf_counter()
        self.answer = kubelet.prepare(self.ref)[self.ref.uid]
        self.answered = time.perf_counter()
        kubelet.close()

    def waited(self) -> float:
        self.join(timeout=30)
        assert self.answer is not None
        return self.answered - self.started


def _until_waiting(node: PluginNode, ref: ClaimRef) -> None:
    assert node.plugin is not None
    deadline = time.monotonic() + 10
    while ref not in node.plugin.driver.waiting:
        assert time.monotonic() < deadline, "the prepare never waited"
        time.sleep(0.01)


def test_two_prepares_racing_for_the_last_bytes_of_a_gpu_one_waits_then_is_refused(
    node: PluginNode, client: Client
) -> None:
    node.wait_seconds = 0.6
    node.restart()
    _with_free(node, 20 * GiB)  # each claim needs 12
    claims = [allocate(client, f"racer-{i}", 12 * GiB, gpu=0) for i in range(2)]
    start = threading.Barrier(2)
    racers = [Prepare(node, c.ref, start) for c in claims]
    for racer in racers:
        racer.start()
    seconds = [r.waited() for r in racers]
    answers = [r.answer for r in racers]
    won = [c for c, a in zip(claims, answers, strict=True) if a is not None and a.devices]
    lost = [(c, a, t) for c, a, t in zip(claims, answers, seconds, strict=True) if a and a.error]
    assert len(won) == 1 and len(lost) == 1
    _, answer, waited = lost[0]
    assert answer is not None
    print(f"the race's loser, after {waited:.2f} s: {answer.error}")
    assert waited >= 0.6  # it waited the bound out: nobody unprepared
    assert f"{NS}/{won[0].ref.name}: 12884901888 bytes (12.00 GiB) promised, not yet taken" in (
        answer.error
    )
    assert "needs 12884901888 bytes (12.00 GiB) but 8589934592 bytes (8.00 GiB) are free" in (
        answer.error
    )
    assert re.search(r"It waited 0\.[6-9]\d s|It waited [1-9]\.\d\d s", answer.error)
    assert "--prepare-wait-seconds 0.6, within kubelet's 45 s deadline" in answer.error
    for claim in claims:  # the slice's room, for the module's later claims
        release(client, claim.ref.name)


def test_a_waiting_prepare_is_admitted_as_soon_as_the_holder_is_unprepared(
    node: PluginNode, client: Client
) -> None:
    # Polling NVML every 5 s: an admission within a second is the unprepare's wake-up.
    node.wait_seconds, node.poll_seconds = 20.0, 5.0
    kubelet = node.restart()
    _with_free(node, 20 * GiB)
    holder = allocate(client, "holder", 12 * GiB, gpu=0)
    assert kubelet.prepare(holder.ref)[holder.ref.uid].devices
    waiter = Prepare(node, allocate(client, "waiter", 12 * GiB, gpu=0).ref)
    waiter.start()
    _until_waiting(node, waiter.ref)
    assert kubelet.unprepare(holder.ref)[holder.ref.uid].error == ""
    unprepared = time.perf_counter()
    waited = waiter.waited()
    assert waiter.answer is not None and waiter.answer.devices, waiter.answer
    after_ms = (waiter.answered - unprepared) * 1000
    print(f"the waiter: admitted {after_ms:.1f} ms after the unprepare, {waited:.2f} s in all")
    assert after_ms < 2500  # half the poll: only the wake-up can admit it so soon
    assert node.plugin is not None and node.plugin.driver.waiting == ()
    release(client, "holder")
    release(client, "waiter")


def test_a_waiting_prepare_sees_memory_freed_outside_the_claims(
    node: PluginNode, client: Client
) -> None:
    """No unprepare: a foreign job exits, and NVML read again shows the bytes free."""
    node.wait_seconds, node.poll_seconds = 20.0, 0.2
    node.restart()
    _with_free(node, 4 * GiB)
    waiter = Prepare(node, allocate(client, "after-foreign", 12 * GiB, gpu=0).ref)
    waiter.start()
    _until_waiting(node, waiter.ref)
    set_gpus(node.fake)  # the foreign process exited
    freed = time.perf_counter()
    waiter.waited()
    assert waiter.answer is not None and waiter.answer.devices, waiter.answer
    after = waiter.answered - freed
    print(f"admitted {after * 1000:.0f} ms after the foreign memory was freed")
    assert after < 5  # one poll (0.2 s) on a quiet machine; far from the 20 s bound
    release(client, "after-foreign")


def test_a_wait_ends_before_kubelet_s_deadline_on_the_call(
    node: PluginNode, client: Client
) -> None:
    """kubelet's call carries a deadline (45 s in kubelet; 2.5 s here): the wait ends 2 s
    before it, so kubelet gets the reason rather than DEADLINE_EXCEEDED."""
    node.wait_seconds, node.poll_seconds = 20.0, 5.0
    node.restart()
    _with_free(node, 4 * GiB)
    claim = allocate(client, "short-deadline", 12 * GiB, gpu=0)
    kubelet = Kubelet(node.sockets.registration, timeout_seconds=2.5)
    kubelet.register()
    start = time.perf_counter()
    error = kubelet.refused(claim.ref)
    took = time.perf_counter() - start
    kubelet.close()
    assert 0.4 <= took < 2.5, took
    assert "It waited 0." in error and "needs 12884901888 bytes" in error
    release(client, "short-deadline")


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
        "--tolerance-mib=1000000",  # the full GPU below must not taint the module's slice
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
            kubelet = registered(sockets, agent, tmp_path / "agent.log")
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


def test_a_claim_of_two_gpus_gets_both_in_one_spec(node: PluginNode, client: Client) -> None:
    """A TP 2 claim: one request per rank, each pinned to its GPU by a CEL selector."""
    ranks = [
        {
            "name": f"rank{i}",
            "exactly": {
                "deviceClassName": DRIVER_NAME,
                "capacity": {"requests": {"memory": str(size)}},
                "selectors": [
                    {"cel": {"expression": f'device.attributes["{DRIVER_NAME}"].index == {i}'}}
                ],
            },
        }
        for i, size in enumerate((2 * GiB, GiB))
    ]
    claim = allocate(client, "tp2", 0, requests=ranks)
    assert node.kubelet is not None
    answer = node.kubelet.prepare(claim.ref)[claim.ref.uid]
    assert [(list(d.request_names), d.device_name) for d in answer.devices] == [
        (["rank0"], GPU[0]),
        (["rank1"], GPU[1]),
    ]
    spec = node.spec(claim.ref)
    validate_cdi(spec)
    assert [d["name"] for d in spec["devices"]] == [f"{claim.ref.uid}-{GPU[i]}" for i in (0, 1)]
    uuids = f"{h100(0).uuid},{h100(1).uuid}"
    env = spec["containerEdits"]["env"]
    assert f"NVIDIA_VISIBLE_DEVICES={uuids}" in env
    assert f"GATEKEEPER_CLAIMED_MEMORY_BYTES={2 * GiB},{GiB}" in env


def test_a_pod_whose_vllm_flags_take_more_than_its_claim_is_refused_with_the_numbers(
    node: PluginNode, client: Client
) -> None:
    assert node.kubelet is not None and node.inventory is not None
    total = node.inventory.snapshot().gpus[0].total_bytes
    vllm = {
        "image": "vllm/vllm-openai:v0.11.0",
        "command": ["vllm", "serve", "Qwen/Qwen2.5-7B-Instruct"],
    }
    greedy = allocate(
        client,
        "greedy",
        16 * GiB,
        gpu=0,
        container=vllm | {"args": ["--gpu-memory-utilization", "0.9"]},
    )
    error = node.kubelet.refused(greedy.ref)
    for part in (
        f"claim {NS}/greedy (uid {greedy.ref.uid}): container 'vllm' of pod {NS}/greedy",
        f"take {math.ceil(0.9 * total)} bytes",
        f"--gpu-memory-utilization: 0.9 x {total} bytes total",
        "the claim holds 17179869184 bytes (16.00 GiB)",
        f"lower --gpu-memory-utilization to {math.floor(16 * GiB * 10_000 / total) / 10_000}",
    ):
        assert part in error
    release(client, "greedy")  # the room the next claim needs
    edited, sizing = webhook_sized()
    short = allocate(client, "short", sizing.request_bytes - GiB, container=edited)
    error = node.kubelet.refused(short.ref)
    assert f"take {sizing.rank_bytes} bytes" in error
    assert (
        f"--kv-cache-memory-bytes: weights, activations, non-torch, CUDA graphs and a KV cache of {sizing.kv_cache_memory_bytes} bytes"
        in error
    )
    assert Checkpoint(node.paths.checkpoint).load() == {}
    release(client, "short")


def test_a_pod_with_the_flags_the_webhook_writes_is_prepared(
    node: PluginNode, client: Client
) -> None:
    assert node.kubelet is not None
    edited, sizing = webhook_sized()
    assert "--kv-cache-memory-bytes" in edited["command"]
    claim = allocate(client, "sized", sizing.request_bytes, container=edited)
    answer = node.kubelet.prepare(claim.ref)[claim.ref.uid]
    assert not answer.error and len(answer.devices) == 1
    assert (
        Checkpoint(node.paths.checkpoint).load()[claim.ref.uid].devices[0].claimed.memory_bytes
        == sizing.request_bytes
    )
    release(client, "sized")


def test_an_allocation_the_slice_does_not_allow_is_refused_whoever_wrote_it(
    node: PluginNode, client: Client
) -> None:
    """Allocations written into claims' status by hand (as the probe of issue 38 wrote
    them; the apiserver takes each): above the 77.1 GiB the slice publishes, zero,
    negative, off the 1 MiB step, a device the slice does not list. None is prepared, each
    refusal names the bytes and what was published; a booking the scheduler could make is
    prepared."""
    assert node.kubelet is not None and node.inventory is not None
    (published,) = {  # the slice's capacity of a recorded H100, 77.11 GiB
        int(d["capacity"]["memory"]["value"])
        for d in client.get(ResourceSlice, slice_name(NODE)).to_dict()["spec"]["devices"]
    }
    cases = {
        "above": (79 * GiB, GPU[0], "that is above the device's published capacity"),
        "zero": (0, GPU[0], "booked a positive number of bytes"),
        "negative": (-5 * GiB, GPU[0], "booked a positive number of bytes"),
        "very-negative": (-50 * GiB, GPU[1], "booked a positive number of bytes"),
        "off-step": (GiB + 1, GPU[0], "steps of 1048576 bytes from 1048576"),
        "unlisted": (GiB, "gpu-0000", "device gpu-0000 is not published with a memory"),
    }
    refs = {
        name: allocated_claim(client, name, n, device, namespace=NS, node=NODE)
        for name, (n, device, _) in cases.items()
    }
    prepared = []
    try:
        for name, (n, _, why) in cases.items():
            answer = node.kubelet.prepare(refs[name])[refs[name].uid]
            if not answer.error:
                prepared.append(name)
                continue
            assert why in answer.error and "kube-scheduler never allocates that" in answer.error
            if name != "unlisted":
                assert f"books {n} bytes" in answer.error
                assert f"capacity {published} bytes" in answer.error
        print(f"prepares of impossible allocations: {len(prepared)} of {len(cases)}")
        assert prepared == []
        assert Checkpoint(node.paths.checkpoint).load() == {}
        fair = allocated_claim(client, "fair", 12 * GiB, GPU[1], namespace=NS, node=NODE)
        answer = node.kubelet.prepare(fair)[fair.uid]
        assert not answer.error and len(answer.devices) == 1
        node.kubelet.unprepare(fair)
    finally:
        for name in [*cases, "fair"]:
            with contextlib.suppress(ApiError):
                client.delete(ResourceClaim, name, namespace=NS)
