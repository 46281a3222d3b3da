"""A shared worker's default KV cache (#31 item 4): ``shared_kv_sequences`` sequences of
max_model_len (at most max_num_seqs), the most that fit when fewer do, and a warning
when the budget cannot run max_num_seqs at full length."""

from __future__ import annotations

import dataclasses

import pytest

from gatekeeper.estimator.options import ServeOptions
from gatekeeper.gpus.declared import parse_declared_node
from gatekeeper.gpus.inventory import InventorySnapshot
from gatekeeper.models.source import resolve_model
from gatekeeper.placement.decision import decide
from gatekeeper.placement.plan import load_plan, run_plan
from gatekeeper.placement.policy import PlacementPolicy
from gatekeeper.placement.render import render_decision
from gatekeeper.placement.types import Decision, PlacementRequest
from gatekeeper.settings import Settings, placement_policy
from gatekeeper.units import GIB

QWEN = resolve_model("Qwen/Qwen2.5-0.5B-Instruct")
SHARED = PlacementPolicy(share_gpus=True)


def h100(used_gib: float = 0.0) -> InventorySnapshot:
    snap = parse_declared_node("1xH100-80GB")
    used = round(used_gib * GIB)
    g = snap.gpus[0]
    gpu = dataclasses.replace(g, free_bytes=g.free_bytes - used, used_bytes=used)
    return dataclasses.replace(snap, gpus=(gpu,))


def placed(decision: Decision) -> tuple[int, int]:
    """(sequences of max_model_len the KV budget holds, the budget)."""
    p = decision.placement
    assert p is not None and p.flags.kv_cache_memory_bytes is not None
    e = p.estimate
    assert p.kv_cache_bytes == p.flags.kv_cache_memory_bytes
    return (p.kv_cache_bytes // e.kv_block_bytes - 1) // e.blocks_per_request, p.kv_cache_bytes


def qwen(max_num_seqs: int | None = None, min_sequences: int = 1) -> PlacementRequest:
    return PlacementRequest(
        QWEN, ServeOptions(max_num_seqs=max_num_seqs), min_sequences=min_sequences
    )


def test_the_default_holds_shared_kv_sequences_and_warns_below_max_num_seqs():
    d = decide(qwen(max_num_seqs=1024), h100(), policy=SHARED)
    sequences, kv = placed(d)
    e = d.placement.estimate if d.placement else None
    assert e is not None and e.max_model_len == 32768
    assert sequences == 8 and kv == e.kv_bytes_for(8)  # not the one request of before
    assert kv > 8 * 0.375 * GIB
    [warning] = d.warnings
    assert "is sized for 8 sequences of 32768 tokens at once" in warning
    assert "max_num_seqs 1024" in warning and "shared_kv_sequences (now 8)" in warning
    assert d.to_json()["warnings"] == [warning]
    assert f"warning: {warning}" in render_decision(d)


def test_max_num_seqs_below_the_default_is_what_the_budget_holds_without_warning():
    d = decide(qwen(max_num_seqs=4), h100(), policy=SHARED)
    assert placed(d)[0] == 4 and d.warnings == ()


def test_min_sequences_above_the_default_wins():
    d = decide(qwen(max_num_seqs=64, min_sequences=12), h100(), policy=SHARED)
    assert placed(d)[0] == 12 and len(d.warnings) == 1


@pytest.mark.parametrize("room_sequences", [1, 3, 5])
def test_a_busy_gpu_gets_the_most_sequences_that_fit(room_sequences):
    # size the GPU's use so that exactly room_sequences fit after the margin
    alone = decide(qwen(max_num_seqs=1024), h100(), policy=SHARED)
    assert alone.placement is not None and alone.gpus
    e = alone.placement.estimate
    need_8 = alone.placement.promise_bytes[0]
    per_sequence = e.kv_block_bytes * e.blocks_per_request
    room = alone.gpus[0].usable_bytes - need_8 + (8 - room_sequences) * per_sequence
    d = decide(qwen(max_num_seqs=1024), h100((room - per_sequence // 2) / GIB), policy=SHARED)
    assert placed(d)[0] == room_sequences
    assert f"sized for {room_sequences} sequence" in d.warnings[0]


def test_when_not_even_min_sequences_fit_it_is_rejected():
    d = decide(qwen(max_num_seqs=1024), h100(79.0), policy=SHARED)
    assert not d.admitted and d.warnings == ()


def test_a_worker_alone_on_its_gpu_is_not_warned_of():
    d = decide(qwen(max_num_seqs=1024), h100(), policy=PlacementPolicy())
    assert d.admitted and d.warnings == ()


def test_an_own_budget_is_not_resized_but_is_warned_of():
    request = PlacementRequest(QWEN, ServeOptions(kv_cache_memory_bytes=GIB, max_num_seqs=256))
    d = decide(request, h100(), policy=SHARED)
    assert placed(d)[1] == GIB
    assert "raise --kv-cache-memory-bytes" in d.warnings[0]


def test_the_setting_reaches_the_policy(monkeypatch):
    monkeypatch.delenv("GATEKEEPER_SHARED_KV_SEQUENCES", raising=False)
    assert Settings().shared_kv_sequences == 8
    monkeypatch.setenv("GATEKEEPER_SHARED_KV_SEQUENCES", "3")
    policy = placement_policy(Settings(share_gpus=True))
    assert policy.shared_kv_sequences == 3
    assert placed(decide(qwen(max_num_seqs=1024), h100(), policy=policy))[0] == 3


def test_a_plan_shows_each_workers_warning(tmp_path):
    path = tmp_path / "plan.toml"
    path.write_text(
        'node = "1xH100-80GB"\n'
        + "".join(
            f'[[deployments]]\nname = "{n}"\nmodel = "Qwen/Qwen2.5-0.5B-Instruct"\n'
            f"max_num_seqs = {seqs}\n"
            for n, seqs in (("wide", 1024), ("narrow", 4))
        )
    )
    result = run_plan(load_plan(path), h100(), SHARED, resolve_model)
    wide, narrow = result.to_json()["deployments"]
    assert len(wide["warnings"]) == 1 and narrow["warnings"] == []
    assert f"    warning: {wide['warnings'][0]}" in result.render().splitlines()


def test_a_refusal_beside_whole_gpu_workers_names_share_gpus_when_it_would_admit():
    """The sidecar's door: a GPU hosting a gatekeeper worker that left room (its own
    small budget) passes over a new worker while sharing is off; the refusal names
    share_gpus only because a search with it on admits the request there."""
    node = h100(used_gib=20)
    (gpu,) = node.gpus
    off = decide(qwen(), node, workers={gpu.uuid: 1}, policy=PlacementPolicy())
    assert not off.admitted
    (hint,) = [s for s in off.suggestions if s.kind == "share_gpus"]
    assert hint.text.startswith("share_gpus = true (GATEKEEPER_SHARE_GPUS=true) fits it on GPU 0")
    assert "sized for 8 sequences of 32768 tokens (--kv-cache-memory-bytes " in hint.text
    on = decide(qwen(), node, workers={gpu.uuid: 1}, policy=SHARED)
    assert on.admitted
    full = h100(used_gib=79)
    (gpu,) = full.gpus
    refused = decide(qwen(), full, workers={gpu.uuid: 1}, policy=PlacementPolicy())
    assert not refused.admitted and all(s.kind != "share_gpus" for s in refused.suggestions)
