"""vLLM 0.34's start-up lines read by the log reader: the extensible KV cache's sizing
after warm-up, and "Available KV cache memory" as the reservation it then is.

Each line is built from vLLM 0.34.0's own format string (the constants below, checked
against the unpacked 0.34.0 wheel when ``build/vllm-releases/0.34.0`` is there) with its
own arguments: ``format_gib`` (``vllm/utils/mem_utils.py:31-32``: ``round(b / GiB, 2)``),
``%d`` and ``%.2f``.
"""

from __future__ import annotations

import ast
import math
import os
import subprocess
from pathlib import Path

import pytest

from gatekeeper.units import GIB, MIB
from gatekeeper.vllm.log import StartupLog, failure_reason

REPO = Path(__file__).resolve().parents[2]
SOURCE = Path(os.environ.get("GK_RELEASES_DIR", REPO / "build/vllm-releases")) / "0.34.0/vllm"
WORKER = "(EngineCore pid=4242) INFO 12-06 10:00:00 [{where}] "

# vLLM 0.34.0's format strings, by file and the line of the logging call.
AVAILABLE = ("v1/worker/gpu_worker.py", 795, "Available KV cache memory: %s GiB")
AFTER_WARMUP = (
    "v1/worker/extensible_kv_cache.py",
    693,
    "Memory after warmup: %s GiB free, %s GiB committed to the KV cache, "
    "%s GiB kept for transient activations (%s GiB allocated at peak, "
    "%s GiB of torch reservation growth); %d KV cache blocks (%s GiB) "
    "fit within the requested %s GiB. Torch may reserve up to %s GiB.",
)
EXTENDED = ("v1/worker/extensible_kv_cache.py", 536, "Extended KV cache to %d blocks (%.2f GiB).")
REMAPPING = (
    "v1/worker/extensible_kv_cache.py",
    525,
    "Remapping the KV cache from %d to %d blocks to fit the measured budget.",
)
DISABLING = (
    "v1/executor/abstract.py",
    175,
    "Disabling the extensible KV cache: %s. The KV cache will be sized "
    "from profiling estimates instead of measured memory.",
)
CAPACITY = (
    "v1/core/kv_cache_utils.py",
    1168,
    "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx",
)
GRAPH_POOL = (
    "v1/worker/gpu_worker.py",
    1112,
    "CUDA graph pool memory: %s GiB (actual), %s GiB (estimated), difference: %s GiB (%.1f%%).",
)
LOADED = ("v1/worker/gpu/model_runner.py", 441, "Model loading took %s GiB memory and %.6f seconds")
FORMATS = (AVAILABLE, AFTER_WARMUP, EXTENDED, REMAPPING, DISABLING, CAPACITY, GRAPH_POOL, LOADED)


def format_gib(b: int) -> str:
    """``vllm/utils/mem_utils.py:31-32``."""
    return f"{round(b / GIB, 2)}"


def line(fmt: tuple[str, int, str], *args: object) -> str:
    file, number, text = fmt
    return WORKER.format(where=f"{file.rsplit('/', 1)[-1]}:{number}") + text % args


def read(lines: list[str]) -> StartupLog:
    log = StartupLog()
    for text in lines:
        log = log.feed(text)
    return log


def gib_read(text: str) -> int:
    """The bytes the reader takes a printed GiB figure for."""
    return round(float(text) * GIB)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """vLLM 0.34.0's Python sources, unpacked from its wheel by ``scripts/vllm-release.sh``
    when they are not there yet (a fresh clone: about 240 MB from PyPI, kept in
    ``build/``); skipped only where the wheel cannot be had."""
    if not SOURCE.is_dir():
        env = {**os.environ, "GK_FLAGS_DIR": str(tmp_path_factory.mktemp("flags"))}
        done = subprocess.run(
            ["bash", str(REPO / "scripts" / "vllm-release.sh"), "0.34.0", "--table"],
            env=env, capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        if not SOURCE.is_dir():
            pytest.skip(f"vLLM 0.34.0's sources could not be unpacked: {done.stderr[-500:]}")
    return SOURCE


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f"{f[0]}:{f[1]}")
def test_the_format_strings_are_vllm_0_34_s(fmt: tuple[str, int, str], sources: Path) -> None:
    file, number, text = fmt
    source = (sources / file).read_text()
    calls = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and node.lineno == number and node.args
    ]
    assert calls, f"no call at {file}:{number}"
    first = calls[0].args[0]
    assert isinstance(first, ast.Constant) and first.value == text, ast.dump(first)[:300]


# Llama-3.1-8B bf16 on an H100 (79.19 GiB), vLLM 0.34 at 8,192 tokens, from the source's
# arithmetic (measure_kv_cache_bytes, extensible_kv_cache.py:592-618), the figures of
# gatekeeper/estimator/extensible_kv.py's worked example:
TOTAL = round(79.19 * GIB)
PRE_INIT = round(0.53 * GIB)  # CUDA context and the cuBLAS workspace, before the snapshot
WEIGHTS, NON_TORCH, GRAPHS = round(14.99 * GIB), round(0.22 * GIB), round(0.88 * GIB)
ACTIVATION = round(2.37 * GIB)
BLOCK = 64 * 32 * 2 * 8 * 128 * 2  # 64 tokens x 32 layers x K,V x 8 heads x 128 x bf16: 8 MiB
SEGMENT_GRANULE = 2 * MIB


def llama_034_log() -> tuple[list[str], dict[str, int]]:
    init_free = TOTAL - PRE_INIT
    requested = math.ceil(1.0 * TOTAL)  # utils.py:743, the 1.0 cap
    capacity = requested - (WEIGHTS + NON_TORCH + ACTIVATION)  # gpu_worker.py:776-780
    committed = 64 * SEGMENT_GRANULE  # the null block: one granule per layer's K and V
    free = init_free - (WEIGHTS + NON_TORCH + GRAPHS) - committed
    non_kv_used = init_free - free - committed
    headroom = free + committed
    margin = max(1 * GIB, int(ACTIVATION * 0.75))
    available = min(requested - non_kv_used, headroom - margin) - ACTIVATION
    blocks = available // BLOCK
    torch_limit = WEIGHTS + GRAPHS + free - (blocks * BLOCK - committed) - 512 * MIB
    tokens = int(blocks / (8192 // 64) * 8192)
    lines = [
        line(LOADED, format_gib(WEIGHTS), 6.9),
        line(AVAILABLE, format_gib(capacity)),
        WORKER.format(where="gpu_model_runner.py:1216")
        + f"Graph capturing finished in 3 secs, took {GRAPHS / GIB:.2f} GiB",
        line(
            AFTER_WARMUP,
            format_gib(free),
            format_gib(committed),
            format_gib(ACTIVATION),
            format_gib(ACTIVATION),
            format_gib(0),
            blocks,
            format_gib(blocks * BLOCK),
            format_gib(requested),
            format_gib(torch_limit),
        ),
        line(CAPACITY, "GPU", f"{tokens:,}", f"{8192:,}", blocks / 128),
        line(EXTENDED, blocks, blocks * BLOCK / GIB),
    ]
    figures = {
        "capacity": capacity,
        "free": free,
        "blocks": blocks,
        "kv": blocks * BLOCK,
        "tokens": tokens,
        "requested": requested,
    }
    return lines, figures


def test_a_0_34_start_up_with_the_extensible_kv_cache_gives_the_measured_kv_cache():
    lines, f = llama_034_log()
    log = read(lines)
    m = log.memory
    assert m.extensible_kv_cache is True
    assert m.kv_cache == gib_read(f"{f['kv'] / GIB:.2f}")  # "Extended KV cache to": 58.42 GiB
    assert f"{f['kv'] / GIB:.2f}" == "58.42"  # the worked example's figure
    assert m.kv_cache_capacity == gib_read(format_gib(f["capacity"]))  # 61.61 GiB reserved
    assert m.kv_cache_capacity > m.kv_cache
    assert m.kv_cache_blocks == f["blocks"] == 7478
    assert m.kv_cache_tokens == f["tokens"] == 7478 * 64
    assert m.free_after_warmup == gib_read(format_gib(f["free"]))
    assert m.requested_memory == gib_read(format_gib(f["requested"]))
    assert m.transient_reserve == m.transient_peak == gib_read(format_gib(ACTIVATION))
    assert m.torch_reserve_growth == 0
    assert m.components()["kv_cache"] == m.kv_cache  # what the metrics and calibration see
    assert log.phase == "capturing graphs" and log.failure is None


def test_memory_after_warmup_alone_gives_the_blocks_bytes():
    lines, f = llama_034_log()
    m = read(lines[:4]).memory  # up to "Memory after warmup"
    assert m.kv_cache == gib_read(format_gib(f["kv"]))
    assert m.kv_cache_capacity == gib_read(format_gib(f["capacity"]))
    assert m.kv_cache_blocks == f["blocks"]


def test_available_kv_cache_memory_alone_stays_the_kv_figure_until_a_sizing_line():
    # vLLM before 0.34, or 0.34 with the cache off: the one KV line is the cache.
    m = read([line(AVAILABLE, "58.11")]).memory
    assert m.kv_cache == gib_read("58.11") and m.kv_cache_capacity is None
    assert m.extensible_kv_cache is None


def test_remapping_gives_the_blocks_the_budget_fits():
    lines, f = llama_034_log()
    remap = line(REMAPPING, f["blocks"] + 200, f["blocks"])
    m = read([*lines[:4], remap]).memory
    assert m.kv_cache_blocks == f["blocks"]
    m = read([line(AVAILABLE, "61.61"), remap]).memory  # without "Memory after warmup"
    assert m.extensible_kv_cache is True and m.kv_cache is None
    assert m.kv_cache_capacity == gib_read("61.61") and m.kv_cache_blocks == f["blocks"]


def test_disabling_the_extensible_kv_cache_keeps_available_as_the_kv_cache():
    # core.py:313 logs it before determine_available_memory: the profile sizes the cache.
    warning = line(DISABLING, "the model has no KV cache").replace(" INFO ", " WARNING ")
    m = read([warning, line(AVAILABLE, "54.39")]).memory
    assert m.extensible_kv_cache is False
    assert m.kv_cache == gib_read("54.39") and m.kv_cache_capacity is None


def test_0_34_with_the_cache_off_takes_the_graph_estimate_from_the_pool_line():
    # No "Estimated CUDA graph memory" line in 0.34: the summary's "peak activation"
    # holds the estimate (gpu_worker.py:771-773), the pool line says what it was.
    summary = (
        "Free memory on device (78.66/79.19 GiB) on startup. Desired GPU memory utilization "
        "is (0.92, 72.85 GiB). Actual usage is 15.21 GiB for consumed memory (weights + "
        "non-torch), 3.25 GiB for peak activation, and 0.88 GiB for CUDAGraph memory."
    )
    pool = line(GRAPH_POOL, "0.88", "0.85", "0.03", 3.4)
    log = read(
        [line(LOADED, "14.99", 6.9), pool, WORKER.format(where="gpu_worker.py:1175") + summary]
    )
    assert log.memory.cuda_graph_estimate == gib_read("0.85")
    assert log.memory.components()["activation_peak"] == gib_read("3.25") - gib_read("0.85")


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        (  # kv_cache_planning.py:124-131 after warm-up (0.34's wording and hint)
            "ValueError: To serve at least one request with the model's max seq len (131072), "
            "(16.0 GiB KV cache is needed, which is larger than the available KV cache memory "
            "(9.2 GiB). Based on the available memory, the estimated maximum model length is "
            "75328. The extensible KV cache already takes all device memory left after the "
            "model, its activations, CUDA graphs and warmup; decrease `max_model_len` or "
            "`max_num_seqs`, or the model needs a device with more memory.",
            "max_model_len check",
        ),
        (  # kv_cache_planning.py:1436-1439
            "ValueError: Cannot auto-fit max_model_len: not enough GPU memory available to "
            "serve even a single token. CUDA graph capture and warmup left no memory for the "
            "KV cache.",
            "no KV cache memory",
        ),
        (  # v1/worker/utils.py:763-772, weights held outside the process
            "ValueError: Free memory on device cuda:0 (10.0/79.19 GiB) on startup is less than "
            "the engine's budget after excluding external process's weights (0.92, 58.0 GiB).",
            "free-memory check",
        ),
    ],
)
def test_0_34_memory_errors_are_recognised(text: str, kind: str) -> None:
    reason = failure_reason(WORKER.format(where="core.py:1096") + text)
    assert reason is not None and reason.startswith(kind + ": ")
