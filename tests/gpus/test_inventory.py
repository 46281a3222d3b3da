"""The snapshot dataclasses, their JSON form and ``StaticInventory``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gatekeeper.gpus.inventory import (
    GpuInfo,
    GpuInventory,
    GpuProcess,
    InventorySnapshot,
    SnapshotFormatError,
    failed_snapshot,
)
from gatekeeper.gpus.products import lookup_gpu
from gatekeeper.gpus.static import StaticInventory
from gatekeeper.units import GIB

FIXTURES = Path(__file__).parents[1] / "fixtures" / "gpus"

_names = st.text(st.characters(codec="utf-8"), max_size=20)
_bytes = st.integers(min_value=0, max_value=2**50)
_processes = st.builds(GpuProcess, pid=st.integers(1, 2**22), used_bytes=st.none() | _bytes)
_gpus = st.builds(
    GpuInfo,
    index=st.integers(0, 63),
    uuid=_names,
    name=_names,
    pci_bus_id=_names,
    total_bytes=_bytes,
    free_bytes=_bytes,
    used_bytes=_bytes,
    driver_reserved_bytes=st.none() | _bytes,
    processes=st.lists(_processes, max_size=4).map(tuple),
    healthy=st.booleans(),
    error=st.none() | _names,
    fence_reason=st.none() | _names,
)
_snapshots = st.builds(
    InventorySnapshot,
    gpus=st.lists(_gpus, max_size=4).map(tuple),
    ok=st.booleans(),
    error=st.none() | _names,
    duration_seconds=st.floats(0, 1e3, allow_nan=False),
    source=st.sampled_from(["nvml", "declared", "static"]),
    driver_version=st.none() | _names,
    nvml_version=st.none() | _names,
    pid_namespace_mismatch=st.booleans(),
    notes=st.lists(_names, max_size=3).map(tuple),
)


@given(_snapshots)
def test_json_round_trip(snapshot: InventorySnapshot) -> None:
    text = json.dumps(snapshot.to_dict())
    assert InventorySnapshot.from_dict(json.loads(text)) == snapshot


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("h100_*.json")), ids=lambda p: p.stem)
def test_recorded_fixtures_load_and_round_trip(path: Path) -> None:
    snapshot = StaticInventory.from_json(path).snapshot()
    assert snapshot.ok
    assert snapshot.gpus
    assert InventorySnapshot.from_dict(snapshot.to_dict()) == snapshot


def test_h100_fixture_agrees_with_the_gpu_table() -> None:
    """Driver total less reserved is what CUDA, vLLM and the GPU table call total."""
    snapshot = StaticInventory.from_json(FIXTURES / "h100_80g_x8.json").snapshot()
    assert len(snapshot.gpus) == 8
    h100 = lookup_gpu(snapshot.gpus[0].name)
    for gpu in snapshot.gpus:
        assert gpu.visible_total_bytes == h100.total_bytes
        assert gpu.free_bytes + gpu.used_bytes == gpu.visible_total_bytes
    assert snapshot.gpu(5).processes == (GpuProcess(pid=3456, used_bytes=9500 * 2**20),)


def test_mig_and_lost_fixture_is_not_placeable() -> None:
    snapshot = StaticInventory.from_json(FIXTURES / "h100_mig_lost_x4.json").snapshot()
    placeable = [g.index for g in snapshot.gpus if g.placeable]
    assert placeable == [0, 3]
    assert snapshot.gpu(1).healthy and "MIG" in (snapshot.gpu(1).fence_reason or "")
    assert not snapshot.gpu(2).healthy
    assert (snapshot.gpu(2).error or "").startswith("NVML_ERROR_GPU_IS_LOST")


def test_static_inventory_satisfies_the_protocol() -> None:
    snapshot = InventorySnapshot(gpus=(), ok=True)
    inventory: GpuInventory = StaticInventory(snapshot)
    assert inventory.snapshot() is snapshot


def test_gpu_lookup_by_index() -> None:
    gpu = GpuInfo(3, "GPU-3", "L4", "", 22 * GIB, 22 * GIB, 0)
    snapshot = InventorySnapshot(gpus=(gpu,), ok=True)
    assert snapshot.gpu(3) is gpu
    with pytest.raises(KeyError):
        snapshot.gpu(0)


def test_failed_snapshot_has_no_gpus() -> None:
    snapshot = failed_snapshot("no driver", source="nvml", duration_seconds=0.5)
    assert (snapshot.ok, snapshot.gpus, snapshot.error) == (False, (), "no driver")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"ok": True}, "key 'gpus' is missing"),
        ({"gpus": [], "ok": "yes"}, "ok = 'yes' should be bool"),
        ({"gpus": [{"index": 0}], "ok": True}, "gpus[0]: key 'uuid' is missing"),
        ({"gpus": [5], "ok": True}, "gpus[0]: expected a JSON object, got int"),
        ({"schema": "other/v9", "gpus": [], "ok": True}, "schema 'other/v9'"),
        (
            {
                "gpus": [
                    {
                        "index": True,
                        "uuid": "u",
                        "name": "n",
                        "total_bytes": 1,
                        "free_bytes": 1,
                        "used_bytes": 0,
                    }
                ],
                "ok": True,
            },
            "index = True should be int",
        ),
    ],
)
def test_bad_snapshot_json_names_the_key(data: dict[str, object], expected: str) -> None:
    with pytest.raises(SnapshotFormatError, match="snapshot") as info:
        InventorySnapshot.from_dict(data)
    assert expected in str(info.value)


def test_from_json_reports_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(SnapshotFormatError, match="cannot be read"):
        StaticInventory.from_json(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SnapshotFormatError, match=r"not valid JSON \(line 1"):
        StaticInventory.from_json(bad)
    listed = tmp_path / "list.json"
    listed.write_text("[]")
    with pytest.raises(SnapshotFormatError, match="holds a JSON list"):
        StaticInventory.from_json(listed)
