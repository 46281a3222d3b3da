"""The DRA driver's wait for bytes not free (issue 30, "two prepares racing for the last
bytes of a GPU: one waits"), without an apiserver: ``DraDriver`` on one stand-in GPU whose
free memory the test sets, its claims plain dicts as the apiserver returns them. Over the
kubelet plugin's socket the same waits are in ``test_kubelet_plugin.py``.

Covered here: first come, first served among waiters; the call's deadline bounding the
wait; a full line refused at once; two devices of one claim on one GPU adding up, and a
claim made again under its name adding to the old one still prepared; a pod's usage
counted against all its claims on the GPU; the waiters refused when the plugin stops, and
one leaving the line when kubelet cancels its call; the wait's bound checked against
kubelet's deadline; an unprepare failing for one claim of a request answering that claim
alone; and the vLLM flag sizing (model resolution) running outside the lock,
so a slow one holds up no unprepare.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest

from bench.dra_kubelet import claim_message
from gatekeeper.cluster import DRIVER_NAME
from gatekeeper.cluster.cdi import spec_file_name
from gatekeeper.cluster.dra_driver import DraDriver, DriverPaths
from gatekeeper.cluster.kubelet_api import dra_v1_pb2 as dra
from gatekeeper.cluster.kubelet_plugin import DRA_SERVICE, KubeletPlugin, PluginSockets
from gatekeeper.cluster.prepared import ClaimRef, PreparedClaim, PrepareError
from gatekeeper.errors import GatekeeperError
from gatekeeper.gpus.inventory import GpuInfo, GpuProcess, InventorySnapshot
from gatekeeper.units import GIB

NODE = "node-a"
NS = "team-a"
UUID = "GPU-00000000-aaaa-bbbb-cccc-000000000000"
DEVICE = "gpu-00000000aaaabbbbcccc000000000000"
H100_TOTAL = 85520809984


class Node:
    """One GPU with ``free_bytes`` free (settable), the claims and pods the driver reads."""

    def __init__(self, tmp_path: Path, free_bytes: int, **driver: Any) -> None:
        self.free_bytes = free_bytes
        self.processes: tuple[GpuProcess, ...] = ()
        self.claims: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        paths = DriverPaths(tmp_path / "plugin", tmp_path / "cdi", tmp_path, tmp_path)
        self.driver = DraDriver(
            NODE, paths, self.read_claim, self.read_gpus, int, read_pod=self.read_pod, **driver
        )

    def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return self.claims[name]

    def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self.pods[name]

    def read_gpus(self) -> InventorySnapshot:
        used = H100_TOTAL - self.free_bytes
        gpu = GpuInfo(
            0,
            UUID,
            "NVIDIA H100 80GB HBM3",
            "00000000:18:00.0",
            H100_TOTAL,
            self.free_bytes,
            used,
            processes=self.processes,
        )
        return InventorySnapshot(gpus=(gpu,), ok=True)

    def claim(self, name: str, *sizes: int, pod: str | None = None) -> ClaimRef:
        """An allocated claim of one device result per size, all on the one GPU."""
        results = [
            {
                "request": f"r{i}",
                "driver": DRIVER_NAME,
                "pool": NODE,
                "device": DEVICE,
                "consumedCapacity": {"memory": str(n)},
            }
            for i, n in enumerate(sizes)
        ]
        reserved = [{"resource": "pods", "name": pod, "uid": f"uid-{pod}"}] if pod else []
        self.claims[name] = {
            "metadata": {"namespace": NS, "name": name, "uid": f"uid-{name}"},
            "status": {"allocation": {"devices": {"results": results}}, "reservedFor": reserved},
        }
        return ClaimRef(NS, name, f"uid-{name}")


class Call(threading.Thread):
    """``prepare`` on its own thread: the claim or the refusal, and when it came back."""

    def __init__(self, prepare: Callable[[], PreparedClaim]) -> None:
        super().__init__()
        self._prepare = prepare
        self.result: PreparedClaim | PrepareError | None = None
        self.answered = 0.0
        self.start()

    def run(self) -> None:
        try:
            self.result = self._prepare()
        except PrepareError as e:
            self.result = e
        self.answered = time.monotonic()

    def outcome(self) -> PreparedClaim | PrepareError:
        self.join(timeout=30)
        assert self.result is not None
        return self.result


def _until_waiting(driver: DraDriver, *refs: ClaimRef) -> None:
    deadline = time.monotonic() + 10
    while driver.waiting != refs:
        assert time.monotonic() < deadline, driver.waiting
        time.sleep(0.005)


def test_waiters_are_served_first_come_first_served(tmp_path: Path) -> None:
    node = Node(tmp_path, 20 * GIB, wait_seconds=20.0, poll_seconds=0.05)
    holder = node.claim("holder", 12 * GIB)
    node.driver.prepare(holder)
    first = node.claim("first", 12 * GIB)
    waiting = Call(lambda: node.driver.prepare(first))
    _until_waiting(node.driver, first)
    # 8 GiB are free: enough for the later one, but the first came first.
    later = node.claim("later", 6 * GIB)
    behind = Call(lambda: node.driver.prepare(later))
    _until_waiting(node.driver, first, later)
    # 6 GiB freed outside the claims: 14 free for them, enough for either, not both.
    node.free_bytes = 26 * GIB
    assert isinstance(waiting.outcome(), PreparedClaim)
    time.sleep(0.3)  # several polls: the later one still waits (14 - 12 = 2 < 6)
    assert node.driver.waiting == (later,) and behind.result is None
    node.driver.unprepare(holder)
    assert isinstance(behind.outcome(), PreparedClaim)
    assert list(node.driver.prepared) == [first.uid, later.uid]
    assert not node.driver.waiting


def test_a_later_prepare_is_refused_naming_the_waiter_ahead_of_it(tmp_path: Path) -> None:
    node = Node(tmp_path, 20 * GIB, wait_seconds=20.0, poll_seconds=5.0)
    node.driver.prepare(node.claim("holder", 12 * GIB))
    waiting = Call(lambda: node.driver.prepare(node.claim("first", 12 * GIB)))
    _until_waiting(node.driver, ClaimRef(NS, "first", "uid-first"))
    late = node.claim("late", 8 * GIB)
    start = time.monotonic()
    with pytest.raises(PrepareError) as refused:
        node.driver.prepare(late, deadline=time.monotonic() + 0.3)  # the call's deadline
    assert 0.3 <= time.monotonic() - start < 5  # the call's deadline, not the 20 s
    message = str(refused.value)
    for part in (
        "needs 8589934592 bytes (8.00 GiB) but 0 bytes (0.00 GiB) are free for it",
        "12884901888 bytes (12.00 GiB) are asked by prepares waiting ahead of it",
        f"{NS}/first: 12884901888 bytes (12.00 GiB) asked, waiting ahead",
        f"{NS}/holder: 12884901888 bytes (12.00 GiB) promised, not yet taken",
        "It waited 0.",
    ):
        assert part in message
    node.free_bytes = 40 * GIB  # memory freed outside the claims: the first is admitted
    assert isinstance(waiting.outcome(), PreparedClaim)


def test_a_prepare_finding_the_line_full_is_refused_at_once(tmp_path: Path) -> None:
    node = Node(tmp_path, 4 * GIB, wait_seconds=20.0, poll_seconds=0.1, max_waiters=1)
    first = node.claim("first", 8 * GIB)
    waiting = Call(lambda: node.driver.prepare(first))
    _until_waiting(node.driver, first)
    start = time.monotonic()
    with pytest.raises(PrepareError, match="It did not wait: 1 prepares already wait"):
        node.driver.prepare(node.claim("second", 2 * GIB))
    assert time.monotonic() - start < 1
    node.free_bytes = 8 * GIB
    assert isinstance(waiting.outcome(), PreparedClaim)  # at its next poll of NVML


def test_two_devices_of_one_claim_on_one_gpu_add_up(tmp_path: Path) -> None:
    node = Node(tmp_path, 20 * GIB)
    with pytest.raises(PrepareError) as refused:
        node.driver.prepare(node.claim("both", 12 * GIB, 12 * GIB))
    assert f"{NS}/both: 12884901888 bytes (12.00 GiB) promised" in str(refused.value)
    assert len(node.driver.prepare(node.claim("fits", 12 * GIB, 8 * GIB)).devices) == 2


def test_a_claim_made_again_under_its_name_adds_to_the_old_one_still_prepared(
    tmp_path: Path,
) -> None:
    """Deleted and made again (another uid) before kubelet unprepared the old one: both
    claims' bytes count under their one name, neither replaces the other."""
    node = Node(tmp_path, 20 * GIB)
    node.driver.prepare(node.claim("a", 12 * GIB))

    def again(*sizes: int) -> ClaimRef:
        node.claim("a", *sizes)
        node.claims["a"]["metadata"]["uid"] = "uid-a-again"
        return ClaimRef(NS, "a", "uid-a-again")

    with pytest.raises(PrepareError, match="needs 6442450944 bytes"):  # 20 - 12 - 6 < 6
        node.driver.prepare(again(6 * GIB, 6 * GIB))
    node.driver.prepare(again(4 * GIB))  # 20 - 12 = 8 free for it
    with pytest.raises(PrepareError) as refused:  # 20 - 12 - 4 = 4 free for it
        node.driver.prepare(node.claim("b", 10 * GIB))
    assert f"{NS}/a: 17179869184 bytes (16.00 GiB) promised" in str(refused.value)


def test_a_pod_s_usage_counts_against_all_its_claims_on_the_gpu(tmp_path: Path) -> None:
    """A pod with two claims on the GPU (a draft model's container and the main one): its
    processes' 20 GiB count against both claims' 24 GiB, 4 GiB still promised. Given all
    to one claim, the other's whole promise stayed outstanding (8 or 16 GiB), and a
    16 GiB claim that fits was refused."""
    node = Node(tmp_path, 40 * GIB)
    pod = "1a2b3c4d-0000-4000-8000-00000000000a"
    node.pods["qwen-0"] = {"metadata": {"name": "qwen-0", "uid": pod}, "spec": {}}
    for name, size in (("main", 16 * GIB), ("draft", 8 * GIB)):
        ref = node.claim(name, size, pod="qwen-0")
        node.claims[name]["status"]["reservedFor"][0]["uid"] = pod
        node.driver.prepare(ref)
    for pid in (10, 11):  # the pod's two containers' processes, in its cgroup
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(f"0::/kubepods/burstable/pod{pod}/c{pid}\n")
    node.processes = (GpuProcess(10, 14 * GIB), GpuProcess(11, 6 * GIB))
    node.free_bytes = 20 * GIB
    assert node.driver.prepare(node.claim("next", 16 * GIB)).devices  # 20 - 4 = 16 free


@contextlib.contextmanager
def serving(node: Node) -> Iterator[KubeletPlugin]:
    """The kubelet plugin on ``node``'s driver, its sockets in a short directory (unix
    socket paths: 107 bytes); stopped and removed after."""
    short = Path(tempfile.mkdtemp(prefix="kp", dir="/tmp"))
    plugin = KubeletPlugin(node.driver, PluginSockets(short, short, DRIVER_NAME))
    plugin.start()
    try:
        yield plugin
    finally:
        plugin.stop()
        shutil.rmtree(short)


def test_stopping_the_plugin_refuses_the_waiters_at_once(tmp_path: Path) -> None:
    """grpc cannot end a handler: a waiter left alone would keep the stopping agent up to
    its bound. The plugin's stop refuses it first, and a later prepare does not wait."""
    node = Node(tmp_path, 4 * GIB, wait_seconds=30.0, poll_seconds=5.0)
    with serving(node) as plugin:
        first = node.claim("first", 8 * GIB)
        waiting = Call(lambda: node.driver.prepare(first))
        _until_waiting(node.driver, first)
        stopped = time.monotonic()
        plugin.stop()
    refused = waiting.outcome()
    assert isinstance(refused, PrepareError) and "The agent is stopping" in str(refused)
    assert waiting.answered - stopped < 2  # not the 30 s bound, nor a 5 s poll
    start = time.monotonic()
    with pytest.raises(PrepareError, match="The agent is stopping"):
        node.driver.prepare(node.claim("later", 8 * GIB))
    assert time.monotonic() - start < 1 and not node.driver.waiting


def test_a_waiter_whose_call_kubelet_cancelled_leaves_the_line(tmp_path: Path) -> None:
    """kubelet cancels the call (or restarts): the waiter leaves the line, and the place it
    held, at its next read of NVML, not at its 30 s bound."""
    node = Node(tmp_path, 4 * GIB, wait_seconds=30.0, poll_seconds=0.1)
    first = node.claim("first", 8 * GIB)
    with serving(node) as plugin, grpc.insecure_channel(f"unix://{plugin.sockets.dra}") as ch:
        call = ch.unary_unary(
            f"/{DRA_SERVICE}/NodePrepareResources",
            request_serializer=dra.NodePrepareResourcesRequest.SerializeToString,
            response_deserializer=dra.NodePrepareResourcesResponse.FromString,
        )
        future = call.future(dra.NodePrepareResourcesRequest(claims=[claim_message(first)]))
        _until_waiting(node.driver, first)
        cancelled = time.monotonic()
        assert future.cancel()
        while node.driver.waiting:
            assert time.monotonic() - cancelled < 2, "the waiter stayed in line"
            time.sleep(0.01)


def test_an_unprepare_failing_for_one_claim_answers_that_claim_alone(tmp_path: Path) -> None:
    """Each claim of kubelet's NodeUnprepareResources gets its own answer: one whose CDI
    spec cannot be removed (a directory stands at its path) gets an error naming it, and
    the other claim of the same request is unprepared all the same."""
    node = Node(tmp_path, 40 * GIB)
    stuck, fine = node.claim("stuck", GIB), node.claim("fine", GIB)
    for ref in (stuck, fine):
        node.driver.prepare(ref)
    spec = tmp_path / "cdi" / spec_file_name(DRIVER_NAME, stuck.uid)
    spec.unlink()
    (spec / "held").mkdir(parents=True)
    with serving(node) as plugin, grpc.insecure_channel(f"unix://{plugin.sockets.dra}") as ch:
        call = ch.unary_unary(
            f"/{DRA_SERVICE}/NodeUnprepareResources",
            request_serializer=dra.NodeUnprepareResourcesRequest.SerializeToString,
            response_deserializer=dra.NodeUnprepareResourcesResponse.FromString,
        )
        claims = [claim_message(stuck), claim_message(fine)]
        answer = call(dra.NodeUnprepareResourcesRequest(claims=claims), timeout=10)
    error = answer.claims[stuck.uid].error
    assert error.startswith(f"claim {stuck}: unprepare failed (IsADirectoryError: "), error
    assert error.endswith("kubelet retries it"), error
    assert answer.claims[fine.uid].error == ""
    assert set(node.driver.prepared) == {stuck.uid}, "fine is unprepared, stuck is kept"


def test_the_wait_must_stay_inside_kubelet_s_deadline(tmp_path: Path) -> None:
    with pytest.raises(GatekeeperError, match=r"outside 0-43 s \(kubelet gives a prepare 45 s"):
        Node(tmp_path, GIB, wait_seconds=44.0)
    assert Node(tmp_path, GIB, wait_seconds=43.0).driver.wait_seconds == 43.0


def test_sizing_a_pod_s_vllm_runs_outside_the_lock(tmp_path: Path) -> None:
    """A model resolution that takes its time (config files read) holds up no unprepare."""
    resolving, resolved = threading.Event(), threading.Event()

    def slow_size(command: Any, total_bytes: int, gpu_name: str) -> int | None:
        resolving.set()
        assert resolved.wait(10)
        return None  # not sized here: the KV cache alone counts

    node = Node(tmp_path, 40 * GIB, size_rank=slow_size)
    node.pods["vllm-0"] = {
        "metadata": {"namespace": NS, "name": "vllm-0", "uid": "uid-vllm-0"},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "sized"}],
            "containers": [
                {
                    "name": "vllm",
                    "image": "vllm/vllm-openai:v0.11.0",
                    "command": ["vllm", "serve", "Qwen/Qwen2.5-7B-Instruct"],
                    "args": ["--kv-cache-memory-bytes", "1G", "--gpu-memory-utilization", "0.05"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }
    held = node.claim("held", GIB)
    node.driver.prepare(held)
    sized = Call(lambda: node.driver.prepare(node.claim("sized", 2 * GIB, pod="vllm-0")))
    assert resolving.wait(10)
    start = time.monotonic()
    node.driver.unprepare(held)  # would wait for the sizing if it held the lock
    assert time.monotonic() - start < 1
    resolved.set()
    assert isinstance(sized.outcome(), PreparedClaim)
