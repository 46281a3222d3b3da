"""A node's GPUs as a ResourceSlice (gatekeeper.cluster.slices), from recorded snapshots."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from gatekeeper.cluster import (
    REQUEST_STEP_BYTES,
    SliceError,
    device_capacity_bytes,
    device_name,
    resource_slice,
)
from gatekeeper.cluster.slices import uuid_device_name
from gatekeeper.gpus import GpuInfo, InventorySnapshot, StaticInventory, failed_snapshot
from gatekeeper.gpus.nvml import NvmlInventory
from gatekeeper.gpus.stand_in import FakeNvml, h100
from gatekeeper.placement.policy import PlacementPolicy

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpus"
# The recorded H100: 85520809984 total - 491194941 driver-reserved = 85029615043 visible;
# margin 512 MiB + 2 % = 2237463212; 82792151831 usable, 82791366656 in whole MiB (77.11 GiB).
H100_CAPACITY = 82791366656


SNAPSHOT = StaticInventory.from_json(FIXTURES / "h100_80g_x8.json").snapshot()


def named(*indices: int) -> list[str]:
    """The recorded GPUs' device names: ``GPU-0000000i-aaaa-bbbb-cccc-00000000000i``."""
    return [f"gpu-0000000{i}aaaabbbbcccc00000000000{i}" for i in indices]


def recorded(name: str) -> InventorySnapshot:
    return StaticInventory.from_json(FIXTURES / name).snapshot()


def test_each_gpu_is_a_shareable_device_with_its_usable_bytes() -> None:
    spec = resource_slice("node-a", recorded("h100_80g_x8.json"), PlacementPolicy())["spec"]
    assert spec["driver"] == "gpu.gatekeeper.dev"
    assert spec["nodeName"] == "node-a"
    assert spec["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == named(*range(8))
    device = spec["devices"][3]
    assert device["attributes"] == {
        "uuid": {"string": "GPU-00000003-aaaa-bbbb-cccc-000000000003"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "index": {"int": 3},
        "memoryTotal": {"int": 85029615043},
        "node": {"string": "node-a"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "550.54.15"},
    }
    assert device["allowMultipleAllocations"] is True
    memory = device["capacity"]["memory"]
    assert memory["value"] == str(H100_CAPACITY)
    assert memory["requestPolicy"] == {
        "default": str(H100_CAPACITY),
        "validRange": {"min": "1048576", "max": str(H100_CAPACITY), "step": "1048576"},
    }


def test_capacity_follows_the_policy_margin() -> None:
    gpu = recorded("h100_80g_x8.json").gpus[0]
    wider = PlacementPolicy(margin_bytes=2 * 2**30, margin_fraction=0.0)
    assert device_capacity_bytes(gpu, wider) == (85029615043 - 2 * 2**30) // 2**20 * 2**20
    assert device_capacity_bytes(gpu, PlacementPolicy()) % REQUEST_STEP_BYTES == 0


def test_lost_and_mig_gpus_are_not_published() -> None:
    spec = resource_slice("node-b", recorded("h100_mig_lost_x4.json"), PlacementPolicy())["spec"]
    assert [d["name"] for d in spec["devices"]] == named(0, 3)


def test_gpus_outside_the_policy_are_not_published() -> None:
    policy = PlacementPolicy(
        allowed_gpus=frozenset({"1", "GPU-00000005-aaaa-bbbb-cccc-000000000005"})
    )
    spec = resource_slice("node-a", recorded("h100_80g_x8.json"), policy)["spec"]
    assert [d["name"] for d in spec["devices"]] == named(1, 5)


def test_a_gpu_the_margin_leaves_no_room_on_is_not_published() -> None:
    snapshot = recorded("h100_80g_x8.json")
    tiny = dataclasses.replace(snapshot.gpus[0], total_bytes=512 * 2**20, driver_reserved_bytes=0)
    small = dataclasses.replace(snapshot, gpus=(tiny, *snapshot.gpus[1:2]))
    spec = resource_slice("node-a", small, PlacementPolicy())["spec"]
    assert [d["name"] for d in spec["devices"]] == named(1)


def test_device_names_follow_the_uuid_not_the_position() -> None:
    """NVML enumerates in another order (a reboot, a GPU lost): each GPU keeps its name."""
    snapshot = recorded("h100_80g_x8.json")
    first = {d["name"]: d["attributes"]["uuid"] for d in _devices(snapshot)}
    reordered = [
        dataclasses.replace(gpu, index=i)
        for i, gpu in enumerate(reversed(snapshot.gpus[1:]))  # GPU 0 gone, the rest reversed
    ]
    later = {d["name"]: d["attributes"]["uuid"] for d in _devices(snapshot, reordered)}
    assert later == {name: uuid for name, uuid in first.items() if name != named(0)[0]}
    assert all(re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", n) and len(n) <= 63 for n in later)


@pytest.mark.parametrize(
    ("uuid", "name"),
    [
        ("GPU-3F2A9C1E-7B4D-4E2F-9A1B-0C5D6E7F8A9B", "gpu-3f2a9c1e7b4d4e2f9a1b0c5d6e7f8a9b"),
        ("MIG-11112222-3333-4444-5555-666677778888", "gpu-11112222333344445555666677778888"),
        ("DECLARED-2", "gpu-declared2"),
    ],
)
def test_a_device_name_is_a_dns_label_made_of_the_uuid(uuid: str, name: str) -> None:
    gpu = dataclasses.replace(recorded("h100_80g_x8.json").gpus[0], uuid=uuid)
    assert device_name(gpu) == uuid_device_name(uuid) == name


@pytest.mark.parametrize("uuid", ["GPU-", "---", "x" * 60])
def test_a_uuid_that_makes_no_label_is_refused(uuid: str) -> None:
    gpu = dataclasses.replace(SNAPSHOT.gpus[0], uuid=uuid)
    with pytest.raises(SliceError, match="not a DNS label") as raised:
        resource_slice("node-a", dataclasses.replace(SNAPSHOT, gpus=(gpu,)), PlacementPolicy())
    assert raised.value.field == "uuid"


def _devices(snapshot: InventorySnapshot, gpus: list[GpuInfo] | None = None) -> list[Any]:
    changed = snapshot if gpus is None else dataclasses.replace(snapshot, gpus=tuple(gpus))
    devices: list[Any] = resource_slice("node-a", changed, PlacementPolicy())["spec"]["devices"]
    return devices


@pytest.mark.parametrize(
    ("driver", "published"),
    [("535.104.05", {"version": "535.104.5"}), ("560.28", {"version": "560.28.0"}), ("n/a", None)],
)
def test_driver_version_is_a_semantic_version_or_left_out(
    driver: str, published: dict[str, str] | None
) -> None:
    snapshot = dataclasses.replace(recorded("h100_80g_x8.json"), driver_version=driver)
    device = resource_slice("node-a", snapshot, PlacementPolicy())["spec"]["devices"][0]
    assert device["attributes"].get("driverVersion") == published


def test_a_failed_reading_is_refused_rather_than_published_empty() -> None:
    failed = failed_snapshot("NVML_ERROR_UNINITIALIZED", source="nvml")
    with pytest.raises(SliceError, match="keep the published slice") as raised:
        resource_slice("node-a", failed, PlacementPolicy())
    assert raised.value.field == "snapshot.ok"


def test_a_name_over_the_api_limit_is_refused() -> None:
    with pytest.raises(SliceError, match="shorter driver name") as raised:
        resource_slice("n" * 200, recorded("h100_80g_x8.json"), PlacementPolicy(), driver="d" * 60)
    assert raised.value.field == "driver"


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36", "1.37"])
def test_the_slice_validates_strictly_against_each_supported_kubernetes(version: str) -> None:
    for fixture in ("h100_80g_x8.json", "h100_mig_lost_x4.json"):
        manifest = resource_slice("node-a", recorded(fixture), PlacementPolicy(), generation=4)
        kubernetes_validate.validate(manifest, version, strict=True)


def test_the_stand_in_nvml_enumerating_in_another_order_keeps_each_device_name(
    fake_nvml: FakeNvml,
) -> None:
    """The real pynvml on the stand-in driver: the same three GPUs enumerated in another
    order (another boot) are published under the same names, each with its own uuid."""

    def devices() -> dict[str, tuple[str, int]]:
        with NvmlInventory() as nvml:
            snapshot = nvml.snapshot()
        published = resource_slice("node-a", snapshot, PlacementPolicy())["spec"]["devices"]
        return {
            d["name"]: (d["attributes"]["uuid"]["string"], d["attributes"]["index"]["int"])
            for d in published
        }

    fake_nvml.set(gpus=[h100(0), h100(1), h100(2)])
    first = devices()
    fake_nvml.set(gpus=[h100(2), h100(0), h100(1)])
    second = devices()
    assert {name: uuid for name, (uuid, _) in first.items()} == {
        name: uuid for name, (uuid, _) in second.items()
    }
    assert first[device_name_of(2)][1] == 2 and second[device_name_of(2)][1] == 0  # moved


def device_name_of(stand_in: int) -> str:
    return uuid_device_name(h100(stand_in).uuid)
