"""Serving options as ``vllm serve`` takes them, validated against the model.

``ServeOptions`` holds what the operator asked for (None = vLLM's default);
``resolve_*`` helpers turn it into concrete values and raise ``ServeOptionsError``
naming the flag, the value and what to do when something cannot work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gatekeeper.errors import ServeOptionsError
from gatekeeper.models.spec import ModelSpec

__all__ = [
    "KV_DTYPES",
    "KvDtype",
    "ServeOptions",
    "check_parallelism",
    "resolve_dtype",
    "resolve_kv_dtype",
]


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """What a ``vllm serve`` command line asks for; None means vLLM's default."""

    dtype: str = "auto"
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: int | None = None
    enforce_eager: bool = False
    block_size: int | None = None
    vllm_version: str | None = None
    embedded: bool = False
    """The engine runs as vLLM's ``LLM`` class inside a process that already used CUDA (a
    notebook, a trainer) rather than as ``vllm serve``: the LLM class's batch defaults,
    and almost no non-torch growth after vLLM's init snapshot."""

    def __post_init__(self) -> None:
        self._check_types()
        for flag, value in (
            ("max_model_len", self.max_model_len),
            ("max_num_seqs", self.max_num_seqs),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("tensor_parallel_size", self.tensor_parallel_size),
            ("pipeline_parallel_size", self.pipeline_parallel_size),
            ("kv_cache_memory_bytes", self.kv_cache_memory_bytes),
            ("block_size", self.block_size),
        ):
            if value is not None and value <= 0:
                raise ServeOptionsError(
                    f"{flag}: {value} must be a positive integer; omit it to use vLLM's default",
                    field=flag,
                    value=value,
                )
        u = self.gpu_memory_utilization
        if u is not None and not 0 < u <= 1:
            raise ServeOptionsError(
                f"gpu_memory_utilization: {u} must be in (0, 1], a fraction of the GPU's total "
                "memory (vLLM's default is 0.92 since 0.20, 0.9 before)",
                field="gpu_memory_utilization",
                value=u,
            )

    def _check_types(self) -> None:
        """Every field has its type (a JSON door can hand anything in): a float length
        would send the estimator's searches over lengths into an endless loop."""
        for name, kind in _FIELD_TYPES.items():
            value = getattr(self, name)
            if value is None and name in _OPTIONAL:
                continue
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
                object.__setattr__(self, name, value)
            ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
            if kind is float and ok:
                ok = math.isfinite(value)
            if not ok:
                raise ServeOptionsError(
                    f"{name}: {value!r} is not a valid {_KIND_NAMES[kind]}; "
                    "omit it to use vLLM's default",
                    field=name,
                    value=value if isinstance(value, str | int | float | bool) else repr(value),
                )


_FIELD_TYPES: dict[str, type] = {
    "dtype": str,
    "quantization": str,
    "kv_cache_dtype": str,
    "max_model_len": int,
    "max_num_seqs": int,
    "max_num_batched_tokens": int,
    "tensor_parallel_size": int,
    "pipeline_parallel_size": int,
    "gpu_memory_utilization": float,
    "kv_cache_memory_bytes": int,
    "enforce_eager": bool,
    "block_size": int,
    "vllm_version": str,
    "embedded": bool,
}
_OPTIONAL = frozenset(
    {"quantization", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
     "gpu_memory_utilization", "kv_cache_memory_bytes", "block_size", "vllm_version"}
)  # fmt: skip
_KIND_NAMES = {str: "string", int: "whole number", float: "finite number", bool: "true/false"}


@dataclass(frozen=True, slots=True)
class KvDtype:
    name: str
    numerator: int
    denominator: int = 1
    per_head_extra_bytes: int = 0


KV_DTYPES: dict[str, KvDtype] = {
    "bfloat16": KvDtype("bfloat16", 2),
    "float16": KvDtype("float16", 2),
    "float32": KvDtype("float32", 4),
    "fp8": KvDtype("fp8", 1),
    "fp8_e4m3": KvDtype("fp8_e4m3", 1),
    "fp8_e5m2": KvDtype("fp8_e5m2", 1),
    "fp8_ds_mla": KvDtype("fp8_ds_mla", 1),
    "fp8_per_token_head": KvDtype("fp8_per_token_head", 1, 1, 8),
    "int8_per_token_head": KvDtype("int8_per_token_head", 1, 1, 8),
    "nvfp4": KvDtype("nvfp4", 9, 16),
}

_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "half": "float16",
           "fp16": "float16", "float32": "float32", "float": "float32", "fp32": "float32"}  # fmt: skip


def resolve_dtype(flag: str, spec: ModelSpec, *, v1: bool) -> str:
    """``--dtype``: auto keeps the checkpoint dtype, except fp32 checkpoints are served in
    bf16 (fp16 on the V0 engine)."""
    if flag == "auto":
        if spec.torch_dtype == "float32":
            return "bfloat16" if v1 else "float16"
        return spec.torch_dtype
    dtype = _DTYPES.get(flag.lower())
    if dtype is None:
        raise ServeOptionsError(
            f"dtype: {flag!r} is not a vLLM dtype; use auto, bfloat16, float16 or float32",
            field="dtype",
            value=flag,
        )
    return dtype


def resolve_kv_dtype(flag: str, model_dtype: str, spec: ModelSpec) -> KvDtype:
    """``--kv-cache-dtype``: auto stores KV in the model dtype."""
    name = model_dtype if flag == "auto" else flag.lower()
    kv = KV_DTYPES.get(name)
    if kv is None:
        raise ServeOptionsError(
            f"kv_cache_dtype: {flag!r} is not a KV cache dtype gatekeeper can size; use auto, "
            + ", ".join(sorted(KV_DTYPES)),
            field="kv_cache_dtype",
            value=flag,
        )
    if kv.name == "fp8_ds_mla" and spec.mla is None:
        raise ServeOptionsError(
            f"kv_cache_dtype: fp8_ds_mla is for MLA models (DeepSeek V3); {spec.name} has none. Use fp8",
            field="kv_cache_dtype",
            value=flag,
        )
    return kv


def check_parallelism(spec: ModelSpec, tp: int, pp: int) -> None:
    """vLLM's own checks: TP divides the attention heads, KV heads split or replicate
    evenly, and PP has at least one layer per stage."""
    heads = spec.num_attention_heads
    if heads % tp:
        divisors = [d for d in (1, 2, 4, 8, 16, 32, 64) if heads % d == 0]
        raise ServeOptionsError(
            f"tensor_parallel_size: {tp} does not divide {spec.name}'s {heads} attention heads; "
            f"use one of {', '.join(map(str, divisors))}",
            field="tensor_parallel_size",
            value=tp,
        )
    kv = spec.num_kv_heads
    if spec.mla is None and ((kv >= tp and kv % tp) or (kv < tp and tp % kv)):
        raise ServeOptionsError(
            f"tensor_parallel_size: {tp} cannot split {spec.name}'s {kv} KV heads evenly; "
            "use a TP size that divides them or is a multiple of them",
            field="tensor_parallel_size",
            value=tp,
        )
    if pp > spec.num_layers:
        raise ServeOptionsError(
            f"pipeline_parallel_size: {pp} exceeds {spec.name}'s {spec.num_layers} layers; "
            f"use at most {spec.num_layers}",
            field="pipeline_parallel_size",
            value=pp,
        )
