"""What the ``Unallocatable`` Event says (``gatekeeper.cluster.unallocatable``, pure): which
Pending pods it is for, what a claim asks, what each node has free from the newest slices
less the allocated claims, and a name that is the same for the same change. The path
through the real scheduler is ``test_unallocatable.py``'s."""

from __future__ import annotations

from typing import Any

from gatekeeper.cluster.agent import quantity_bytes
from gatekeeper.cluster.slices import DRIVER_NAME
from gatekeeper.cluster.unallocatable import (
    MAX_MESSAGE_CHARS,
    ClaimAsk,
    DeviceFree,
    claim_asks,
    event_name,
    free_devices,
    unallocatable_text,
    waiting_pods,
)

GiB = 2**30
REFUSED = "0/2 nodes are available: 2 cannot allocate all claims. preemption: ..."


def pod(name: str, message: str = REFUSED, phase: str = "Pending") -> dict[str, Any]:
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": message}  # fmt: skip
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}],
                 "nodeSelector": {"kubernetes.io/hostname": "n1"}},
        "status": {"phase": phase, "conditions": [condition],
                   "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}]},
    }  # fmt: skip


def claim(
    name: str, devices: int, memory: str, allocated: tuple[tuple[str, str, str], ...] = ()
) -> dict[str, Any]:
    request = {"name": "r", "exactly": {"deviceClassName": DRIVER_NAME, "count": devices,
                                        "capacity": {"requests": {"memory": memory}}}}  # fmt: skip
    results = [{"driver": DRIVER_NAME, "pool": pool, "device": device,
                "consumedCapacity": {"memory": booked}} for pool, device, booked in allocated]  # fmt: skip
    status = {"allocation": {"devices": {"results": results}}} if results else {}
    return {"metadata": {"name": name, "namespace": "ns"},
            "spec": {"devices": {"requests": [request]}}, "status": status}  # fmt: skip


def slice_(node: str, generation: int, devices: dict[str, str], taint: str = "") -> dict[str, Any]:
    listed = []
    for name, capacity in devices.items():
        device: dict[str, Any] = {"name": name, "capacity": {"memory": {"value": capacity}}}
        if name == taint:
            device["taints"] = [{"key": "k", "effect": "NoSchedule"}]
        listed.append(device)
    return {"spec": {"driver": DRIVER_NAME, "nodeName": node, "devices": listed,
                     "pool": {"name": node, "generation": generation}}}  # fmt: skip


def test_only_pending_pods_the_scheduler_said_it_of() -> None:
    pods = [pod("large"), pod("other", "0/2 nodes are available: 2 Insufficient cpu"),
            pod("done", phase="Running")]  # fmt: skip
    (found,) = waiting_pods(pods)
    assert (found.name, found.claims, found.node) == ("large", ("large-gpu",), "n1")


def test_a_claim_of_another_class_asks_nothing_of_ours() -> None:
    asks = claim_asks(claim("c", 2, "40Gi"), DRIVER_NAME, quantity_bytes)
    assert asks == ClaimAsk("c", 2, 40 * GiB)
    assert claim_asks(claim("c", 1, "1Gi"), "gpu.nvidia.com", quantity_bytes) is None


def test_free_memory_is_the_newest_capacity_less_what_claims_booked() -> None:
    slices = [slice_("n1", 1, {"a": "10Gi"}), slice_("n1", 2, {"a": "80Gi", "b": "80Gi"}, "b"),
              slice_("n2", 1, {"c": "80Gi"})]  # fmt: skip
    booked = [
        claim("x", 1, "30Gi", (("n1", "a", "30Gi"),)),
        claim("y", 1, "5Gi", (("n2", "c", "5Gi"),)),
    ]
    free = free_devices(slices, booked, DRIVER_NAME, quantity_bytes)
    assert free == {
        "n1": [
            DeviceFree("a", 80 * GiB, 50 * GiB, False),
            DeviceFree("b", 80 * GiB, 80 * GiB, True),
        ],
        "n2": [DeviceFree("c", 80 * GiB, 75 * GiB, False)],
    }
    text = unallocatable_text([ClaimAsk("big", 2, 60 * GiB)], free)
    assert text.startswith(
        "claim big asks 2 devices with 60.00 GiB (64424509440 bytes) free each on one node, and "
        "no node the pod may land on has them: n1: 80.00 (tainted), 50.00 GiB free of 80.00 GiB "
        "each (2 devices); n2: 75.00 GiB free of 80.00 GiB each (1 device). Lower"
    )
    pinned = unallocatable_text([ClaimAsk("big", 2, 60 * GiB)], free, "n2")
    assert "(its node selector names n2) has them: n2: 75.00" in pinned and "n1:" not in pinned
    none = unallocatable_text([ClaimAsk("big", 1, GiB)], free, "n9")
    assert "no node the pod may land on (its node selector names n9) publishes gatekeeper's" in none


def test_many_nodes_are_cut_and_the_text_stays_an_event_note() -> None:
    free = {f"node-{i:03d}": [DeviceFree(f"gpu-{i}", 80 * GiB, i * GiB, False)] for i in range(40)}
    text = unallocatable_text([ClaimAsk("c", 1, 90 * GiB)], free)
    assert text.count("GiB free of") == 8 and "; and 32 more nodes" in text
    assert text.index("node-039") < text.index("node-038")  # the most free first
    assert len(text) <= MAX_MESSAGE_CHARS


def test_the_name_is_the_same_for_the_same_change_only() -> None:
    (first,) = waiting_pods([pod("large")])
    asks = [ClaimAsk("large-gpu", 1, 60 * GiB)]
    name = event_name(first, asks)
    assert name == event_name(first, list(asks)) and name.startswith("large.unallocatable-")
    (moved,) = waiting_pods([pod("large", REFUSED.replace("0/2", "0/3").replace("2 c", "3 c"))])
    assert event_name(moved, asks) != name
    assert event_name(first, [ClaimAsk("large-gpu", 1, 50 * GiB)]) != name
