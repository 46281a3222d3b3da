"""The vLLM command line a placement launches with, derived from the estimate.

vLLM's ``--gpu-memory-utilization`` is a fraction of the GPU's **total** memory, and its
start-up check compares that fraction with the memory **free** at that moment
(``free >= ceil(u * total)``, after the worker's own CUDA context). So:

- a worker alone on its GPUs gets the whole usable room as a fraction,
  ``u = floor((usable - context - graphs outside the budget) / total, 4 decimals)``;
- a worker that shares GPUs gets a byte budget, ``--kv-cache-memory-bytes`` sized for the
  KV cache it asked for, and the smallest fraction that covers its in-budget memory, so
  the check passes whatever the neighbours hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gatekeeper.estimate.options import ServeOptions

__all__ = ["LaunchFlags", "ceil_fraction", "floor_fraction", "launch_args"]

_SCALE = 10_000  # fractions carry 4 decimals, as the flags print them


def floor_fraction(numerator: int, denominator: int) -> float:
    """``numerator / denominator`` rounded down to 4 decimals."""
    return math.floor(numerator * _SCALE / denominator) / _SCALE


def ceil_fraction(numerator: int, denominator: int) -> float:
    """``numerator / denominator`` rounded up to 4 decimals."""
    return math.ceil(numerator * _SCALE / denominator) / _SCALE


@dataclass(frozen=True, slots=True)
class LaunchFlags:
    """The memory-relevant flags gatekeeper decided."""

    max_model_len: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    gpu_memory_utilization: float
    kv_cache_memory_bytes: int | None
    max_num_seqs: int
    max_num_batched_tokens: int


def launch_args(model: str, flags: LaunchFlags, options: ServeOptions) -> tuple[str, ...]:
    """``vllm serve`` arguments after the command itself (an argument list, never a string)."""
    args = [
        model,
        "--max-model-len",
        str(flags.max_model_len),
        "--tensor-parallel-size",
        str(flags.tensor_parallel_size),
        "--gpu-memory-utilization",
        f"{flags.gpu_memory_utilization:.4f}",
        "--max-num-seqs",
        str(flags.max_num_seqs),
        "--max-num-batched-tokens",
        str(flags.max_num_batched_tokens),
    ]
    if flags.pipeline_parallel_size > 1:
        args += ["--pipeline-parallel-size", str(flags.pipeline_parallel_size)]
    if flags.kv_cache_memory_bytes is not None:
        args += ["--kv-cache-memory-bytes", str(flags.kv_cache_memory_bytes)]
    if options.dtype != "auto":
        args += ["--dtype", options.dtype]
    if options.quantization:
        args += ["--quantization", options.quantization]
    if options.kv_cache_dtype != "auto":
        args += ["--kv-cache-dtype", options.kv_cache_dtype]
    if options.block_size:
        args += ["--block-size", str(options.block_size)]
    if options.enforce_eager:
        args.append("--enforce-eager")
    return tuple(args)
