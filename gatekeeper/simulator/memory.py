"""The simulator's memory figures and vLLM's start-up error texts.

Part of the gatekeeper simulator (``gatekeeper.simulator``), a stand-in for ``vllm
serve`` in rehearsals and tests. ``plan_memory`` turns the flags and the
``GATEKEEPER_SIM_*`` sizes into the per-GPU figures the start-up log reports (the
split is made up, but the lines agree with each other as vLLM's do; a vLLM 0.34 worker's
extensible KV cache is ``extensible``'s); the ``*_failure`` functions build vLLM 0.33's
error for each start-up failure
(``free-memory``, ``max-model-len``, ``oom-load``, ``oom-sampler``) with numbers taken
from the plan. vLLM formats GiB with ``round(x, 2)``, so ``12.3``, not ``12.30``.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from gatekeeper.units import GIB, MIB, cdiv

__all__ = [
    "KvCapacity",
    "MemoryPlan",
    "StartupFailure",
    "free_memory_failure",
    "kv_capacity",
    "max_model_len_failure",
    "oom_load_failure",
    "oom_sampler_failure",
    "plan_memory",
]

DEFAULT_TOTAL_BYTES = 80 * GIB
KV_FLAG_EXTRA_BYTES = 2 * GIB
"""With ``--kv-cache-memory-bytes``, the default actual bytes are the KV cache plus this."""
KV_BYTES_PER_TOKEN = 128 * 1024
"""Llama-3-8B in bf16 (32 layers x 8 KV heads x 128 x 2 x 2 bytes), split over TP x PP."""
SUGGESTION_BUFFER_BYTES = 150 * MIB
DOCS = "https://docs.vllm.ai/en/latest/configuration/conserving_memory/"
SHARES = {"weights": 0.40, "non_torch": 0.02, "activation": 0.03, "cuda_graph": 0.01}
SHARES_WITH_KV_FLAG = {"weights": 0.70, "non_torch": 0.10, "activation": 0.15, "cuda_graph": 0.05}


class _Env(Protocol):
    """What the plan reads from ``SimEnv``."""

    @property
    def gpu_total_bytes(self) -> int | None: ...
    @property
    def actual_bytes(self) -> int | None: ...
    @property
    def components(self) -> tuple[tuple[str, int], ...]: ...


def fmt(num_bytes: float) -> str:
    """vLLM's ``format_gib``: GiB rounded to 2 decimals, shortest form."""
    return str(round(num_bytes / GIB, 2))


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Per-GPU figures, in bytes, as the log reports them."""

    total_bytes: int
    free_bytes: int
    utilization: float
    requested_bytes: int
    actual_bytes: int
    weights_bytes: int
    non_torch_bytes: int
    activation_bytes: int
    cuda_graph_bytes: int
    kv_bytes: int
    capacity_bytes: int | None = None
    """vLLM 0.34's extensible KV cache: the reservation "Available KV cache memory" shows
    (``kv_bytes`` is then the cache as sized after warm-up; ``extensible``)."""

    def gib(self, component: str) -> str:
        return fmt(int(getattr(self, f"{component}_bytes")))

    def summary_line(self) -> str:
        """gpu_worker.py's breakdown after start-up (not logged with a KV byte budget):
        "peak activation" holds the CUDA-graph estimate (the graphs' bytes here; none with
        0.34's extensible KV cache, whose "current kv cache memory" is the reservation)."""
        consumed = self.weights_bytes + self.non_torch_bytes
        estimate = 0 if self.capacity_bytes is not None else self.cuda_graph_bytes
        peak = self.activation_bytes + estimate
        non_kv = consumed + peak + self.cuda_graph_bytes + SUGGESTION_BUFFER_BYTES
        kv = self.kv_bytes if self.capacity_bytes is None else self.capacity_bytes
        fit, full = self.requested_bytes - non_kv, self.free_bytes - non_kv
        return (
            f"Free memory on device ({fmt(self.free_bytes)}/{fmt(self.total_bytes)} GiB) on "
            f"startup. Desired GPU memory utilization is ({self.utilization}, "
            f"{fmt(self.requested_bytes)} GiB). Actual usage is {fmt(consumed)} GiB for "
            f"consumed memory (weights + non-torch), {fmt(peak)} GiB for peak activation, and "
            f"{fmt(self.cuda_graph_bytes)} GiB for CUDAGraph memory. Replace "
            f"gpu_memory_utilization config with `--kv-cache-memory={fit}` ({fmt(fit)} GiB) to "
            f"fit into requested memory, or `--kv-cache-memory={full}` ({fmt(full)} GiB) to "
            f"fully utilize gpu memory. Current kv cache memory in use is {fmt(kv)} GiB."
        )

    def kv_bytes_line(self) -> str:
        """gpu_worker.py's line when ``--kv-cache-memory-bytes`` skips profiling."""
        return (
            f"Initial free memory {fmt(self.free_bytes)} GiB, reserved {fmt(self.kv_bytes)} GiB "
            "memory for KV Cache as specified by kv_cache_memory_bytes config and skipped "
            "memory profiling. This does not respect the gpu_memory_utilization config. Only "
            "use kv_cache_memory_bytes config when you want manual control of KV cache memory "
            "size. If OOM'ed, check the difference of initial free memory between the current "
            "run and the previous run where kv_cache_memory_bytes is suggested and update it "
            "correspondingly."
        )

    def cache_config(self, args: argparse.Namespace, capacity: KvCapacity) -> dict[str, str]:
        """Labels of ``vllm:cache_config_info``."""
        return {
            "block_size": str(capacity.block_size),
            "cache_dtype": str(args.kv_cache_dtype),
            "enable_prefix_caching": str(args.enable_prefix_caching is not False),
            "gpu_memory_utilization": str(self.utilization),
            "kv_cache_memory_bytes": str(args.kv_cache_memory_bytes),
            "num_gpu_blocks": str(capacity.num_blocks),
            "kv_cache_size_tokens": str(capacity.tokens),
            "kv_cache_max_concurrency": f"{capacity.concurrency:.2f}",
        }


def plan_memory(
    env: _Env,
    args: argparse.Namespace,
    total_bytes: int | None = None,
    free_bytes: int | None = None,
    default_utilization: float = 0.92,
) -> MemoryPlan:
    """The figures for one GPU of ``total_bytes`` (visible) with ``free_bytes`` free;
    ``default_utilization`` where ``--gpu-memory-utilization`` is None (vLLM 0.34's
    default with the KV cache sized by the profile)."""
    total = env.gpu_total_bytes or total_bytes or DEFAULT_TOTAL_BYTES
    given_u = args.gpu_memory_utilization
    u = float(default_utilization if given_u is None else given_u)
    kv_flag: int | None = args.kv_cache_memory_bytes
    actual = env.actual_bytes
    if actual is None:
        actual = kv_flag + KV_FLAG_EXTRA_BYTES if kv_flag is not None else math.floor(u * total)
    given = dict(env.components)
    base = actual if kv_flag is None else max(actual - kv_flag, 0)
    shares = dict(SHARES if kv_flag is None else SHARES_WITH_KV_FLAG)
    if args.enforce_eager:
        shares["weights"] += shares.pop("cuda_graph")
    parts = {name: given.get(name, int(base * share)) for name, share in shares.items()}
    parts["cuda_graph"] = 0 if args.enforce_eager else parts.get("cuda_graph", 0)
    kv = kv_flag if kv_flag is not None else given.get("kv", actual - sum(parts.values()))
    return MemoryPlan(
        total_bytes=total,
        free_bytes=total if free_bytes is None else free_bytes,
        utilization=u,
        requested_bytes=math.ceil(u * total),
        actual_bytes=actual,
        weights_bytes=parts["weights"],
        non_torch_bytes=parts["non_torch"],
        activation_bytes=parts["activation"],
        cuda_graph_bytes=parts["cuda_graph"],
        kv_bytes=kv,
    )


@dataclass(frozen=True, slots=True)
class KvCapacity:
    """Blocks and tokens the KV cache holds (``kv_cache_utils.py``)."""

    block_size: int
    block_bytes: int
    num_blocks: int
    blocks_per_request: int
    concurrency: float
    tokens: int
    fits: bool

    def line(self, max_model_len: int) -> str:
        return (
            f"GPU KV cache size: {self.tokens:,} tokens, Maximum concurrency for "
            f"{max_model_len:,} tokens per request: {self.concurrency:.2f}x"
        )


def kv_capacity(
    plan: MemoryPlan,
    max_model_len: int,
    args: argparse.Namespace,
    bytes_per_token: int | None,
    default_block_size: int = 16,
) -> KvCapacity:
    """vLLM's capacity numbers; ``fits`` is its check when ``bytes_per_token`` is given.
    ``default_block_size``: where ``--block-size`` is not given (64 from vLLM 0.34)."""
    world = args.tensor_parallel_size * args.pipeline_parallel_size
    per_token = bytes_per_token or cdiv(KV_BYTES_PER_TOKEN, world)
    block_size = args.block_size or default_block_size
    block_bytes = block_size * per_token
    num_blocks = max(plan.kv_bytes, 0) // block_bytes
    per_request = cdiv(max_model_len, block_size)
    concurrency = num_blocks / per_request
    fits = plan.kv_bytes > 0 and (bytes_per_token is None or num_blocks - 1 >= per_request)
    return KvCapacity(
        block_size=block_size,
        block_bytes=block_bytes,
        num_blocks=num_blocks,
        blocks_per_request=per_request,
        concurrency=concurrency,
        tokens=int(concurrency * max_model_len),
        fits=fits,
    )


class StartupFailure(Exception):
    """A start-up failure, printed as vLLM prints it: the engine core's traceback in
    the log, then the API server's ``RuntimeError`` on stderr."""

    def __init__(
        self, exception: str, cause: str | None = None, error_line: str | None = None
    ) -> None:
        super().__init__(exception)
        self.exception, self.cause, self.error_line = exception, cause, error_line

    def print(self, log: Callable[..., Any]) -> None:
        frame = '  File "<gatekeeper simulator>", line 1, in <simulated vLLM engine start-up>'
        if self.error_line:
            log("EngineCore", "gpu_model_runner.py:2871", self.error_line, "ERROR")
        lines = ["EngineCore failed to start.", "Traceback (most recent call last):", frame]
        if self.cause:
            direct = "The above exception was the direct cause of the following exception:"
            lines += [self.cause, "", direct, "", "Traceback (most recent call last):", frame]
        log("EngineCore", "core.py:1096", "\n".join([*lines, self.exception]), "ERROR")
        print(
            "Traceback (most recent call last):\n"
            '  File "<gatekeeper simulator>", line 1, in <simulated vllm serve>\n'
            "RuntimeError: Engine core initialization failed. See root cause above. "
            "Failed core proc(s): {'EngineCore': 1}",
            file=sys.stderr,
            flush=True,
        )


def free_memory_failure(plan: MemoryPlan, rank: int, forced: bool = False) -> StartupFailure:
    """``request_memory``'s check in ``v1/worker/utils.py`` (before weights load)."""
    free = min(plan.free_bytes, int(plan.requested_bytes * 0.6)) if forced else plan.free_bytes
    return StartupFailure(
        f"ValueError: Free memory on device cuda:{rank} ({fmt(free)}/{fmt(plan.total_bytes)} "
        f"GiB) on startup is less than desired GPU memory utilization ({plan.utilization}, "
        f"{fmt(plan.requested_bytes)} GiB). Decrease GPU memory utilization or reduce GPU "
        "memory used by other processes."
    )


def _torch_oom(tried: int, total: int, free: int, in_use: int) -> str:
    """PyTorch's out-of-memory message (it formats with 2 decimals, unlike vLLM)."""
    allocated = max(in_use - GIB // 2, 0)
    return (
        f"CUDA out of memory. Tried to allocate {tried / GIB:.2f} GiB. GPU 0 has a total "
        f"capacity of {total / GIB:.2f} GiB of which {free / MIB:.2f} MiB is free. Including "
        f"non-PyTorch memory, this process has {in_use / GIB:.2f} GiB memory in use. Of the "
        f"allocated memory {allocated / GIB:.2f} GiB is allocated by PyTorch, and 20.00 MiB is "
        "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
        "setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


def oom_load_failure(plan: MemoryPlan, args: argparse.Namespace) -> StartupFailure:
    """CUDA out of memory while loading the weights (``gpu_model_runner.load_model``)."""
    tried = max(plan.weights_bytes // 20, 256 * MIB)
    free = max(min(plan.free_bytes, tried) // 3, 0)
    in_use = max(plan.free_bytes - free, 0)
    torch_text = _torch_oom(tried, plan.total_bytes, free, in_use)
    return StartupFailure(
        f"torch.OutOfMemoryError: {torch_text}",
        error_line=(
            "Failed to load model - not enough GPU memory. Try lowering "
            "--gpu-memory-utilization to free memory for weights, increasing "
            f"--tensor-parallel-size, or using --quantization. See {DOCS} for more tips. "
            f"(original error: {torch_text})"
        ),
    )


def oom_sampler_failure(args: argparse.Namespace) -> StartupFailure:
    """CUDA out of memory in the sampler warm-up (``gpu_worker.compile_or_warm_up_model``)."""
    requests = args.max_num_seqs or 256
    torch_text = _torch_oom(2 * GIB, DEFAULT_TOTAL_BYTES, 310 * MIB, 77 * GIB)
    return StartupFailure(
        f"RuntimeError: CUDA out of memory occurred when warming up sampler with {requests} "
        "dummy requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization` when "
        "initializing the engine.",
        cause=f"torch.OutOfMemoryError: {torch_text}",
    )


def max_model_len_failure(
    plan: MemoryPlan, max_model_len: int, capacity: KvCapacity
) -> StartupFailure:
    """``_check_enough_kv_cache_memory`` in ``v1/core/kv_cache_planning.py``."""
    available = plan.kv_bytes
    if available <= 0:
        return StartupFailure(
            "ValueError: No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine (this flag also controls "
            f"CPU memory reservation on the CPU backend, despite its name). See {DOCS} for "
            "more details."
        )
    block = capacity.block_bytes
    if block * (capacity.blocks_per_request + 1) <= available:  # forced: a bigger model
        block = cdiv(available * 3 // 2, capacity.blocks_per_request)
    needed = block * capacity.blocks_per_request
    estimate = min(max((available - block) // block, 0) * capacity.block_size, max_model_len - 1)
    based = (
        f"Based on the available memory, the estimated maximum model length is {estimate}. "
        if estimate > 0
        else ""
    )
    return StartupFailure(
        "ValueError: To serve at least one request with the model's max seq len "
        f"({max_model_len}), ({fmt(needed)} GiB KV cache is needed, which is larger than the "
        f"available KV cache memory ({fmt(available)} GiB). {based}Try increasing "
        "`gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or "
        f"decreasing `max_model_len` when initializing the engine. See {DOCS} for more details."
    )
