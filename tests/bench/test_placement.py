"""The placement bench's own arithmetic: the integer program, the booking rule, and a
couple of seeded mixes where gatekeeper must not beat the optimum nor over-commit."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gatekeeper.units import GIB

pytest.importorskip("scipy", reason="bench/placement.py needs scipy (pip install scipy)")

BENCH = Path(__file__).resolve().parents[2] / "bench" / "placement.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_placement", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_optimum_on_a_hand_made_instance(bench: ModuleType) -> None:
    # Two 10 GiB GPUs. A and B need 6 GiB on one GPU, C 4 GiB on each of two, D 5 GiB:
    # 25 GiB in all, so at most three fit, e.g. A + C on one GPU and B + C on the other.
    needs = [{1: 6 * GIB}, {1: 6 * GIB}, {2: 4 * GIB}, {1: 5 * GIB}]
    best = bench.optimum(needs, 2, 10 * GIB)
    assert best.proven
    assert best.count == 3
    assert all(load <= 10 * GIB for load in best.loads)
    # One 11 GiB GPU cannot take a TP=2 deployment; TP=1 at 11 GiB fits exactly.
    assert bench.optimum([{2: 1 * GIB}], 1, 11 * GIB).count == 0
    assert bench.optimum([{1: 11 * GIB}], 1, 11 * GIB).count == 1


def test_dominated_tp_sizes_are_dropped(bench: ModuleType) -> None:
    assert bench.undominated({1: 5, 2: 7, 4: 4, 8: 6}) == {1: 5, 4: 4}
    assert bench.undominated({2: 9, 4: 5}) == {2: 9, 4: 5}


def test_booking_rule_gives_each_worker_whole_gpus(bench: ModuleType) -> None:
    total = 80 * GIB
    small = {1: 5 * GIB, 2: 6 * GIB}
    big = {2: 75 * GIB, 4: 40 * GIB}  # 75 > 0.9 x 80: books 4 GPUs
    assert bench.booking_rule([small, small, small], 2, total) == [True, True, False]
    assert bench.booking_rule([big, small, big], 5, total) == [True, True, False]
    assert bench.booking_rule([{1: 79 * GIB}], 1, total) == [False]


def test_seeded_mixes_are_scored_consistently(bench: ModuleType) -> None:
    models = bench.Models()
    node = bench.empty_node()
    needs = bench.Needs(models, node)
    for mix in bench.random_mixes(3, seed=7):
        r = bench.score_mix(models, node, needs, mix)
        assert r.run.oddities == []
        assert r.best.proven
        assert r.admitted <= r.best.count <= len(mix)
        assert sum(r.rule) <= r.best.count
        assert all(load <= node.usable for load in r.run.loads.values())
