"""The serving options resolved against the model, the GPU and the vLLM release, once
per estimate: what every pipeline stage of ``vllm_method.estimate`` reads (``Plan``).

The release gives the accounting (``accounting_for``): its engine, default utilization,
batch defaults, block sizes and whether the KV cache is extensible (0.34); the model and the options give the dtype vLLM picks,
the quantization the flag resolves to, ``max_model_len`` (the model's default when none
is given), the batch shape and the block size; ``Features`` holds the flags beyond the
basic shape that change memory (LoRA slots, speculation, pooling, EP, DCP, CUDA graphs
and their largest capture, the encoder's profile, which weights a rank holds).
"""

from __future__ import annotations

from dataclasses import dataclass

from gatekeeper.errors import ServeOptionsError
from gatekeeper.estimator.accounting import DEFAULT_VLLM_VERSION, Accounting, accounting_for
from gatekeeper.estimator.dtype import resolve_dtype
from gatekeeper.estimator.lora import DEFAULT_MAX_LORA_RANK, DEFAULT_MAX_LORAS, LoraSlots
from gatekeeper.estimator.options import ServeOptions, check_parallelism, latent_kv_cache
from gatekeeper.estimator.overhead import BatchShape, batch_defaults, capture_size
from gatekeeper.estimator.rank_weights import WeightOptions
from gatekeeper.estimator.runner import resolve_runner
from gatekeeper.estimator.speculative import Speculative
from gatekeeper.estimator.types import GpuTarget
from gatekeeper.models.pooling_heads import pooling_lm_head
from gatekeeper.models.quantization import QuantSpec, quant_from_flag
from gatekeeper.models.spec import DTYPE_BYTES, ModelSpec
from gatekeeper.units import GIB

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "Features",
    "Plan",
    "default_utilization",
    "extensible_kv_cache",
    "resolve_plan",
]

DEFAULT_BLOCK_SIZE = 16
"""``CacheConfig.DEFAULT_BLOCK_SIZE`` before 0.34 (``Accounting.default_block_size``)."""
EXTENSIBLE_UTILIZATION = 1.0
"""``CacheConfig.resolved_gpu_memory_utilization`` with the extensible KV cache and no
``--gpu-memory-utilization`` (vllm/config/cache.py:494-501 of 0.34.0): the budget is a cap."""


@dataclass(frozen=True, slots=True)
class Plan:
    """Resolved options shared by every stage."""

    acc: Accounting
    spec: ModelSpec
    opts: ServeOptions
    gpu: GpuTarget
    tp: int
    pp: int
    dtype: str
    quant: QuantSpec | None
    max_model_len: int
    utilization: float
    shape: BatchShape
    block_size: int
    features: Features
    version: str = DEFAULT_VLLM_VERSION
    """The vLLM release being sized."""
    extensible: bool = False
    """vLLM 0.34's extensible KV cache is on (``extensible_kv_cache``)."""

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]


@dataclass(frozen=True, slots=True)
class Features:
    """The serving flags beyond the basic shape that change memory, resolved."""

    lora: LoraSlots | None
    speculative: Speculative | None
    pooling: bool
    ep: int
    dcp: int
    graphs: bool
    cap: int
    mm_items: int | None
    """Items per prompt the encoder profile is limited to (None: vLLM's default)."""
    weights: WeightOptions


def _features(
    spec: ModelSpec,
    opts: ServeOptions,
    shape: BatchShape,
    tp: int,
    gpu: GpuTarget,
    *,
    pooling: bool,
    length: int = 0,
) -> Features:
    sp = opts.speculative_config
    comp = opts.compilation_config
    mode = comp.cudagraph_mode if comp else None
    graphs = not opts.enforce_eager and opts.optimization_level != "0" and mode != "NONE"
    k = sp.tokens(spec) if sp else 0
    cap = capture_size(
        shape,
        decode_query_len=1 + k,
        sizes=opts.cudagraph_capture_sizes or (comp.capture_sizes if comp else None),
        largest=opts.max_cudagraph_capture_size or (comp.max_capture_size if comp else None),
    )
    limits = opts.limit_mm_per_prompt
    items = limits.get("image") if limits else None
    # vLLM skips the tower only when every modality it encodes is limited to 0 (an
    # unlisted modality keeps vLLM's default limit): models/interfaces.py
    modalities = spec.vision.modalities if spec.vision else ()
    if modalities == ("audio",):  # Whisper's encoder: audio items
        items = limits.get("audio") if limits else None
    vision_off = (
        limits is not None and bool(modalities) and all(limits.get(m) == 0 for m in modalities)
    )
    ep = opts.data_parallel_size * tp if opts.enable_expert_parallel else 1
    lora = None
    if opts.enable_lora:
        lora = LoraSlots(
            opts.max_loras or DEFAULT_MAX_LORAS,
            opts.max_lora_rank or DEFAULT_MAX_LORA_RANK,
            opts.lora_dtype,
            opts.fully_sharded_loras,
        )
    weights = WeightOptions(
        ep_size=ep,
        lm_head=not pooling or pooling_lm_head(spec.architecture),
        pooling=pooling,
        vision=not vision_off,
        vision_replicated=opts.mm_encoder_tp_mode == "data",
        cpu_offload_bytes=round(opts.cpu_offload_gb * GIB),
        compute_capability=gpu.compute_capability,
        max_model_len=length,
    )
    return Features(
        lora=lora,
        speculative=sp,
        pooling=pooling,
        ep=ep,
        dcp=opts.decode_context_parallel_size,
        graphs=graphs,
        cap=cap if graphs else 0,
        # no image but videos: the profile runs on videos, sized here as images
        mm_items=0 if vision_off or opts.skip_mm_profiling else (items or None),
        weights=weights,
    )


def default_utilization(acc: Accounting, opts: ServeOptions) -> float:
    """``--gpu-memory-utilization`` when it is not given, as the release resolves it: 1.0
    (a cap) with 0.34's extensible KV cache, else the span's default (0.9, 0.92 from
    0.20; ``CacheConfig.resolved_gpu_memory_utilization``, config/cache.py:494-501)."""
    return EXTENSIBLE_UTILIZATION if extensible_kv_cache(acc, opts) else acc.default_utilization


def extensible_kv_cache(acc: Accounting, opts: ServeOptions) -> bool:
    """Whether the release sizes the KV cache after warm-up (vLLM 0.34's extensible KV
    cache), as ``VllmConfig._resolve_extensible_kv_cache`` (config/vllm.py:3180-3269 of
    0.34.0) settles it: on unless ``--no-enable-extensible-kv-cache``, and never with
    ``--kv-cache-memory-bytes`` or ``--num-gpu-blocks-override`` (lines 3203-3212), which
    it refuses beside an explicit ``--enable-extensible-kv-cache`` (line 3262). Elastic EP
    and KV connectors also turn it off; gatekeeper models neither. Before 0.34 the flag
    does not exist."""
    asked = opts.enable_extensible_kv_cache
    if not acc.extensible_kv:
        if asked is not None:
            raise ServeOptionsError(
                "enable_extensible_kv_cache: the extensible KV cache is new in vLLM 0.34.0; "
                "omit the flag for an older release",
                field="enable_extensible_kv_cache",
                value=asked,
            )
        return False
    overridden = next(
        (
            flag
            for flag in ("kv_cache_memory_bytes", "num_gpu_blocks_override")
            if getattr(opts, flag) is not None
        ),
        None,
    )
    if overridden is None:
        return asked is not False
    if asked:
        raise ServeOptionsError(
            "enable_extensible_kv_cache: it sizes the KV cache from measured memory, which "
            f"{overridden} overrides (vLLM refuses both); drop one of them",
            field="enable_extensible_kv_cache",
            value=asked,
        )
    return False


def _check_encoder_decoder(spec: ModelSpec, shape: BatchShape, length: int, *, audio: bool) -> None:
    """vLLM's refusals of an encoder-decoder's batch (Whisper), which it runs without
    chunked prefill nor chunked multimodal input (``SchedulerConfig.__post_init__``): fewer
    batched tokens than ``max_model_len`` (``verify_max_model_len``), or than one encoder
    item's positions while the encoder is on (``compute_mm_encoder_budget``)."""
    if spec.encoder is None:
        return
    tokens = shape.max_num_batched_tokens
    need, what = length, f"max_model_len ({length})"
    if audio and spec.encoder.max_source_positions > need:
        need = spec.encoder.max_source_positions
        what = f"one audio item's {need} encoder positions (max_source_positions)"
    if tokens < need:
        raise ServeOptionsError(
            f"max_num_batched_tokens: {tokens} is below {what}; vLLM refuses to start an "
            f"encoder-decoder so (it runs without chunked prefill): give at least {need}",
            field="max_num_batched_tokens",
            value=tokens,
        )


def resolve_plan(spec: ModelSpec, opts: ServeOptions, gpu: GpuTarget, default_version: str) -> Plan:
    version = opts.vllm_version or default_version
    acc = accounting_for(version)
    tp, pp = opts.tensor_parallel_size, opts.pipeline_parallel_size
    check_parallelism(spec, tp, pp, opts)
    pooling = resolve_runner(spec, opts.runner, opts.convert).pooling
    spec = spec.for_runner(pooling)  # a pooling run: the tokenizer's length cap
    dtype = resolve_dtype(opts.dtype, spec, v1=acc.engine == "v1", pooling=pooling)
    quant = (
        quant_from_flag(opts.quantization, spec.quantization)
        if opts.quantization
        else spec.quantization
    )
    length = opts.max_model_len or spec.default_max_model_len
    shape = batch_defaults(
        acc,
        total_bytes=gpu.total_bytes,
        gpu_name=gpu.name,
        max_model_len=length,
        max_num_seqs=opts.max_num_seqs,
        max_num_batched_tokens=opts.max_num_batched_tokens,
        llm_class=opts.embedded,
        throughput=opts.performance_mode == "throughput",
    )
    extensible = extensible_kv_cache(acc, opts)
    # 0.34's default of 64 is one FlashMLA takes too: MLA stays at 64
    default_block = max(acc.default_block_size, acc.mla_block_size if latent_kv_cache(spec) else 0)
    block = opts.block_size or default_block
    utilization = opts.gpu_memory_utilization or default_utilization(acc, opts)
    features = _features(spec, opts, shape, tp, gpu, pooling=pooling, length=length)
    _check_encoder_decoder(spec, shape, length, audio=features.weights.vision)
    return Plan(
        acc, spec, opts, gpu, tp, pp, dtype, quant, length, utilization, shape, block, features,
        version, extensible,
    )  # fmt: skip
