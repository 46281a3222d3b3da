"""What an estimate says: the GPU it was made for (``GpuTarget``), each pipeline stage's
per-rank bytes (``StageEstimate``) and the whole answer (``Estimate``): whether the
worker starts, why not, its KV capacity and the JSON the CLI and the admin API print.

Pure data: ``vllm_method.estimate`` and ``simple_method`` build them; placement, the
webhook, calibration and the CLI read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from gatekeeper.estimator.accounting import accounting_by_name
from gatekeeper.estimator.host import HostEstimate
from gatekeeper.estimator.overhead import pre_init_bytes
from gatekeeper.estimator.weight_groups import WeightGroups

__all__ = ["Estimate", "GpuTarget", "StageEstimate"]


@dataclass(frozen=True, slots=True)
class GpuTarget:
    """The GPU a worker would run on: total bytes as vLLM sees them, and free bytes
    when known (a live snapshot)."""

    total_bytes: int
    free_bytes: int | None = None
    name: str | None = None
    compute_capability: tuple[int, int] | None = None
    """(major, minor), when the product is known: vLLM picks some kernels by it, and
    their padding changes what the experts hold (``moe_backend``)."""


@dataclass(frozen=True, slots=True)
class StageEstimate:
    """One pipeline stage's ranks (each TP rank of a stage holds the same)."""

    stage: int
    layers: int
    weights_bytes: int
    non_torch_bytes: int
    activation_peak_bytes: int
    cuda_graph_bytes: int
    kv_cache_bytes: int
    num_blocks: int
    budget_bytes: int
    nvml_bytes: int
    """What NVML will show the worker process holding on this GPU once it is ready."""
    lora_bytes: int = 0
    """LoRA slots (``--enable-lora``), part of ``weights_bytes`` as vLLM counts them."""
    draft_weights_bytes: int = 0
    """The speculative drafter's weights, part of ``weights_bytes`` (last stage)."""
    cpu_offloaded_bytes: int = 0
    """Weights kept in host memory by ``--cpu-offload-gb``, not in ``weights_bytes``."""
    weights_by_group: WeightGroups = field(default_factory=WeightGroups)
    """``weights_bytes`` by module group and storage format (``weight_groups``): what
    is quantized and what stayed in the model dtype; the entries add up to it."""
    kv_margin_bytes: int = 0
    """vLLM 0.34's extensible KV cache: device memory kept free beyond the transient
    peak when the cache is sized, ``max(1 GiB, 0.75 x activation)`` (``extensible_kv``);
    0 where the profile sizes the cache."""

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in StageEstimate.__slots__}
        return {**out, "weights_by_group": self.weights_by_group.by_group()}


@dataclass(frozen=True, slots=True)
class Estimate:
    model: str
    method: Literal["vllm", "simple"]
    vllm_version: str
    accounting: str
    gpu_total_bytes: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    dtype: str
    kv_cache_dtype: str
    quantization: str | None
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    block_size: int
    enforce_eager: bool
    weights_source: str
    kv_bytes_per_token: int
    kv_block_bytes: int
    """Bytes of one KV block on the most loaded rank (all its layers)."""
    blocks_per_request: int
    """Blocks one request of max_model_len holds on that rank."""
    cuda_graphs_in_budget: bool
    """True from vLLM 0.21: graph memory is inside ``gpu_memory_utilization x total``."""
    stages: tuple[StageEstimate, ...]
    kv_cache_tokens: int
    max_concurrency: float
    max_model_len_fit: int
    fits: bool
    reasons: tuple[str, ...]
    warnings: tuple[str, ...] = field(default=())
    length_beyond_model: bool = False
    """max_model_len exceeds the model's derived maximum: vLLM refuses it whatever the
    memory (the one refusal no KV budget can fix)."""
    data_parallel_size: int = 1
    """Engine replicas (``-dp``), each on its own ``tp x pp`` GPUs; per-GPU bytes are the
    same on every replica."""
    expert_parallel_size: int = 1
    decode_context_parallel_size: int = 1
    speculative_method: str | None = None
    cuda_graph_capture_size: int = 0
    """The largest batch captured in a CUDA graph (0: no graphs)."""
    experts_backend: str = ""
    """The kernel backend whose padding sized the quantized experts, as vLLM picks it on
    the target GPU, and on what ground (MXFP4: ``moe_backend``); "" where none pads."""
    state_bytes_per_sequence: int = 0
    """Recurrent state one sequence holds on the most loaded rank (hybrid and
    attention-free models; 0 for pure attention). ``kv_bytes_per_token`` is the
    attention part."""
    extensible_kv_cache: bool = False
    """vLLM 0.34's extensible KV cache sized the KV cache after warm-up and CUDA-graph
    capture from measured memory (``extensible_kv``); the budget is then a cap."""
    host: HostEstimate = field(default_factory=HostEstimate)
    """The deployment's host memory, all its processes together (``host``)."""

    @property
    def gpus(self) -> int:
        """GPUs one deployment takes: ``dp x tp x pp``."""
        return self.data_parallel_size * self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def worst(self) -> StageEstimate:
        """The most loaded rank: the stage with the fewest KV blocks."""
        return min(self.stages, key=lambda s: (s.num_blocks, s.kv_cache_bytes))

    def kv_bytes_for(self, sequences: int = 1, tokens: int | None = None) -> int:
        """KV bytes that hold ``sequences`` requests of max_model_len (or ``tokens``
        tokens, whichever is more) plus vLLM's null block: ``sequences=1`` is the least
        vLLM accepts."""
        if not self.kv_block_bytes:
            return 0
        blocks = self.blocks_per_request * sequences
        if tokens:
            per_token = self.blocks_per_request / self.max_model_len
            blocks = max(blocks, -(-int(per_token * tokens * 1000) // 1000))
        return self.kv_block_bytes * (blocks + 1)

    def rank_bytes(self, stage: StageEstimate, kv_bytes: int) -> tuple[int, int]:
        """(bytes the rank holds, bytes inside vLLM's budget) with ``kv_bytes`` of KV cache:
        the CUDA context (and NCCL under TP; from vLLM 0.33 the cuBLAS workspace) sit
        outside the budget, and so do CUDA graphs before vLLM 0.21."""
        in_budget = stage.weights_bytes + stage.non_torch_bytes + stage.activation_peak_bytes
        in_budget += kv_bytes
        outside = pre_init_bytes(self.tensor_parallel_size, accounting_by_name(self.accounting))
        if self.cuda_graphs_in_budget:
            in_budget += stage.cuda_graph_bytes
        else:
            outside += stage.cuda_graph_bytes
        return outside + in_budget, in_budget

    def to_json(self) -> dict[str, Any]:
        w = self.worst
        return {
            "model": self.model,
            "method": self.method,
            "vllm_version": self.vllm_version,
            "accounting": self.accounting,
            "accounting_description": accounting_by_name(self.accounting).description,
            "weights_bytes": w.weights_bytes,
            "weights_by_group": w.weights_by_group.by_group(),
            "non_torch_bytes": w.non_torch_bytes,
            "activation_peak_bytes": w.activation_peak_bytes,
            "cuda_graph_bytes": w.cuda_graph_bytes,
            "kv_cache_bytes": w.kv_cache_bytes,
            "extensible_kv_cache": self.extensible_kv_cache,
            "kv_margin_bytes": w.kv_margin_bytes,
            "kv_cache_tokens": self.kv_cache_tokens,
            "max_concurrency": round(self.max_concurrency, 2),
            "fits": self.fits,
            "reasons": list(self.reasons),
            "warnings": list(self.warnings),
            "max_model_len": self.max_model_len,
            "max_model_len_fit": self.max_model_len_fit,
            "budget_bytes": w.budget_bytes,
            "nvml_bytes": w.nvml_bytes,
            "gpu_total_bytes": self.gpu_total_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_block_bytes": self.kv_block_bytes,
            "blocks_per_request": self.blocks_per_request,
            "state_bytes_per_sequence": self.state_bytes_per_sequence,
            "lora_bytes": w.lora_bytes,
            "draft_weights_bytes": w.draft_weights_bytes,
            "cpu_offloaded_bytes": w.cpu_offloaded_bytes,
            "host_bytes": self.host.host_bytes,
            "host": self.host.to_json(),
            "gpus": self.gpus,
            "weights_source": self.weights_source,
            "experts_backend": self.experts_backend or None,
            "options": {
                "tensor_parallel_size": self.tensor_parallel_size,
                "pipeline_parallel_size": self.pipeline_parallel_size,
                "dtype": self.dtype,
                "kv_cache_dtype": self.kv_cache_dtype,
                "quantization": self.quantization,
                "max_num_seqs": self.max_num_seqs,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "gpu_memory_utilization": self.gpu_memory_utilization,
                "block_size": self.block_size,
                "enforce_eager": self.enforce_eager,
                "data_parallel_size": self.data_parallel_size,
                "expert_parallel_size": self.expert_parallel_size,
                "decode_context_parallel_size": self.decode_context_parallel_size,
                "speculative_method": self.speculative_method,
                "cuda_graph_capture_size": self.cuda_graph_capture_size,
            },
            "stages": [s.to_json() for s in self.stages],
        }
