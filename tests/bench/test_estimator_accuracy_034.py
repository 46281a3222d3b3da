"""The calibration bench takes a vLLM 0.34 row: estimated with the ``v1-0.34`` span, and
with the extensible KV cache its KV figure read from the quoted log lines (the cache
as sized after warm-up), not "Available KV cache memory" (the reservation).

No real 0.34 row exists yet (``shared/calibration``): the row here is made up, its lines
formatted as vLLM 0.34.0 formats them (``tests/vllm/test_log_034.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.estimator_accuracy import (
    record_extensible,
    record_kv_cache,
    record_options,
    record_spec,
    score,
)
from gatekeeper.estimator import GpuTarget, estimate
from gatekeeper.units import GIB

ROW: dict[str, Any] = {
    "id": "synthetic-034",
    "source": "tests/bench/test_estimator_accuracy_034.py",
    "source_kind": "benchmark_sweep_log",
    "model_id": "meta-llama/Llama-3.1-8B-Instruct",
    "dtype": "bf16",
    "quantization": "none",
    "kv_cache_dtype": "auto",
    "tensor_parallel_size": 1,
    "pipeline_parallel_size": 1,
    "gpu_name": "NVIDIA H100 80GB",
    "gpu_total_memory_gib": 79.19,
    "gpu_memory_utilization": None,
    "max_model_len": 8192,
    "max_num_seqs": None,
    "max_num_batched_tokens": None,
    "enforce_eager": None,
    "vllm_version": "0.34.0",
    "weights_gib": 14.99,
    "kv_cache_gib": 61.61,  # "Available KV cache memory": the reservation
    "num_gpu_blocks": None,
    "kv_cache_tokens": 478592,
    "outcome": "ok",
    "quote": " | ".join(
        [
            "Model loading took 14.99 GiB memory and 6.900000 seconds",
            "Available KV cache memory: 61.61 GiB",
            "Memory after warmup: 62.45 GiB free, 0.12 GiB committed to the KV cache, 2.37 GiB "
            "kept for transient activations (2.37 GiB allocated at peak, 0.0 GiB of torch "
            "reservation growth); 7478 KV cache blocks (58.42 GiB) fit within the requested "
            "79.19 GiB. Torch may reserve up to 19.52 GiB.",
            "GPU KV cache size: 478,592 tokens, Maximum concurrency for 8,192 tokens per "
            "request: 58.42x",
            "Extended KV cache to 7478 blocks (58.42 GiB).",
        ]
    ),
}
H100 = GpuTarget(total_bytes=round(79.19 * GIB), name="H100-80GB", compute_capability=(9, 0))


def test_a_0_34_row_is_estimated_with_the_0_34_span_and_its_measured_kv_cache():
    options = record_options(ROW)
    assert options.vllm_version == "0.34.0" and options.enable_extensible_kv_cache is None
    e = estimate(record_spec(ROW), options, H100)
    assert e.accounting == "v1-0.34" and e.extensible_kv_cache and e.block_size == 64
    assert record_kv_cache(ROW, e) == pytest.approx(58.42, abs=1e-9)  # not the 61.61 reserved
    # without the sizing lines: the blocks, else the tokens, in the estimate's blocks
    bare = ROW | {"quote": "Available KV cache memory: 61.61 GiB"}
    assert record_kv_cache(bare, e) == pytest.approx(7478 * e.kv_block_bytes / GIB)
    assert record_kv_cache(bare | {"num_gpu_blocks": 7478}, e) == record_kv_cache(bare, e)
    assert record_kv_cache(bare | {"kv_cache_tokens": None}, e) is None


def test_a_0_34_row_with_the_cache_off_scores_available_kv_cache_memory():
    off = ROW | {"enable_extensible_kv_cache": False, "kv_cache_gib": 54.39}
    assert record_extensible(off) is False
    e = estimate(record_spec(off), record_options(off), H100)
    assert e.accounting == "v1-0.34" and not e.extensible_kv_cache
    assert record_kv_cache(off, e) == 54.39
    disabled = ROW | {
        "quote": "Disabling the extensible KV cache: the model has no KV cache. The KV cache "
        "will be sized from profiling estimates instead of measured memory. | Available KV "
        "cache memory: 54.39 GiB"
    }
    assert record_extensible(disabled) is False


def test_the_bench_scores_a_0_34_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert score([ROW], show_rows=True) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("synthetic-034"))
    assert "v1-0.34" in row and "kv_c" in row
    predicted, measured = row.split("kv_c")[1].split()[0].split("/")
    assert float(measured) == pytest.approx(58.42)  # the cache after warm-up, not 61.61
    assert float(predicted) == pytest.approx(58.42, rel=0.02)
