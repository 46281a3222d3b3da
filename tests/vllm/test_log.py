"""vLLM's start-up log lines, parsed into phases, memory figures and failure reasons."""

from __future__ import annotations

import pytest

from gatekeeper.units import GIB
from gatekeeper.vllm.log import StartupLog, failure_reason

PREFIX = "(EngineCore_DP0 pid=4242) INFO 12-02 10:00:00 [gpu_model_runner.py:2000] "
V019 = [
    "(APIServer pid=4241) INFO 12-02 10:00:00 [api_server.py:1] vLLM API server version 0.19.0",
    PREFIX + "Starting to load model meta-llama/Llama-3.1-8B-Instruct...",
    PREFIX + "Model loading took 14.99 GiB memory and 6.965058 seconds",
    PREFIX
    + "Memory profiling takes 18.33 seconds. Total non KV cache memory: 17.12GiB; torch peak memory "
    "increase: 1.89GiB; non-torch forward increase memory: 0.25GiB; weights memory: 14.99GiB.",
    PREFIX + "Available KV cache memory: 58.11 GiB",
    PREFIX + "GPU KV cache size: 952,032 tokens",
    PREFIX + "Maximum concurrency for 8,192 tokens per request: 116.21x",
    PREFIX + "Graph capturing finished in 3 secs, took 0.91 GiB",
    PREFIX + "init engine (profile, create kv cache, warmup model) took 30.12 s",
    "(APIServer pid=4241) INFO 12-02 10:00:30 [api_server.py:2] Starting vLLM server on http://127.0.0.1:18000",
]


def test_v019_start_up_is_parsed_into_phases_and_figures():
    log = StartupLog()
    phases = []
    for line in V019:
        log = log.feed(line)
        phases.append(log.phase)
    assert phases[1] == "loading weights"
    assert phases[2] == "profiling memory"
    assert phases[5] == "capturing graphs"
    assert log.phase == "starting server"
    m = log.memory
    assert m.weights == round(14.99 * GIB) and m.kv_cache == round(58.11 * GIB)
    assert m.activation_peak == round(1.89 * GIB) and m.non_torch == round(0.25 * GIB)
    assert m.cuda_graph == round(0.91 * GIB) and m.kv_cache_tokens == 952_032
    assert log.failure is None


def test_v033_summary_line_gives_activation_without_the_graph_estimate():
    line = (
        PREFIX
        + "Free memory on device (78.68/79.19 GiB) on startup. Desired GPU memory utilization is "
        "(0.92, 72.85 GiB). Actual usage is 15.24 GiB for consumed memory (weights + non-torch), "
        "2.8 GiB for peak activation, and 0.9 GiB for CUDAGraph memory."
    )
    log = StartupLog().feed(PREFIX + "Estimated CUDA graph memory: 0.85 GiB total").feed(line)
    # vLLM 0.33 folds the CUDA-graph estimate into "peak activation".
    assert log.memory.components()["activation_peak"] == round(2.8 * GIB) - round(0.85 * GIB)
    log = log.feed(PREFIX + "Model loading took 14.99 GiB memory and 6.9 seconds")
    assert log.memory.components()["non_torch"] == round(15.24 * GIB) - round(14.99 * GIB)


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        (
            "ValueError: Free memory on device cuda:0 (12.3/79.19 GiB) on startup is less than desired GPU "
            "memory utilization (0.92, 72.85 GiB). Decrease GPU memory utilization or reduce GPU memory "
            "used by other processes.",
            "free-memory check",
        ),
        (
            "ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV "
            "cache is needed, which is larger than the available KV cache memory (3.81 GiB).",
            "max_model_len check",
        ),
        (
            "The model's max seq len (29000) is larger than the maximum number of tokens that can be "
            "stored in KV cache (23648).",
            "max_model_len check",
        ),
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB.",
            "CUDA out of memory",
        ),
        (
            "ValueError: No available memory for the cache blocks. Try increasing",
            "no KV cache memory",
        ),
        (  # vLLM 0.32's v1/worker/cpu_worker.py, with --kv-cache-memory-bytes
            "ValueError: Available memory on node 0 (1.2/23.54 GiB) on kv cache allocation is "
            "less than requested memory for kv (4.0 GiB). Decrease --kv-cache-memory-bytes, "
            "VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by other processes.",
            "no KV cache memory",
        ),
        (  # the same, without it: --gpu-memory-utilization's share less what the worker holds
            "ValueError: Available memory on node 0 (1.2/23.54 GiB) on kv cache allocation is "
            "less than requested memory for kv (3.5/4.0 GiB). Reduce CPU memory used by other "
            "processes.",
            "no KV cache memory",
        ),
        (
            "ValueError: Available memory on node 0 (1.2/23.54 GiB) on startup is less than "
            "desired CPU memory utilization (0.9, 21.19 GiB). On the CPU backend, the "
            "`--gpu-memory-utilization` flag controls the fraction of CPU memory reserved",
            "free-memory check",
        ),
    ],
)
def test_vllm_memory_errors_are_recognised(line, kind):
    reason = failure_reason(PREFIX + line)
    assert reason is not None and reason.startswith(kind + ": ")
    assert StartupLog().feed(PREFIX + line).failure == reason


def test_ordinary_lines_are_not_failures():
    assert (
        failure_reason(PREFIX + "Avg prompt throughput: 1.0 tokens/s, GPU KV cache usage: 3.0%")
        is None
    )


@pytest.mark.parametrize(
    ("kv_bytes", "total_bytes"), [(256 * 2**20, 25_276_000_000), (GIB, 64 * GIB)]
)
def test_the_cpu_worker_s_explicit_kv_cache_line_gives_the_kv_figure(kv_bytes, total_bytes):
    # vLLM 0.32's v1/worker/cpu_worker.py with --kv-cache-memory-bytes, its format_gib
    # (mem_utils.py: round(b / GiB, 2)) on both figures: "(0.25/23.54)", "(1.0/64.0)".
    def gib_text(b: int) -> str:
        return f"{round(b / GIB, 2)}"

    line = (
        "(EngineCore_DP0 pid=4242) INFO 12-02 10:00:00 [cpu_worker.py:236] "
        f"Explicitly set ({gib_text(kv_bytes)}/{gib_text(total_bytes)}) GiB for KV cache "
        "on node 0."
    )
    log = StartupLog().feed(line)
    assert log.memory.kv_cache == round(round(kv_bytes / GIB, 2) * GIB)
    assert log.memory.components() == {"kv_cache": log.memory.kv_cache}


def test_the_cpu_worker_s_auto_kv_cache_line_gives_the_kv_figure():
    # vLLM 0.32's cpu_worker.py without --kv-cache-memory-bytes (and VLLM_CPU_KVCACHE_SPACE):
    # --gpu-memory-utilization of the node's memory, less what the worker already holds.
    line = (
        "(EngineCore_DP0 pid=4242) INFO 12-02 10:00:00 [cpu_worker.py:260] "
        "Auto set (3.25/23.54) GiB for KV cache on node 0, with 4.0 GiB requested memory for "
        "the worker. 0.75 GiB memory was consumed by non-kv usages."
    )
    log = StartupLog().feed(line)
    assert log.memory.components() == {"kv_cache": round(3.25 * GIB)}
    assert log.failure is None
