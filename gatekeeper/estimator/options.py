"""Serving options as ``vllm serve`` takes them, validated against the model.

``ServeOptions`` holds what the operator asked for (None = vLLM's default);
``resolve_*`` helpers turn it into concrete values and raise ``ServeOptionsError``
naming the flag, the value and what to do when something cannot work.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gatekeeper.errors import ServeOptionsError
from gatekeeper.estimator.speculative import Speculative
from gatekeeper.models.module_names import mla_attention, supports_pp
from gatekeeper.models.spec import ModelSpec

__all__ = [
    "CUDAGRAPH_MODES",
    "KV_DTYPES",
    "CompilationOptions",
    "HfOverrides",
    "KvDtype",
    "MmLimits",
    "ServeOptions",
    "check_parallelism",
    "draft_reference",
    "latent_kv_cache",
    "resolve_kv_dtype",
]


@dataclass(frozen=True, slots=True)
class HfOverrides:
    """``--hf-overrides``: fields laid over the model's config before it is read (vLLM's
    ``ModelConfig._apply_dict_overrides``); the model look-up applies them."""

    text: str
    """The flag's JSON as given (canonical), written back at launch and read by the look-up."""

    @classmethod
    def from_mapping(cls, data: Mapping[str, object], text: str) -> HfOverrides:
        return cls(text)


@dataclass(frozen=True, slots=True)
class MmLimits:
    """``--limit-mm-per-prompt``: items per prompt by modality (``{"image": 2}``, or
    vLLM's richer ``{"image": {"count": 2, ...}}``)."""

    text: str
    """The flag's JSON as given (canonical), written back at launch."""
    counts: tuple[tuple[str, int], ...]

    @classmethod
    def from_mapping(cls, data: Mapping[str, object], text: str) -> MmLimits:
        counts = []
        for modality, value in data.items():
            count = value.get("count") if isinstance(value, dict) else value
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise ServeOptionsError(
                    f"limit_mm_per_prompt: {modality} = {value!r} is not a count; give a whole "
                    'number of items per prompt, such as {"image": 2}',
                    field="limit_mm_per_prompt",
                    value=text,
                )
            counts.append((str(modality), count))
        return cls(text, tuple(sorted(counts)))  # canonical, as the text is

    def get(self, modality: str) -> int | None:
        return dict(self.counts).get(modality)


CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


@dataclass(frozen=True, slots=True)
class CompilationOptions:
    """What ``--compilation-config`` sets that changes memory; the rest passes through to
    vLLM untouched (``text``)."""

    text: str
    cudagraph_mode: str | None = None
    capture_sizes: tuple[int, ...] | None = None
    max_capture_size: int | None = None

    @classmethod
    def from_mapping(cls, data: Mapping[str, object], text: str) -> CompilationOptions:
        def bad(advice: str) -> ServeOptionsError:
            return ServeOptionsError(
                f"compilation_config: {advice}", field="compilation_config", value=text
            )

        mode = data.get("cudagraph_mode")
        if mode is not None and (not isinstance(mode, str) or mode.upper() not in CUDAGRAPH_MODES):
            raise bad(f"cudagraph_mode {mode!r} is not one of {', '.join(CUDAGRAPH_MODES)}")
        sizes = data.get("cudagraph_capture_sizes")
        if sizes is not None:
            if not isinstance(sizes, list):
                raise bad("cudagraph_capture_sizes must be a list of token counts")
            sizes = [_whole(x) for x in sizes]  # vLLM's pydantic config reads "8" as 8
            if not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in sizes):
                raise bad("cudagraph_capture_sizes must be positive whole numbers")
        top = _whole(data.get("max_cudagraph_capture_size"))
        if top is not None and not (isinstance(top, int) and not isinstance(top, bool) and top > 0):
            raise bad("max_cudagraph_capture_size must be a positive whole number")
        return cls(
            text,
            mode.upper() if isinstance(mode, str) else None,
            tuple(x for x in sizes if isinstance(x, int)) if sizes is not None else None,
            top if isinstance(top, int) else None,
        )


def _whole(value: object) -> object:
    """``"8"`` as 8 (pydantic's lax integers); anything else unchanged."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return value


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
    enable_lora: bool = False
    max_loras: int | None = None
    """LoRA slots on the GPU (vLLM's default 1)."""
    max_lora_rank: int | None = None
    """The rank every slot is sized for (vLLM's default 16)."""
    fully_sharded_loras: bool = False
    lora_dtype: str = "auto"
    max_cpu_loras: int | None = None
    """Adapters cached in host memory: no GPU bytes."""
    speculative_config: Speculative | None = None
    """vLLM's ``--speculative-config``, read (``gatekeeper.estimator.speculative``)."""
    cpu_offload_gb: float = 0.0
    """GiB (2^30 bytes) of each GPU's decoder-layer weights kept in host memory (UVA)."""
    kv_offloading_size: float | None = None
    """GiB of host memory for vLLM's KV offloading buffer, summed across the TP ranks
    (``CacheConfig.kv_offloading_size``); host memory only (``estimator.host``)."""
    swap_space: float | None = None
    """V0's CPU swap space, GiB per GPU (vLLM's default 4; the flag is gone from 0.18);
    host memory only, and only the V0 engine allocates it (``estimator.host``)."""
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    decode_context_parallel_size: int = 1
    limit_mm_per_prompt: MmLimits | None = None
    skip_mm_profiling: bool = False
    mm_encoder_tp_mode: str = "weights"
    num_gpu_blocks_override: int | None = None
    cudagraph_capture_sizes: tuple[int, ...] | None = None
    max_cudagraph_capture_size: int | None = None
    compilation_config: CompilationOptions | None = None
    optimization_level: str | None = None
    """``-O0`` .. ``-O3`` (vLLM's default 2): 0 captures no CUDA graphs."""
    runner: str = "auto"
    convert: str = "auto"
    enable_sleep_mode: bool = False
    mamba_cache_dtype: str = "auto"
    """The recurrent state's conv (and, on auto, SSM) dtype; auto: the model dtype."""
    mamba_ssm_cache_dtype: str = "auto"
    enable_prefix_caching: bool | None = None
    """vLLM's default: on, except for attention-free models; for hybrid models it keeps a
    second, block-aligned copy of each state (``mamba_cache_mode`` align)."""
    hf_overrides: HfOverrides | None = None
    revision: str | None = None
    """Where the model comes from (``--revision``, ``--download-dir``, ``--tokenizer``):
    no memory of their own; the look-up uses them and the worker is launched with them."""
    download_dir: str | None = None
    tokenizer: str | None = None
    performance_mode: str = "balanced"
    """``throughput`` doubles the batch defaults; ``interactivity`` captures finer CUDA
    graphs below 32 tokens (same largest size, so the same pool)."""
    enable_extensible_kv_cache: bool | None = None
    """vLLM 0.34's extensible KV cache (``--[no-]enable-extensible-kv-cache``): None, vLLM's
    default (on where ``--kv-cache-memory-bytes`` and ``--num-gpu-blocks-override`` are not
    given); False sizes the KV cache from the profile as before 0.34."""

    def __post_init__(self) -> None:
        self._check_types()
        for flag, value in (
            ("max_loras", self.max_loras),
            ("max_lora_rank", self.max_lora_rank),
            ("max_cpu_loras", self.max_cpu_loras),
            ("data_parallel_size", self.data_parallel_size),
            ("decode_context_parallel_size", self.decode_context_parallel_size),
            ("num_gpu_blocks_override", self.num_gpu_blocks_override),
            ("max_cudagraph_capture_size", self.max_cudagraph_capture_size),
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
        _check_block_size(self.block_size)
        u = self.gpu_memory_utilization
        if u is not None and not 0 < u <= 1:
            raise ServeOptionsError(
                f"gpu_memory_utilization: {u} must be in (0, 1], a fraction of the GPU's total "
                "memory (vLLM's default is 0.92 since 0.20, 0.9 before)",
                field="gpu_memory_utilization",
                value=u,
            )
        for flag, size in (("kv_offloading_size", self.kv_offloading_size),
                           ("swap_space", self.swap_space)):  # fmt: skip
            if size is not None and (size < 0 or (flag == "kv_offloading_size" and size == 0)):
                raise ServeOptionsError(
                    f"{flag}: {size} must be more than 0 GiB; omit it for none",
                    field=flag,
                    value=size,
                )
        if self.cpu_offload_gb < 0:
            raise ServeOptionsError(
                f"cpu_offload_gb: {self.cpu_offload_gb} must be 0 or more GiB per GPU",
                field="cpu_offload_gb",
                value=self.cpu_offload_gb,
            )
        sizes, top = self.cudagraph_capture_sizes, self.max_cudagraph_capture_size
        if sizes and top is not None and top != max(sizes):
            raise ServeOptionsError(
                f"max_cudagraph_capture_size: {top} must equal the largest of "
                f"cudagraph_capture_sizes ({max(sizes)}), as vLLM requires; give one of them",
                field="max_cudagraph_capture_size",
                value=top,
            )
        for size in self.cudagraph_capture_sizes or ():
            if size <= 0:
                raise ServeOptionsError(
                    f"cudagraph_capture_sizes: {size} must be a positive number of tokens",
                    field="cudagraph_capture_sizes",
                    value=size,
                )

    def _check_types(self) -> None:
        """Every field has its type (a JSON door can hand anything in): a float length
        would send the estimator's searches over lengths into an endless loop."""
        for name, kind in _FIELD_TYPES.items():
            value = getattr(self, name)
            if value is None and name in _OPTIONAL:
                continue
            if kind is tuple:
                if not isinstance(value, tuple) or not all(
                    isinstance(v, int) and not isinstance(v, bool) for v in value
                ):
                    raise ServeOptionsError(
                        f"{name}: {value!r} is not a list of whole numbers",
                        field=name,
                        value=repr(value),
                    )
                continue
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
                object.__setattr__(self, name, value)
            ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
            if kind is float and ok:
                ok = math.isfinite(value)
            if kind not in _KIND_NAMES and isinstance(value, kind):
                continue  # a flag read at the door (the JSON-valued ones)
            if not ok:
                raise ServeOptionsError(
                    f"{name}: {value!r} is not a valid {_KIND_NAMES.get(kind, kind.__name__)}; "
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
    "enable_lora": bool,
    "max_loras": int,
    "max_lora_rank": int,
    "fully_sharded_loras": bool,
    "lora_dtype": str,
    "max_cpu_loras": int,
    "speculative_config": Speculative,
    "cpu_offload_gb": float,
    "kv_offloading_size": float,
    "swap_space": float,
    "data_parallel_size": int,
    "enable_expert_parallel": bool,
    "decode_context_parallel_size": int,
    "limit_mm_per_prompt": MmLimits,
    "skip_mm_profiling": bool,
    "mm_encoder_tp_mode": str,
    "num_gpu_blocks_override": int,
    "cudagraph_capture_sizes": tuple,
    "max_cudagraph_capture_size": int,
    "compilation_config": CompilationOptions,
    "optimization_level": str,
    "runner": str,
    "convert": str,
    "enable_sleep_mode": bool,
    "performance_mode": str,
    "mamba_cache_dtype": str,
    "mamba_ssm_cache_dtype": str,
    "enable_prefix_caching": bool,
    "enable_extensible_kv_cache": bool,
    "revision": str,
    "hf_overrides": HfOverrides,
    "download_dir": str,
    "tokenizer": str,
}
_OPTIONAL = frozenset(
    {"quantization", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
     "gpu_memory_utilization", "kv_cache_memory_bytes", "block_size", "vllm_version",
     "max_loras", "max_lora_rank", "max_cpu_loras", "speculative_config",
     "limit_mm_per_prompt", "num_gpu_blocks_override", "cudagraph_capture_sizes",
     "max_cudagraph_capture_size", "compilation_config", "optimization_level",
     "enable_prefix_caching", "enable_extensible_kv_cache", "revision", "download_dir",
     "tokenizer", "hf_overrides", "kv_offloading_size", "swap_space"}
)  # fmt: skip
_KIND_NAMES: dict[type, str] = {
    str: "string",
    int: "whole number",
    float: "finite number",
    bool: "true/false",
}


def draft_reference(options: ServeOptions) -> str | None:
    """The draft model the options' speculative config names, which the caller resolves
    (as it resolved the target) and hands to ``estimate(..., draft=)``; None when the
    method needs no draft."""
    sp = options.speculative_config
    return sp.model if sp is not None and sp.needs_draft else None


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


def latent_kv_cache(spec: ModelSpec) -> bool:
    """Whether vLLM keeps MLA's latent cache for the model (``MLAAttentionSpec``: one
    ``kv_lora_rank + qk_rope_head_dim`` entry per token, MLA's block size and KV dtypes):
    ``spec.mla`` and the class runs ``MLAAttention`` (the names table's build). MiniCPM3
    sizes MLA's projections but runs a plain ``Attention`` on full heads (minicpm3.py
    ``MiniCPM3Attention``; ``use_mla`` False: minicpm3 is not in ``is_deepseek_mla``'s
    model types), so its cache is K and V of every head, like any attention layer's."""
    return spec.mla is not None and mla_attention(spec.architecture) is not False


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
    if kv.name == "fp8_ds_mla" and not latent_kv_cache(spec):
        raise ServeOptionsError(
            f"kv_cache_dtype: fp8_ds_mla is for MLA models (DeepSeek V3); {spec.name} has none. Use fp8",
            field="kv_cache_dtype",
            value=flag,
        )
    return kv


def check_parallelism(
    spec: ModelSpec, tp: int, pp: int, options: ServeOptions | None = None
) -> None:
    """vLLM's own checks: TP divides the attention heads, KV heads split or replicate
    evenly, PP has at least one layer per stage and a class that runs under it; expert
    parallelism needs experts and decode context parallelism splits TP ranks whose KV
    heads are replicated."""
    if options is not None:
        _check_ep_dcp(spec, tp, options)
    heads = spec.num_attention_heads
    attention_free = bool(spec.layer_attention) and all(k == "none" for k in spec.layer_attention)
    if attention_free and spec.state is not None:
        heads = spec.state.num_heads or spec.state.intermediate_size  # the mixer is split
    if heads % tp:
        divisors = [d for d in (1, 2, 4, 8, 16, 32, 64) if heads % d == 0]
        what = "mixer heads (or channels)" if attention_free else "attention heads"
        raise ServeOptionsError(
            f"tensor_parallel_size: {tp} does not divide {spec.name}'s {heads} {what}; "
            f"use one of {', '.join(map(str, divisors))}",
            field="tensor_parallel_size",
            value=tp,
        )
    if pp > 1 and supports_pp(spec.architecture) is False:
        # ModelConfig.verify_with_parallel_config: the registry's supports_pp (SupportsPP)
        raise ServeOptionsError(
            f"pipeline_parallel_size: vLLM does not run {spec.architecture} under pipeline "
            "parallelism (its class does not implement SupportsPP, so vLLM refuses to "
            "start); use tensor parallelism instead (--tensor-parallel-size) with "
            "--pipeline-parallel-size 1",
            field="pipeline_parallel_size",
            value=pp,
        )
    kv = spec.num_kv_heads
    if attention_free:
        return  # no KV heads to split
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


def _check_block_size(block_size: int | None) -> None:
    """vLLM 0.32 takes any ``--block-size`` above 0 (``CacheConfig``), then finds no
    attention backend for one that is not a multiple of 16: FlashAttention, Triton and
    FlexAttention take ``MultipleOf(16)``, FlashInfer 16, 32 or 64 and up, the CPU
    backend ``MultipleOf(32)`` (``get_supported_kernel_block_sizes`` in
    vllm/v1/attention/backends/; ``CudaPlatform.get_attn_backend_cls`` then raises "No
    valid attention backend found ... block_size not supported")."""
    if block_size is not None and block_size % 16:
        raise ServeOptionsError(
            f"block_size: {block_size} tokens is not a multiple of 16, which no attention "
            "backend of vLLM's takes (vLLM then refuses to start); give 16, 32, 64 or 128, "
            "or omit it for vLLM's choice",
            field="block_size",
            value=block_size,
        )


def _check_ep_dcp(spec: ModelSpec, tp: int, options: ServeOptions) -> None:
    """``config/model.py`` and ``config/parallel.py``'s checks for -ep and -dcp."""
    if options.enable_expert_parallel and spec.moe is None:
        raise ServeOptionsError(
            f"enable_expert_parallel: {spec.name} has no experts; vLLM requires an MoE "
            "model for expert parallelism. Drop --enable-expert-parallel",
            field="enable_expert_parallel",
            value=True,
        )
    dcp = options.decode_context_parallel_size
    if dcp == 1:
        return
    problem = None
    if tp % dcp:
        problem = f"tensor_parallel_size {tp} must be divisible by it"
    elif not latent_kv_cache(spec):  # MiniCPM3's plain Attention: every head a KV head
        kv = spec.num_kv_heads if spec.mla is None else spec.num_attention_heads
        if tp <= kv:
            problem = (
                f"for GQA models tensor_parallel_size ({tp}) must exceed the {kv} KV heads, "
                "so that ranks hold copies of a head to split tokens over"
            )
        elif dcp > tp // kv:
            problem = f"at most {tp // kv} with {kv} KV heads at tensor_parallel_size {tp}"
        elif (spec.num_attention_heads // kv) % dcp:
            problem = (
                f"the {spec.num_attention_heads // kv} query heads per KV head must divide by it"
            )
    if problem:
        raise ServeOptionsError(
            f"decode_context_parallel_size: {dcp} cannot work: {problem}",
            field="decode_context_parallel_size",
            value=dcp,
        )
