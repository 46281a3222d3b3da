"""A node's GPUs as a ResourceSlice (gatekeeper.cluster.slices), from recorded snapshots."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import kubernetes_validate
import pytest

from gatekeeper.cluster import (
    REQUEST_STEP_BYTES,
    SliceError,
    device_capacity_bytes,
    resource_slice,
)
from gatekeeper.gpus import InventorySnapshot, StaticInventory, failed_snapshot
from gatekeeper.placement.types import PlacementPolicy

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpus"
# The recorded H100: 85520809984 total - 491194941 driver-reserved = 85029615043 visible;
# margin 512 MiB + 2 % = 2237463212; 82792151831 usable, 82791366656 in whole MiB (77.11 GiB).
H100_CAPACITY = 82791366656


def recorded(name: str) -> InventorySnapshot:
    return StaticInventory.from_json(FIXTURES / name).snapshot()


def test_each_gpu_is_a_shareable_device_with_its_usable_bytes() -> None:
    spec = resource_slice("node-a", recorded("h100_80g_x8.json"), PlacementPolicy())["spec"]
    assert spec["driver"] == "gpu.gatekeeper.dev"
    assert spec["nodeName"] == "node-a"
    assert spec["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == [f"gpu-{i}" for i in range(8)]
    device = spec["devices"][3]
    assert device["attributes"] == {
        "uuid": {"string": "GPU-00000003-aaaa-bbbb-cccc-000000000003"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "index": {"int": 3},
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
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-3"]


def test_gpus_outside_the_policy_are_not_published() -> None:
    policy = PlacementPolicy(
        allowed_gpus=frozenset({"1", "GPU-00000005-aaaa-bbbb-cccc-000000000005"})
    )
    spec = resource_slice("node-a", recorded("h100_80g_x8.json"), policy)["spec"]
    assert [d["name"] for d in spec["devices"]] == ["gpu-1", "gpu-5"]


def test_a_gpu_the_margin_leaves_no_room_on_is_not_published() -> None:
    snapshot = recorded("h100_80g_x8.json")
    tiny = dataclasses.replace(snapshot.gpus[0], total_bytes=512 * 2**20, driver_reserved_bytes=0)
    small = dataclasses.replace(snapshot, gpus=(tiny, *snapshot.gpus[1:2]))
    spec = resource_slice("node-a", small, PlacementPolicy())["spec"]
    assert [d["name"] for d in spec["devices"]] == ["gpu-1"]


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
