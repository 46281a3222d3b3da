"""vLLM 0.33's and 0.34's accounting, each term against the releases' own arithmetic.

The sources are the PyPI wheels (``vllm/_version.py``: 0.33.0 at g4ba787ec9, 0.34.0 at
g62d4bc3c7); every docstring names the file and line a figure follows. Expected figures
are written out from those lines and the model's config, not from gatekeeper's code.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from gatekeeper.errors import ServeOptionsError
from gatekeeper.estimator.accounting import ACCOUNTINGS, accounting_for
from gatekeeper.estimator.extensible_kv import (
    kv_cache_available,
    kv_cache_margin,
    measure_kv_cache_bytes,
)
from gatekeeper.estimator.options import ServeOptions
from gatekeeper.estimator.overhead import CUBLAS_WORKSPACE_BYTES, CUDA_CONTEXT_BYTES
from gatekeeper.estimator.vllm_method import Estimate, GpuTarget, estimate
from gatekeeper.gpus.products import lookup_gpu
from gatekeeper.models.source import resolve_model
from gatekeeper.units import GIB, MIB
from gatekeeper.vllm.flags import serve_options

H100 = GpuTarget(total_bytes=round(79.19 * GIB), name="H100-80GB", compute_capability=(9, 0))
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
V032, V033, V034 = "0.32.0", "0.33.0", "0.34.0"
REQUESTS, VOCAB = 1024, 128256  # H100 serve default max_num_seqs; Llama 3.1's vocabulary


def run(version: str, gpu: GpuTarget = H100, model: str = LLAMA_8B, **flags: Any) -> Estimate:
    options = ServeOptions(vllm_version=version, **{"max_model_len": 8192, **flags})
    return estimate(resolve_model(model), options, gpu)


# 0.33.0


def test_033_profiles_a_second_sampler_pass_with_an_fp32_copy_of_the_logits():
    """v1/worker/gpu/model_runner.py:1010-1014 (0.33.0): ``_dummy_sampler_run`` runs the
    sampler again after adding ``SamplingParams.for_sampler_warmup()`` to every request
    (sampling_params.py:1476-1493: temperature, top-p/k, min-p, penalties, logprobs);
    with logits processing on, ``apply_sampling_params`` first copies the logits to fp32
    (v1/worker/gpu/sample/sampler.py:241-242): 4 bytes per [requests x vocab] element
    more than 0.32's profile (1024 x 128,256 x 4 B = 0.49 GiB)."""
    old, new = run(V032).worst, run(V033).worst
    assert old.activation_peak_bytes == round(REQUESTS * VOCAB * (2 + 13.4))
    assert new.activation_peak_bytes == round(REQUESTS * VOCAB * (2 + 13.4 + 4))
    added = new.activation_peak_bytes - old.activation_peak_bytes
    assert added == REQUESTS * VOCAB * 4 == 525_336_576
    assert round(added / GIB, 2) == 0.49


def test_033_makes_the_cublas_handles_before_the_snapshot_outside_the_budget():
    """v1/worker/gpu_worker.py:526-528 (0.33.0): a 16x16 ``torch.mm`` and ``linear`` create
    the cuBLAS(Lt) handles before ``MemorySnapshot`` (line 541), "so they count as
    baseline like the NCCL buffers". torch allocates the handle's workspace then (32 MiB
    on Hopper, PyTorch's CublasHandlePool.cpp), so it leaves the non-torch growth inside
    ``u x total`` and joins the memory held before the snapshot: the KV cache gains it and
    the worker's NVML figure grows by it."""
    old, new = run(V032), run(V033)
    assert old.worst.non_torch_bytes - new.worst.non_torch_bytes == CUBLAS_WORKSPACE_BYTES
    assert CUBLAS_WORKSPACE_BYTES == 4096 * 8 * 1024
    sampler = REQUESTS * VOCAB * 4
    assert new.worst.kv_cache_bytes == old.worst.kv_cache_bytes + CUBLAS_WORKSPACE_BYTES - sampler
    assert new.worst.budget_bytes == old.worst.budget_bytes  # 0.92 x total in both
    assert new.worst.nvml_bytes == old.worst.nvml_bytes + CUBLAS_WORKSPACE_BYTES
    # the promise placement makes: the same components, the workspace outside the budget
    held, _ = new.rank_bytes(new.worst, 0)
    parts = new.worst.weights_bytes + new.worst.non_torch_bytes
    parts += new.worst.activation_peak_bytes + new.worst.cuda_graph_bytes
    assert held == CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES + parts


def test_033_worked_example_llama_8b_on_an_h100():
    """0.32 -> 0.33 on Llama-3.1-8B bf16 at 8,192 tokens on an H100: budget 0.92 x 79.19 GiB
    (config/cache.py:215 of 0.33.0); KV = budget - weights - non-torch - activation -
    graphs (gpu_worker.py determine_available_memory, unchanged from 0.32)."""
    old, new = run(V032).worst, run(V033).worst
    budget = math.ceil(0.92 * H100.total_bytes)
    for w in (old, new):
        rest = w.weights_bytes + w.non_torch_bytes + w.activation_peak_bytes + w.cuda_graph_bytes
        assert w.kv_cache_bytes == budget - rest
    assert round(old.kv_cache_bytes / GIB, 2) == 54.85
    assert round(new.kv_cache_bytes / GIB, 2) == 54.39


# 0.34.0: the extensible KV cache


def test_034_measure_kv_cache_bytes_is_vllms_arithmetic():
    """v1/worker/extensible_kv_cache.py:592-618 (0.34.0), with the margin constants of
    lines 64-65 (1 GiB floor on CUDA, 0.75 of the transient peak):
    non_kv_used = init_free - free - committed; headroom = free + committed;
    available = min(requested - non_kv_used, headroom - margin) - max(peak, growth)."""
    # a worker that found 78 GiB free, used 16 GiB, committed 1 GiB of KV during warm-up
    kwargs = {"init_free_memory": 78 * GIB, "free_memory": 61 * GIB, "committed_bytes": GIB}
    # the device binds: headroom 62 GiB - margin 1.5 GiB - peak 2 GiB
    full = measure_kv_cache_bytes(requested_memory=80 * GIB, transient_peak_bytes=2 * GIB, **kwargs)
    assert full == 62 * GIB - 3 * GIB // 2 - 2 * GIB
    # the budget binds: 40 GiB - 16 GiB used - 2 GiB peak
    capped = measure_kv_cache_bytes(
        requested_memory=40 * GIB, transient_peak_bytes=2 * GIB, **kwargs
    )
    assert capped == 40 * GIB - 16 * GIB - 2 * GIB
    # the torch reservation's growth, when larger, is kept free instead of the peak
    grown = measure_kv_cache_bytes(
        requested_memory=80 * GIB,
        transient_peak_bytes=2 * GIB,
        torch_reserve_growth_bytes=3 * GIB,
        **kwargs,
    )
    assert grown == full - GIB
    # never below zero in vLLM (line 618); gatekeeper keeps the shortfall, as for 0.33
    assert measure_kv_cache_bytes(requested_memory=GIB, transient_peak_bytes=GIB, **kwargs) == 0
    short = kv_cache_available(requested_memory=GIB, transient_peak_bytes=GIB, **kwargs)
    assert short == GIB - 16 * GIB - GIB
    # the margin: its 1 GiB floor below a 1.33 GiB peak, three quarters of the peak above
    assert kv_cache_margin(GIB) == GIB
    assert kv_cache_margin(4 * GIB) == 3 * GIB


def test_034_sizes_the_kv_cache_after_warmup_from_the_whole_gpu():
    """On a GPU of its own with --gpu-memory-utilization unset: the budget is a 1.0 cap
    (config/cache.py:494-501), so the device binds: KV = total - held before the snapshot
    - weights - non-torch - captured graphs - margin - transient peak, the peak being the
    profile's activation (gpu_worker.py:771-773 with the graph estimate 0,
    gpu/model_runner.py:1123-1125; seeded at gpu_worker.py:946-948)."""
    e = run(V034)
    w = e.worst
    assert e.extensible_kv_cache and e.gpu_memory_utilization == 1.0
    pre_init = CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES
    used = w.weights_bytes + w.non_torch_bytes + w.cuda_graph_bytes
    peak = w.activation_peak_bytes
    assert peak == round(REQUESTS * VOCAB * (2 + 13.4 + 4))  # 0.33's profile, unchanged
    margin = max(GIB, int(0.75 * peak))
    assert w.kv_margin_bytes == margin
    assert w.kv_cache_bytes == H100.total_bytes - pre_init - used - margin - peak
    # the budget the KV cache is the rest of: min(1.0 x total, free - margin)
    assert w.budget_bytes == H100.total_bytes - pre_init - margin
    assert w.kv_cache_bytes == w.budget_bytes - used - peak
    # the worker then holds all of it but the margin, the peak regrown by serving
    assert w.nvml_bytes == pre_init + used + peak + w.kv_cache_bytes
    assert w.nvml_bytes == H100.total_bytes - margin
    assert e.to_json()["extensible_kv_cache"] and e.to_json()["kv_margin_bytes"] == margin


def test_034_blocks_hold_64_tokens():
    """config/cache.py:185 (0.34.0): ``DEFAULT_BLOCK_SIZE = 64`` (16 in 0.33); FlashAttention
    supports it, so ``get_preferred_block_size`` keeps it (v1/attention/backend.py:158-165,
    backends/flash_attn.py:372-379). Llama-3.1-8B: 32 layers x 64 x 2 x 8 x 128 x 2 B."""
    e = run(V034)
    assert e.block_size == 64 and run(V033).block_size == 16
    assert e.kv_block_bytes == 32 * 64 * 2 * 8 * 128 * 2 == 8 * MIB
    assert e.worst.num_blocks == e.worst.kv_cache_bytes // (8 * MIB)
    assert e.blocks_per_request == 8192 // 64


def test_034_a_given_utilization_caps_the_measured_cache():
    """measure_kv_cache_bytes' first term (extensible_kv_cache.py:616):
    requested - non_kv_used, with requested = ceil(u x total) (v1/worker/utils.py:742-743)."""
    w = run(V034, gpu_memory_utilization=0.5).worst
    requested = math.ceil(0.5 * H100.total_bytes)
    used = w.weights_bytes + w.non_torch_bytes + w.cuda_graph_bytes
    assert w.budget_bytes == requested
    assert w.kv_cache_bytes == requested - used - w.activation_peak_bytes


def test_034_skips_the_start_up_refusal_and_takes_what_is_free():
    """v1/worker/utils.py:783-786 (0.34.0): "Free memory on device ... is less than desired
    GPU memory utilization" is raised only without the extensible KV cache; with it the
    budget is a cap and the cache is sized from the memory free after warm-up
    (headroom = free + committed, extensible_kv_cache.py:614)."""
    free = 40 * GIB
    shared = dataclasses.replace(H100, free_bytes=free)
    old, new = run(V033, shared), run(V034, shared)
    assert not old.fits and any("free memory on the GPU" in r for r in old.reasons)
    assert new.fits, new.reasons
    w = new.worst
    pre_init = CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES
    used = w.weights_bytes + w.non_torch_bytes + w.cuda_graph_bytes
    expected = free - pre_init - used - w.kv_margin_bytes - w.activation_peak_bytes
    assert w.kv_cache_bytes == expected


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        ({"enable_extensible_kv_cache": False}, "--no-enable-extensible-kv-cache"),
        ({"num_gpu_blocks_override": 4096}, "config/vllm.py:3208-3212"),
        ({"kv_cache_memory_bytes": 20 * GIB}, "config/vllm.py:3203-3207"),
    ],
)
def test_034_with_the_cache_off_sizes_as_033_with_64_token_blocks(flags, why):
    """config/vllm.py:3180-3269 (0.34.0), ``_resolve_extensible_kv_cache``: off when asked, and
    with --kv-cache-memory-bytes or --num-gpu-blocks-override; then gpu_memory_utilization
    defaults to 0.92 (config/cache.py:186, 501), the CUDA-graph estimate is subtracted
    again and the start-up refusal applies: 0.33's accounting, but 64-token blocks."""
    off = run(V034, **flags)
    old = run(V033, **{k: v for k, v in flags.items() if k != "enable_extensible_kv_cache"})
    assert not off.extensible_kv_cache, why
    assert off.gpu_memory_utilization == old.gpu_memory_utilization
    assert off.worst.kv_margin_bytes == 0
    assert off.block_size == 64 and old.block_size == 16
    if "num_gpu_blocks_override" in flags:  # the blocks are 4x larger
        assert off.worst.kv_cache_bytes == 4 * old.worst.kv_cache_bytes
    else:
        assert off.worst.kv_cache_bytes == old.worst.kv_cache_bytes
    assert off.worst.nvml_bytes - off.worst.kv_cache_bytes == (
        old.worst.nvml_bytes - old.worst.kv_cache_bytes
    )


def test_034_refuses_an_explicit_extensible_cache_beside_a_byte_budget():
    """config/vllm.py:3203-3207, 3262-3263 (0.34.0): explicitly requesting the extensible KV
    cache where kv_cache_memory_bytes rules it out raises ``enable_extensible_kv_cache: it
    sizes the KV cache from measured memory, which kv_cache_memory_bytes overrides``."""
    with pytest.raises(ServeOptionsError) as err:
        run(V034, enable_extensible_kv_cache=True, kv_cache_memory_bytes=20 * GIB)
    assert err.value.field == "enable_extensible_kv_cache"
    assert "kv_cache_memory_bytes" in str(err.value)
    with pytest.raises(ServeOptionsError, match=r"new in vLLM 0\.34"):
        run(V033, enable_extensible_kv_cache=False)


def test_034_checks_max_model_len_against_the_cache_measured_after_warmup():
    """kv_cache_planning.py:1827-1862 (0.34.0), ``shrink_kv_cache_configs``: once the cache
    is sized, ``(num_blocks - 1) x bytes_per_block`` must hold one request of
    max_model_len; ``--max-model-len auto`` is fitted again there
    (``finalize_extensible_kv_cache``, lines 1885-1899). On a 24 GB L4 the 128K context
    of Llama-3.1-8B does not fit: the reason says when vLLM checks it, and the largest
    length that fits is the measured cache's."""
    l4 = GpuTarget(total_bytes=lookup_gpu("L4").total_bytes, name="L4", compute_capability=(8, 9))
    e = run(V034, l4, max_model_len=131072)
    assert not e.fits
    assert any("after warm-up and CUDA-graph capture" in r for r in e.reasons)
    # the largest length: (blocks - 1) x 64 tokens, whole 64-token blocks of 128 KiB a token
    w = e.worst
    assert e.max_model_len_fit == (w.kv_cache_bytes // e.kv_block_bytes - 1) * 64
    assert run(V034, l4, max_model_len=e.max_model_len_fit).fits


def test_older_spans_keep_their_rules():
    """Spans before 0.33 keep one sampler pass, handles after the snapshot, 16-token blocks
    and the profile-sized KV cache; only v1-0.34 has the extensible cache."""
    for acc in ACCOUNTINGS:
        newer = acc.since >= (0, 33, 0)
        assert acc.handles_before_snapshot is newer, acc.name
        assert acc.sampler_warmup_bytes == (4.0 if newer else 0.0), acc.name
        assert acc.extensible_kv is (acc.since >= (0, 34, 0)), acc.name
        assert acc.default_block_size == (64 if acc.since >= (0, 34, 0) else 16), acc.name
    assert accounting_for("0.32.0").name == "v1-0.21"
    assert accounting_for("0.33.1").name == "v1-0.33"
    assert accounting_for("0.34.0").name == "v1-0.34"
    # 0.32 and 0.21 (one span): the figures of the commit before 0.33 was modelled
    for release in (V032, "0.21.0"):
        w = run(release).worst
        assert (w.kv_cache_bytes, w.nvml_bytes) == (58_895_952_656, 78_764_116_752)
        assert (w.activation_peak_bytes, w.non_torch_bytes) == (2_022_545_818, 256 * MIB)


def test_034_mla_blocks_stay_at_64_tokens():
    """FlashMLA's 64-token block (v1/attention/backends/mla/flashmla.py:57-58) was already what
    MLA models got; 0.34's default of 64 (config/cache.py:185) leaves them there."""
    lite = "deepseek-ai/DeepSeek-V2-Lite"
    assert run(V033, model=lite).block_size == run(V034, model=lite).block_size == 64


def test_the_flag_is_read_by_its_dest_like_every_modelled_flag():
    """engine/arg_utils.py:615, 1413-1414 (0.34.0): ``--enable-extensible-kv-cache`` is
    ``CacheConfig.enable_extensible_kv_cache``'s flag (a BooleanOptionalAction, so
    ``--no-enable-extensible-kv-cache`` turns it off); ``serve_options`` keeps it as it
    keeps every ``ServeOptions`` field given."""
    assert serve_options({"enable_extensible_kv_cache": False}).enable_extensible_kv_cache is False
    assert serve_options({}).enable_extensible_kv_cache is None


def test_034_refuses_when_nothing_is_left_after_warmup():
    """extensible_kv_cache.py:618 clamps the measured cache at 0 blocks, and
    ``shrink_kv_cache_configs`` (kv_cache_planning.py:1849-1860) then raises "No available
    memory for the cache blocks"; gatekeeper keeps how short it is, as for older releases.
    Llama-3.1-8B under a 0.2 cap: 0.2 x 79.19 = 15.84 GiB < 16.09 GiB used + 2.37 GiB peak."""
    e = run(V034, gpu_memory_utilization=0.2)
    w = e.worst
    assert not e.fits
    used = w.weights_bytes + w.non_torch_bytes + w.cuda_graph_bytes
    assert w.kv_cache_bytes == math.ceil(0.2 * H100.total_bytes) - used - w.activation_peak_bytes
    assert w.kv_cache_bytes < 0 and w.num_blocks == 0
    assert any("no memory left for the KV cache after warm-up" in r for r in e.reasons)
