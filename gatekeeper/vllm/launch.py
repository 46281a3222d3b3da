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
    return tuple(args + _feature_args(options))


def _feature_args(o: ServeOptions) -> list[str]:
    """The modelled flags beyond the basic shape, as the operator gave them (JSON values
    in canonical form, one argument each)."""
    args: list[str] = []
    switches = ("enable_lora", "fully_sharded_loras", "enable_expert_parallel",
                "skip_mm_profiling", "enable_sleep_mode")  # fmt: skip
    for name in switches:
        if getattr(o, name):
            args.append("--" + name.replace("_", "-"))
    valued: list[tuple[str, object, object]] = [
        ("max_loras", o.max_loras, None),
        ("max_lora_rank", o.max_lora_rank, None),
        ("lora_dtype", o.lora_dtype, "auto"),
        ("max_cpu_loras", o.max_cpu_loras, None),
        ("speculative_config", o.speculative_config, None),
        ("cpu_offload_gb", o.cpu_offload_gb, 0.0),
        ("data_parallel_size", o.data_parallel_size, 1),
        ("decode_context_parallel_size", o.decode_context_parallel_size, 1),
        ("limit_mm_per_prompt", o.limit_mm_per_prompt, None),
        ("mm_encoder_tp_mode", o.mm_encoder_tp_mode, "weights"),
        ("num_gpu_blocks_override", o.num_gpu_blocks_override, None),
        ("max_cudagraph_capture_size", o.max_cudagraph_capture_size, None),
        ("compilation_config", o.compilation_config, None),
        ("optimization_level", o.optimization_level, None),
        ("runner", o.runner, "auto"),
        ("convert", o.convert, "auto"),
        ("performance_mode", o.performance_mode, "balanced"),
        ("mamba_cache_dtype", o.mamba_cache_dtype, "auto"),
        ("revision", o.revision, None),
        ("hf_overrides", o.hf_overrides, None),
        ("download_dir", o.download_dir, None),
        ("tokenizer", o.tokenizer, None),
        ("mamba_ssm_cache_dtype", o.mamba_ssm_cache_dtype, "auto"),
    ]
    for name, value, default in valued:
        if value != default:
            text = getattr(value, "text", value)  # a JSON-valued flag: its JSON as given
            args += ["--" + name.replace("_", "-"), str(text)]
    if o.enable_prefix_caching is not None:
        args.append(
            "--enable-prefix-caching" if o.enable_prefix_caching else "--no-enable-prefix-caching"
        )
    if o.cudagraph_capture_sizes:
        args += ["--cudagraph-capture-sizes", *map(str, o.cudagraph_capture_sizes)]
    return args
