"""What claims book on a node's devices and the taints that follow (gatekeeper.cluster.accounting)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from gatekeeper.cluster import resource_slice
from gatekeeper.cluster.accounting import (
    SHARED_TAINT_KEY,
    TAINT_KEY,
    Allocation,
    allocations,
    booked_bytes,
    shared_devices,
    unaccounted_bytes,
    vanished,
    with_taints,
)
from gatekeeper.cluster.agent import quantity_bytes
from gatekeeper.errors import GatekeeperError
from gatekeeper.gpus import StaticInventory
from gatekeeper.placement.policy import PlacementPolicy

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpus"
GiB = 2**30
DRIVER = "gpu.gatekeeper.dev"


def claim(name: str, results: list[dict[str, Any]], pods: tuple[str, ...]) -> dict[str, Any]:
    """A claim as the apiserver returns it once the scheduler allocated and reserved it."""
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": p, "uid": p} for p in pods],
        },
    }


def result(pool: str, device: str, memory: str | None, driver: str = DRIVER) -> dict[str, Any]:
    found: dict[str, Any] = {"request": "r", "driver": driver, "pool": pool, "device": device}
    if memory is not None:
        found["consumedCapacity"] = {"memory": memory}
    return found


CLAIMS = [
    claim("a", [result("node-a", "gpu-0", "12Gi")], ("pod-a",)),
    claim("b", [result("node-a", "gpu-0", "12884901888"), result("node-a", "gpu-1", "1Gi")], ()),
    claim("c", [result("node-b", "gpu-0", "40Gi")], ("pod-c",)),
    claim("d", [result("node-a", "gpu-1", "5Gi", driver="gpu.nvidia.com")], ("pod-d",)),
    claim("e", [result("node-a", "gpu-1", None)], ("pod-e",)),
    {"metadata": {"name": "pending", "namespace": "ns"}},
]


def test_only_this_drivers_pool_counts_and_quantities_become_bytes() -> None:
    found = allocations(CLAIMS, DRIVER, "node-a", quantity_bytes)
    assert [(a.claim, a.device, a.memory_bytes, a.pods) for a in found] == [
        ("a", "gpu-0", 12 * GiB, ("pod-a",)),
        ("b", "gpu-0", 12 * GiB, ()),
        ("b", "gpu-1", GiB, ()),
        ("e", "gpu-1", 0, ("pod-e",)),
    ]
    assert booked_bytes(found) == {"gpu-0": 24 * GiB, "gpu-1": GiB}


def test_unaccounted_is_used_less_booked() -> None:
    booked = {"gpu-0": 24 * GiB}
    used = {"gpu-0": 30 * GiB, "gpu-1": 3 * GiB, "gpu-2": 0}
    assert unaccounted_bytes(used, booked) == {"gpu-0": 6 * GiB, "gpu-1": 3 * GiB, "gpu-2": 0}
    # A worker still loading uses less than its claim: negative, never tainted.
    assert unaccounted_bytes({"gpu-0": GiB}, booked) == {"gpu-0": -23 * GiB}


def _slice() -> dict[str, Any]:
    snapshot = StaticInventory.from_json(FIXTURES / "h100_80g_x8.json").snapshot()
    return resource_slice("node-a", snapshot, PlacementPolicy())


def test_taints_only_over_the_tolerance_and_keeps_others_taints() -> None:
    published = _slice()
    names = [d["name"] for d in published["spec"]["devices"]]  # gpu-<uuid>, by index here
    other = {"key": "example.com/maintenance", "value": "x", "effect": "NoExecute"}
    published["spec"]["devices"][2]["taints"] = [other]
    unaccounted = dict(zip(names, (GiB + 1, GiB, 5 * GiB, -GiB), strict=False))
    tainted = with_taints(published, unaccounted, tolerance_bytes=GiB)
    taints = [d.get("taints") for d in tainted["spec"]["devices"]]
    ours = {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}
    assert taints[:4] == [[ours], None, [other, ours], None]  # at the tolerance: not tainted
    assert "taints" not in published["spec"]["devices"][0], "the input is not changed"
    untainted = with_taints(tainted, {}, tolerance_bytes=GiB)
    assert untainted["spec"]["devices"][2].get("taints") == [other]
    assert all("taints" not in d for i, d in enumerate(untainted["spec"]["devices"]) if i != 2)


def _nvidia_slice(uuids: list[str], node: str = "node-a") -> dict[str, Any]:
    """A slice as NVIDIA's DRA driver publishes full GPUs (``uuid`` in its own domain)."""
    devices = [
        {"name": f"gpu-{i}", "attributes": {"uuid": {"string": u}, "type": {"string": "gpu"}}}
        for i, u in enumerate(uuids)
    ]
    return {"spec": {"driver": "gpu.nvidia.com", "nodeName": node, "devices": devices}}


def test_a_gpu_another_driver_publishes_is_tainted_with_that_driver() -> None:
    published = _slice()
    uuids = {d["name"]: d["attributes"]["uuid"]["string"] for d in published["spec"]["devices"]}
    names = list(uuids)
    qualified = _nvidia_slice([])
    qualified["spec"]["devices"] = [
        {"name": "x", "attributes": {"gpu.nvidia.com/uuid": {"string": uuids[names[3]]}}}
    ]
    others = [
        _nvidia_slice([uuids[names[1]], "GPU-not-ours"]),
        qualified,
        {"spec": {"driver": DRIVER, "devices": published["spec"]["devices"]}},  # ours: skipped
    ]
    shared = shared_devices(uuids, others, DRIVER)
    assert shared == {names[1]: "gpu.nvidia.com", names[3]: "gpu.nvidia.com"}
    tainted = with_taints(published, {names[1]: 5 * GiB}, GiB, shared)
    keys = [[t["key"] for t in d.get("taints") or []] for d in tainted["spec"]["devices"]]
    assert keys[:4] == [[], [TAINT_KEY, SHARED_TAINT_KEY], [], [SHARED_TAINT_KEY]]
    assert tainted["spec"]["devices"][3]["taints"][0]["value"] == "gpu.nvidia.com"
    lifted = with_taints(tainted, {}, GiB, {})
    assert all("taints" not in d for d in lifted["spec"]["devices"])
    assert shared_devices(uuids, [_nvidia_slice(["GPU-not-ours"])], DRIVER) == {}


def test_a_gpu_another_driver_publishes_as_mig_devices_is_shared() -> None:
    """NVIDIA's driver publishes a GPU in MIG mode as MIG devices whose ``uuid`` is the
    MIG instance's and ``parentUUID`` the GPU's: their memory is that GPU's."""
    published = _slice()
    uuids = {d["name"]: d["attributes"]["uuid"]["string"] for d in published["spec"]["devices"]}
    name = list(uuids)[2]
    mig = _nvidia_slice([])
    mig["spec"]["devices"] = [
        {
            "name": f"gpu-0-mig-9-{i}-1",
            "attributes": {
                "type": {"string": "mig"},
                "uuid": {"string": f"MIG-0000000{i}-aaaa-bbbb-cccc-000000000000"},
                "parentUUID": {"string": uuids[name]},
            },
        }
        for i in range(2)
    ]
    assert shared_devices(uuids, [mig], DRIVER) == {name: "gpu.nvidia.com"}


def test_vanished_lists_allocations_on_devices_no_longer_published() -> None:
    found = [
        Allocation("ns", "a", "gpu-0", GiB, ("pod-a",)),
        Allocation("ns", "b", "gpu-1", GiB, ("pod-b",)),
    ]
    assert vanished(found, ["gpu-1"]) == [found[0]]
    assert vanished(found, ["gpu-0", "gpu-1"]) == []


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36", "1.37"])
def test_a_tainted_slice_validates_strictly(version: str) -> None:
    published = _slice()
    first = published["spec"]["devices"][0]["name"]
    tainted = with_taints(published, {first: 10 * GiB}, tolerance_bytes=GiB)
    assert tainted["spec"]["devices"][0]["taints"]
    kubernetes_validate.validate(tainted, version, strict=True)


def test_a_quantity_that_is_not_one_is_refused() -> None:
    assert quantity_bytes("1Mi") == 2**20
    assert quantity_bytes("1.5") == 2
    with pytest.raises(GatekeeperError, match="not a Kubernetes quantity") as raised:
        quantity_bytes("twelve")
    assert raised.value.field == "quantity"


def test_the_wing_and_the_cli_load_no_kubernetes_client_until_the_agent_runs() -> None:
    code = (
        "import sys, gatekeeper.cluster, gatekeeper.cluster.accounting, gatekeeper.cli.entry\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'lightkube'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
