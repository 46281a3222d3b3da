"""``bench/mechanisms.py``: its hand rules on known figures, and one row measured end to
end through the installed CLI (two ``gatekeeper estimate --json`` runs)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "mechanisms.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_mechanisms", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_hand_rules_on_known_figures(bench: ModuleType) -> None:
    # 8 x rank 256 on Llama-3.1-8B: 10.0 GiB of linear slots + the vocab wrappers
    assert bench.hand_lora(8, 256) == 10_737_418_240 + 8 * 256 * 2 * 132_352 * 2
    # the UVA offloader moves whole parameters, so it overshoots the limit
    assert -bench.hand_offload(10) > 10 * bench.GIB
    assert bench.capture_sizes(100, 8192, 1024)[-1] == 96
    assert bench.capture_sizes(512, 8192, 1024)[-1] == 512


def test_one_row_through_the_cli(bench: ModuleType, tmp_path: Path) -> None:
    rows = [s for s in bench.scenarios(bench.write_eagle(tmp_path)) if s.mechanism == "EAGLE head"]
    row = bench.measure(rows[1])  # KV bytes per token: exact
    assert (row.without, row.with_, row.hand) == (131_072, 135_168, 4096)
    assert row.agree
    assert "EAGLE head" in bench.render([row])
