"""Declared nodes: product lists, JSON files of GPUs, recorded snapshots, bad input."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

import pytest

from gatekeeper.errors import GatekeeperError
from gatekeeper.gpus.declared import DeclaredNodeError, parse_declared_node
from gatekeeper.gpus.inventory import GpuProcess
from gatekeeper.gpus.products import gpu_products, lookup_gpu
from gatekeeper.units import GIB

FIXTURES = Path(__file__).parents[1] / "fixtures" / "gpus"


def test_two_h100s() -> None:
    snapshot = parse_declared_node("2xH100-80GB")
    assert snapshot.ok and snapshot.source == "declared"
    assert [g.index for g in snapshot.gpus] == [0, 1]
    for gpu in snapshot.gpus:
        assert gpu.name == "H100-80GB"
        assert gpu.total_bytes == gpu.free_bytes == lookup_gpu("H100").total_bytes
        assert abs(gpu.total_bytes / GIB - 79.19) < 0.005
        assert gpu.used_bytes == 0 and gpu.placeable
    assert len({g.uuid for g in snapshot.gpus}) == 2


def test_mixed_products_and_implicit_count() -> None:
    snapshot = parse_declared_node(" 1xA100-40GB, L4 ,2 x t4")
    assert [g.name for g in snapshot.gpus] == ["A100-40GB", "L4", "T4", "T4"]
    assert [g.index for g in snapshot.gpus] == [0, 1, 2, 3]
    assert snapshot.gpus[1].total_bytes == lookup_gpu("L4").total_bytes


def test_busy_node_from_json_file() -> None:
    snapshot = parse_declared_node(str(FIXTURES / "declared_busy_node.json"))
    assert [g.name for g in snapshot.gpus] == ["H100-80GB", "H100-80GB", "A100-40GB", "L4"]
    a100 = snapshot.gpu(2)
    assert a100.used_bytes == 20 * GIB
    assert a100.free_bytes == lookup_gpu("A100-40GB").total_bytes - 20 * GIB
    assert a100.processes == (GpuProcess(pid=4242, used_bytes=20 * GIB),)
    assert snapshot.gpu(3).used_bytes == 2 * GIB and snapshot.gpu(3).processes == ()


def test_json_file_custom_gpu_used_from_processes_and_unhealthy(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    gpus = [
        {"name": "my-card", "total": "48GiB", "processes": [{"pid": 7, "used": "1GiB"}]},
        {"name": "L4", "healthy": False, "error": "fell off the bus"},
        {"name": "L4", "uuid": "GPU-abc", "used": 0},
    ]
    path.write_text(json.dumps({"gpus": gpus}))
    snapshot = parse_declared_node(str(path))
    assert snapshot.gpu(0).total_bytes == 48 * GIB
    assert snapshot.gpu(0).used_bytes == 1 * GIB
    assert not snapshot.gpu(1).healthy and snapshot.gpu(1).error == "fell off the bus"
    assert snapshot.gpu(2).uuid == "GPU-abc"


def test_recorded_snapshot_file_is_accepted() -> None:
    snapshot = parse_declared_node(str(FIXTURES / "h100_80g_x8.json"))
    assert snapshot.source == "nvml" and len(snapshot.gpus) == 8


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", "'' is empty"),
        ("   ", "is empty"),
        ("0xH100-80GB", "'0xH100-80GB' declares 0 GPUs"),
        ("2xFOO", "'FOO' in '2xFOO' is not in the GPU table; use one of H100-80GB"),
        ("2x", "'2x' in '2x' is not in the GPU table"),
        ("1xL4,,1xL4", "has an empty item"),
        ("65xH100", "declares 65 GPUs, more than 64"),
        ("40xH100,40xL4", "declares 80 GPUs"),
    ],
)
def test_bad_declared_node_names_the_value(value: str, expected: str) -> None:
    with pytest.raises(DeclaredNodeError) as info:
        parse_declared_node(value)
    assert expected in str(info.value)
    assert isinstance(info.value, GatekeeperError)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"gpus": []}', "needs a non-empty 'gpus' list"),
        ('{"gpus": [{"name": "L4", "usd": 1}]}', "unknown key(s) usd"),
        ('{"gpus": [{"count": 2}]}', "name = None; a name is required"),
        ('{"gpus": [{"name": "NOPE"}]}', "'NOPE' in"),
        ('{"gpus": [{"name": "L4", "used": "30GiB"}]}', "does not fit total"),
        ('{"gpus": [{"name": "L4", "used": "lots"}]}', "'lots' is not a size"),
        ('{"gpus": [{"name": "L4", "count": 0}]}', "count = 0 must be"),
        (
            '{"gpus": [{"name": "L4", "count": 2, "processes": [{"pid": 1, "used": 5}]}]}',
            "ambiguous",
        ),
        ('{"gpus": [{"name": "L4", "processes": [{"used": 5}]}]}', "needs an integer 'pid'"),
        ('{"gpus": ["L4"]}', "gpus[0]: 'L4' is not an object"),
        ('{"gpus": [{"name": "L4", "processes": 3}]}', "processes = 3 must be a list"),
        ('{"gpus": [{"name": "L4", "used": 1, "processes": [{"pid": 1, "used": 5}]}]}', "fit"),
        ("[1]", "holds a JSON list"),
    ],
)
def test_bad_json_file_names_the_file_and_entry(
    tmp_path: Path, content: str, expected: str
) -> None:
    path = tmp_path / "node.json"
    path.write_text(content)
    with pytest.raises(GatekeeperError) as info:
        parse_declared_node(str(path))
    assert expected in str(info.value)
    assert str(path) in str(info.value)


def test_missing_file_says_it_cannot_be_read(tmp_path: Path) -> None:
    with pytest.raises(GatekeeperError, match="cannot be read"):
        parse_declared_node(str(tmp_path / "absent.json"))


def test_every_gpu_table_figure_has_a_source_that_gives_it() -> None:
    """Each product's total says where it comes from; a figure derived from nvidia-smi's
    MiB total less the driver's reserved memory must agree with that arithmetic."""
    products = gpu_products()
    assert len({p.name for p in products}) == len(products) >= 10
    for product in products:
        gib = product.total_bytes / GIB
        kind, _, detail = product.source.partition(": ")
        assert kind in {"vllm-log", "smi-less-reserved", "datasheet"}, product.name
        if kind == "vllm-log":
            assert f"{gib:.2f}" in detail, product.name
        elif kind == "datasheet":  # the vendor's GB (10^9 bytes), a lower bound
            match = re.match(r"(\d+) GB ", detail)
            assert match is not None, product.name
            assert abs(int(match[1]) * 10**9 / GIB - gib) < 0.006, product.name
            assert "lower bound" in detail, product.name
        else:
            match = re.fullmatch(r"(\d+) MiB less ~(\d+\.\d+) GiB", detail)
            assert match is not None, product.name
            smi_mib, reserved_gib = int(match[1]), float(match[2])
            assert abs(smi_mib / 1024 - reserved_gib - gib) < 0.011, product.name


def test_late_2026_products_and_what_nvml_reads_of_them() -> None:
    """Grace-Blackwell, B300, RTX PRO 6000 Blackwell, GB10 and AMD Instinct are in the table;
    AMD parts and GB10's unified memory are declared-only (NVML reads no memory of them),
    and every NVML name the table lists says where it was seen."""
    raw = json.loads((resources.files("gatekeeper") / "data" / "gpus.json").read_text())
    rows = {row["name"]: row for row in raw["products"]}
    for name in ("B300", "GB200", "GB300", "GB10", "RTX-PRO-6000-Blackwell-Server",
                 "RTX-PRO-6000-Blackwell-Workstation", "MI300X", "MI325X", "MI355X"):  # fmt: skip
        assert name in rows, name
    declared_only = {p.name for p in gpu_products() if not p.nvml}
    assert declared_only == {"GB10", "MI300X", "MI325X", "MI355X"}
    assert {p.name for p in gpu_products() if p.unified_memory} == {"GB10"}
    for product in gpu_products():
        nvml_names = [a for a in product.aliases if a.startswith(("NVIDIA ", "Tesla "))]
        if product.name in rows and rows[product.name]["source"].startswith("datasheet"):
            assert bool(nvml_names) == bool(rows[product.name].get("nvml_seen_in")), product.name
        if not product.nvml:
            assert not nvml_names and not product.gfd_products, product.name
    assert lookup_gpu("NVIDIA B300 SXM6 AC").name == "B300"
    assert lookup_gpu("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition").name.endswith("Server")
    assert lookup_gpu("DGX Spark").name == "GB10"
    assert lookup_gpu("mi355x").compute_capability is None  # no CUDA capability


def test_declared_node_of_declared_only_products() -> None:
    """AMD and unified-memory parts plan through a declared node like any other."""
    snapshot = parse_declared_node("8xMI300X")
    assert len(snapshot.gpus) == 8
    assert snapshot.gpus[0].total_bytes == lookup_gpu("MI300X").total_bytes == 191995775549
    assert parse_declared_node("GB10").gpus[0].name == "GB10"
