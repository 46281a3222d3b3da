"""Per-pod predicted against actual (issue 30 item 3): each GPU process to its pod's claim
(``gatekeeper.cluster.attribution``), and the agent's ``PodCollector`` over the NVML
stand-in with processes declared in its state. A process's pod comes from
``/proc/PID/cgroup`` read by ``pod_cgroup.pod_uid``; the tests write those files, in the
format kubelet's cgroup drivers give them, under a temporary proc root (the same reader
and format, since real pod cgroups cannot be made here)."""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gatekeeper.cluster import DRIVER_NAME
from gatekeeper.cluster.agent import quantity_bytes
from gatekeeper.cluster.agent_metrics import (
    AgentCollector,
    PodCollector,
    PodComponents,
    PrepareCounter,
)
from gatekeeper.cluster.attribution import PodClaim, attribute, pod_claims
from gatekeeper.cluster.dra_driver import DraDriver, DriverPaths
from gatekeeper.cluster.prepared import ClaimRef, PrepareError
from gatekeeper.cluster.slices import uuid_device_name
from gatekeeper.gpus import StaticInventory
from gatekeeper.gpus.inventory import InventorySnapshot
from gatekeeper.gpus.nvml import NvmlInventory
from gatekeeper.gpus.stand_in import FakeNvml, FakeProcess, h100
from tests.support.agent_state import COMPONENTS, DEVICE, POD, AgentState, pod_collector
from tests.support.dra_kubelet import cgroups
from tests.support.snapshots import busy_gpu

GiB = 2**30
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NODE = "node-a"
UID_A = "1a2b3c4d-0000-4000-8000-00000000000a"
UID_B = "1a2b3c4d-0000-4000-8000-00000000000b"


def claim(name: str, pods: dict[str, str], devices: dict[str, str], pool: str = NODE) -> Any:
    """A ResourceClaim as the apiserver returns it once allocated and reserved."""
    results = [
        {
            "request": f"rank{i}",
            "driver": DRIVER_NAME,
            "pool": pool,
            "device": device,
            "consumedCapacity": {"memory": memory},
        }
        for i, (device, memory) in enumerate(devices.items())
    ]
    return {
        "metadata": {"name": name, "namespace": "team-a"},
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [
                {"resource": "pods", "name": pod, "uid": uid} for pod, uid in pods.items()
            ],
        },
    }


def test_a_pod_s_processes_are_summed_on_its_claimed_device_and_the_rest_is_foreign(
    tmp_path: Path,
) -> None:
    gpu0, gpu1 = (
        busy_gpu(0, 30 * GiB, (10, 12 * GiB), (11, 8 * GiB), (12, 2 * GiB)),
        busy_gpu(1, 5 * GiB, (13, 5 * GiB)),
    )
    d0, d1 = uuid_device_name(gpu0.uuid), uuid_device_name(gpu1.uuid)
    claims = [claim("qwen-0-gpus", {"qwen-0": UID_A}, {d0: "24Gi"})]
    found = pod_claims(claims, DRIVER_NAME, NODE, quantity_bytes)
    # 10 and 11 are the pod's engine and worker; 12 runs outside any pod; 13 is the
    # pod's too, but on a GPU its claim does not book: foreign there, not the pod's.
    pod_of = cgroups(tmp_path, {10: UID_A, 11: UID_A, 12: None, 13: UID_A})
    result = attribute([gpu0, gpu1], found, pod_of)
    (figures,) = result.pods
    assert (figures.claim.pod, figures.claim.device) == ("qwen-0", d0)
    assert (figures.claim.claimed_bytes, figures.used_bytes) == (24 * GiB, 20 * GiB)
    assert figures.headroom_bytes == 4 * GiB
    assert result.foreign_bytes == {d0: 2 * GiB, d1: 5 * GiB}


def test_two_claims_of_one_pod_on_one_device_add_up_against_its_usage(tmp_path: Path) -> None:
    """A pod's processes are the pod's, not a claim's: a draft model's container and the
    main one, each with its claim on the same GPU, are one figure there. Keyed by pod and
    device alone, one claim replaced the other: 8 GiB claimed against 20 GiB used."""
    gpu = busy_gpu(0, 20 * GiB, (10, 14 * GiB), (11, 6 * GiB))
    device = uuid_device_name(gpu.uuid)
    claims = [
        claim("main", {"qwen-0": UID_A}, {device: "16Gi"}),
        claim("draft", {"qwen-0": UID_A}, {device: "8Gi"}),
    ]
    found = pod_claims(claims, DRIVER_NAME, NODE, quantity_bytes)
    result = attribute([gpu], found, cgroups(tmp_path, {10: UID_A, 11: UID_A}))
    (figures,) = result.pods
    assert (figures.claim.claim, figures.claim.claimed_bytes) == ("draft,main", 24 * GiB)
    assert (figures.used_bytes, figures.headroom_bytes) == (20 * GiB, 4 * GiB)
    assert result.foreign_bytes == {device: 0}


def test_a_pod_over_its_claim_has_negative_headroom_and_an_idle_pod_all_of_it() -> None:
    gpu = busy_gpu(0, 30 * GiB, (10, 30 * GiB))
    device = uuid_device_name(gpu.uuid)
    claims = [
        claim("big", {"big-0": UID_A}, {device: "24Gi"}),
        claim("idle", {"idle-0": UID_B}, {device: "8Gi"}),
        claim("elsewhere", {"x": "other"}, {device: "8Gi"}, pool="node-b"),
    ]
    found = pod_claims(claims, DRIVER_NAME, NODE, quantity_bytes)
    result = attribute([gpu], found, {10: UID_A}.get)
    headroom = {f.claim.pod: f.headroom_bytes for f in result.pods}
    assert headroom == {"big-0": -6 * GiB, "idle-0": 8 * GiB}
    assert result.foreign_bytes == {device: 0}


def test_a_process_whose_usage_nvml_does_not_report_counts_nothing() -> None:
    gpu = busy_gpu(0, 3 * GiB, (10, None), (11, None))
    device = uuid_device_name(gpu.uuid)
    found = pod_claims(
        [claim("c", {"p": UID_A}, {device: "4Gi"})], DRIVER_NAME, NODE, quantity_bytes
    )
    result = attribute([gpu], found, {10: UID_A}.get)
    assert [f.used_bytes for f in result.pods] == [0]
    assert result.foreign_bytes == {device: 0}


def test_the_collector_exports_per_pod_figures_from_the_stand_in_nvml(
    fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    fake_nvml.set(
        gpus=[h100(0, used_bytes=26 * GiB), h100(1, used_bytes=0)],
        processes=[FakeProcess(0, 4242, 20 * GiB), FakeProcess(0, 4243, 6 * GiB)],
    )
    d0 = uuid_device_name(h100(0).uuid)
    d1 = uuid_device_name(h100(1).uuid)
    claims = [claim("qwen-0-gpus", {"qwen-0": UID_A}, {d0: "24Gi"})]
    pod_of = cgroups(tmp_path, {4242: UID_A, 4243: None})
    inventory = NvmlInventory()
    try:
        collector = PodCollector(
            NODE, DRIVER_NAME, inventory.snapshot, lambda: claims, pod_of, quantity_bytes
        )
        registry = CollectorRegistry()
        registry.register(collector)
        labels = {"namespace": "team-a", "pod": "qwen-0", "claim": "qwen-0-gpus", "device": d0}
        sample = registry.get_sample_value
        assert sample("gatekeeper_worker_predicted_total_bytes", labels) == 24 * GiB
        assert sample("gatekeeper_worker_actual_bytes", labels) == 20 * GiB
        assert sample("gatekeeper_pod_memory_headroom_bytes", labels) == 4 * GiB
        assert sample("gatekeeper_agent_foreign_memory_bytes", {"device": d0}) == 6 * GiB
        assert sample("gatekeeper_agent_foreign_memory_bytes", {"device": d1}) == 0
    finally:
        inventory.close()


def test_the_kubelet_plugin_s_prepares_are_counted_by_outcome(tmp_path: Path) -> None:
    """``DraDriver`` tells the agent's ``PrepareCounter`` each outcome: a claim that fits
    its GPU is prepared (and its repeat, answered from the checkpoint, too); one allocated
    on another node's pool is refused, and so is one whose read fails (the apiserver
    unreachable: the plugin answers kubelet with that error too). The GPUs are a recorded
    node's (StaticInventory)."""
    snapshot = StaticInventory.from_json(FIXTURES / "gpus" / "h100_80g_x8.json").snapshot()
    device = uuid_device_name(snapshot.gpus[0].uuid)
    here = claim("fits", {"p": UID_A}, {device: "8Gi"})
    away = claim("away", {"q": UID_B}, {device: "8Gi"}, pool="node-b")
    for made, uid in ((here, "uid-fits"), (away, "uid-away")):
        made["metadata"]["uid"] = uid
    claims = {"fits": here, "away": away}
    counter = PrepareCounter()
    paths = DriverPaths(plugin_dir=tmp_path / "plugin", cdi_dir=tmp_path / "cdi")
    for folder in (paths.plugin_dir, paths.cdi_dir):
        folder.mkdir()

    def read_claim(namespace: str, name: str) -> dict[str, Any]:
        if name == "unread":
            _unreachable()
        found: dict[str, Any] = claims[name]
        return found

    driver = DraDriver(
        NODE,
        paths,
        read_claim,
        lambda: snapshot,
        quantity_bytes,
        count_prepare=counter.count,
    )
    driver.prepare(ClaimRef("team-a", "fits", "uid-fits"))
    driver.prepare(ClaimRef("team-a", "fits", "uid-fits"))
    with pytest.raises(PrepareError, match="node-b"):
        driver.prepare(ClaimRef("team-a", "away", "uid-away"))
    with pytest.raises(OSError):  # urllib's URLError: connection refused
        driver.prepare(ClaimRef("team-a", "unread", "uid-unread"))
    assert counter.counts() == {"prepared": 2, "refused": 2}
    registry = CollectorRegistry()
    registry.register(AgentCollector(AgentState(), counter))
    refused = {"outcome": "refused"}
    assert registry.get_sample_value("gatekeeper_agent_prepares_total", refused) == 2


def test_claims_that_cannot_be_read_leave_the_per_pod_series_out_not_the_scrape() -> None:
    """The apiserver not answering (a connection refused on a closed port) or the GPUs not
    read: no per-pod series, success 0, and the registry still renders."""
    gpu = busy_gpu(0, GiB, (10, GiB))
    read = InventorySnapshot(gpus=(gpu,), ok=True)
    failed = InventorySnapshot(gpus=(), ok=False, error="NVML_ERROR_UNKNOWN")

    def unreachable() -> list[dict[str, Any]]:
        with urllib.request.urlopen("http://127.0.0.1:9/apis", timeout=2):
            return []

    def no_pod(pid: int) -> str | None:
        return None

    def collector(snapshot: InventorySnapshot, claims: Any) -> PodCollector:
        return PodCollector(NODE, DRIVER_NAME, lambda: snapshot, claims, no_pod, quantity_bytes)

    for snapshot, claims in ((read, unreachable), (failed, list)):
        registry = CollectorRegistry()
        registry.register(collector(snapshot, claims))
        text = generate_latest(registry).decode()
        assert "gatekeeper_agent_pod_figures_success 0.0" in text
        assert "gatekeeper_agent_foreign_memory_bytes{" not in text
    registry = CollectorRegistry()
    registry.register(collector(read, list))
    assert registry.get_sample_value("gatekeeper_agent_pod_figures_success") == 1


def test_a_pod_not_read_has_no_components_until_it_is_and_another_uid_has_none() -> None:
    """``read_pod`` failing (the apiserver unreachable) leaves the pod's components out of
    that scrape, not the claim's series, and the pod is read again at the next; a pod of
    that name read under another UID (made again) has no components."""
    reads: list[str] = []
    answers = [None, POD, {**POD, "metadata": {**POD["metadata"], "uid": "another"}}]

    def read_pod(namespace: str, name: str) -> dict[str, Any]:
        reads.append(name)
        answer = answers[len(reads) - 1]
        if answer is None:
            with urllib.request.urlopen("http://127.0.0.1:9/api", timeout=2):
                pass
        return dict(answer or {})

    def scrape(collector: PodCollector) -> tuple[float | None, float | None]:
        """(the weights component, the claim's bytes) of one scrape (one collect)."""
        found = {
            (s.name, s.labels.get("component")): s.value
            for family in collector.collect()
            for s in family.samples
            if s.labels.get("pod") == "qwen-1" and s.labels.get("device") == DEVICE
        }
        return (
            found.get(("gatekeeper_worker_predicted_bytes", "weights")),
            found.get(("gatekeeper_worker_predicted_total_bytes", None)),
        )

    collector = pod_collector(read_pod)
    assert scrape(collector) == (None, 24 * GiB) and reads == ["qwen-1"]
    assert scrape(collector) == scrape(collector) == (COMPONENTS["weights"], 24 * GiB)
    assert reads == ["qwen-1", "qwen-1"]
    assert scrape(pod_collector(read_pod)) == (None, 24 * GiB)  # the third answer: another UID


def _unreachable() -> None:
    """What reading a pod from an apiserver that is down raises (nothing listens on 9)."""
    with urllib.request.urlopen("http://127.0.0.1:9/api", timeout=2):
        pass


def test_pod_reads_stop_at_the_first_failure_and_the_rest_come_at_the_next_scrape() -> None:
    """An unreachable apiserver costs a scrape one failed read, not one per pod."""
    claims = [PodClaim("ns", f"p{i}", f"uid-p{i}", f"c{i}", DEVICE, GiB) for i in range(3)]
    reads: list[str] = []
    up = [False]

    def read_pod(namespace: str, name: str) -> dict[str, Any]:
        reads.append(name)
        if not up[0]:
            _unreachable()
        return {"metadata": {"name": name, "uid": f"uid-{name}"}}

    components = PodComponents(read_pod)
    assert components.of(claims) == {} and reads == ["p0"]
    up[0] = True
    assert len(components.of(claims)) == 3 and reads == ["p0", "p0", "p1", "p2"]
    assert len(components.of(claims)) == 3 and len(reads) == 4  # each read once


def test_a_slow_pod_read_holds_up_no_other_scrape() -> None:
    """The reads run outside the lock: a scrape waiting on the apiserver for one pod does
    not make a scrape of other pods wait for it."""
    reading, release = threading.Event(), threading.Event()

    def read_pod(namespace: str, name: str) -> dict[str, Any]:
        if name == "slow":
            reading.set()
            release.wait(10)
        return {"metadata": {"name": name, "uid": f"uid-{name}"}}

    slow, fast = (PodClaim("ns", n, f"uid-{n}", f"c-{n}", DEVICE, GiB) for n in ("slow", "fast"))
    components = PodComponents(read_pod)
    first = threading.Thread(target=components.of, args=([slow, fast],))
    first.start()
    assert reading.wait(10)
    start = time.monotonic()
    assert list(components.of([fast])) == [("uid-fast", "c-fast")]
    elapsed = time.monotonic() - start
    release.set()
    first.join(10)
    assert elapsed < 2, elapsed
    assert set(components.of([slow, fast])) == {("uid-slow", "c-slow"), ("uid-fast", "c-fast")}
