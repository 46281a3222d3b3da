"""The vLLM command line a placement launches with, derived from the estimate.

vLLM's ``--gpu-memory-utilization`` is a fraction of the GPU's **total** memory, and its
start-up check compares that fraction with the memory **free** at that moment
(``free >= ceil(u * total)``, after the worker's own CUDA context). So:

- a worker alone on its GPUs gets the whole usable room as a fraction,
  ``u = floor((usable - context - graphs outside the budget) / total, 4 decimals)``;
- a worker that shares GPUs gets a byte budget, ``--kv-cache-memory-bytes`` sized for the
  KV cache it asked for, and the smallest fraction that covers its in-budget memory, so
  the check passes whatever the neighbours hold.

The release decides what "a fraction" and "a byte budget" can be (``release_budget``):
``--kv-cache-memory-bytes`` exists from vLLM 0.10.2 (its flag table says so), and the V1
engines before 0.9.1 size the KV cache as ``u x total`` less everything the GPU holds,
other processes included (0.8.5 ``v1/worker/gpu_worker.py::determine_available_memory``:
``peak_memory += total - free - torch_allocated``), where 0.9.1 on (and V0's
``worker/worker.py::determine_num_available_blocks``) take ``u x total`` as this
worker's own budget (``requested_memory = total x u``, checked against free memory at
start-up, less what the worker itself consumed since its init snapshot). Every flag
``launch_args`` writes is checked against the release's table (``check_launch_args``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gatekeeper.estimator.accounting import accounting_for, parse_vllm_version
from gatekeeper.estimator.options import ServeOptions
from gatekeeper.vllm.table import flag_table

__all__ = [
    "KV_BUDGET_FLAG",
    "LaunchFlags",
    "ReleaseBudget",
    "ceil_fraction",
    "check_launch_args",
    "floor_fraction",
    "launch_args",
    "release_budget",
]

KV_BUDGET_FLAG = "--kv-cache-memory-bytes"
WHOLE_DEVICE_BEFORE = (0, 9, 1)
"""The first V1 release whose budget is the worker's own (``requested_memory`` in
``v1/worker/gpu_worker.py::init_device``); 0.9.0.1's worker still adds every process's
memory to its profile's peak."""

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


@dataclass(frozen=True, slots=True)
class ReleaseBudget:
    """How one vLLM release takes a worker's memory budget."""

    release: str
    byte_budget: bool
    """The release has ``--kv-cache-memory-bytes`` (vLLM 0.10.2 and later)."""
    whole_device: bool
    """``--gpu-memory-utilization`` x total budgets everything on the GPU, other
    processes and the worker's own CUDA context included (V1 before 0.9.1): the worker's
    KV cache is what its neighbours leave at the moment it profiles."""


def release_budget(release: str) -> ReleaseBudget:
    """The budget rules of ``release`` (a version as the estimator reads it: ``0.8.5``,
    ``0.8.5 V0``); the V0 engine's budget is always the worker's own."""
    version, _ = parse_vllm_version(release)
    v1 = accounting_for(release).engine == "v1"
    return ReleaseBudget(
        release=release,
        byte_budget=KV_BUDGET_FLAG in flag_table(release).by_option,
        whole_device=v1 and version < WHOLE_DEVICE_BEFORE,
    )


def check_launch_args(args: tuple[str, ...], release: str) -> None:
    """Raise ``ServeOptionsError`` when ``args`` name a flag that vLLM ``release`` does not
    have (the error names the release and the one that brought the flag)."""
    table = flag_table(release)
    for arg in args[1:]:
        if arg.startswith("--") and arg not in table.by_option:
            raise table.unknown(arg, f"the command line placement derived for vLLM {release}")


def launch_args(
    model: str, flags: LaunchFlags, options: ServeOptions, release: str | None = None
) -> tuple[str, ...]:
    """``vllm serve`` arguments after the command itself (an argument list, never a
    string), checked against the flags of ``release`` (else the options' own
    ``vllm_version``, else the newest table): ``ServeOptionsError`` names a flag the
    release lacks."""
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
    out = tuple(args + _feature_args(options))
    chosen = release or options.vllm_version
    check_launch_args(out, chosen or str(flag_table().vllm))
    return out


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
        ("kv_offloading_size", o.kv_offloading_size, None),
        ("swap_space", o.swap_space, None),
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
    if o.enable_extensible_kv_cache is not None:  # vLLM 0.34's BooleanOptionalAction
        on = o.enable_extensible_kv_cache
        args.append("--enable-extensible-kv-cache" if on else "--no-enable-extensible-kv-cache")
    if o.cudagraph_capture_sizes:
        args += ["--cudagraph-capture-sizes", *map(str, o.cudagraph_capture_sizes)]
    return args
