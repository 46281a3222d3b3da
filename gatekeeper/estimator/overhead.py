"""The non-weight, non-KV memory of a vLLM worker: activation peak, non-torch, CUDA graphs.

Activation peak (vLLM's profile run, per rank)::

    forward  = B_tok * b * (3*I_rank + 3*H)                      dense MLP layers
             + B_tok * b * (topk * (3*I_expert_rank + H) + 3*H)  MoE layers (fused_moe caches)
    sampler  = min(S, B_tok) * V_pad * (b + sampler_extra_bytes + sampler_warmup_bytes)
                                                                  last pipeline stage only
    peak     = max(forward, sampler)

Llama-3.1-8B, v0.19 (S=1024, B_tok=8192, V=128256, bf16): sampler = 1024 * 128256 *
15.4 B = 1.89 GiB, the figure vLLM printed; forward = 8192 * 2 * (3*14336 + 3*4096) =
0.84 GiB.

CUDA graphs (V1, FULL_AND_PIECEWISE up to ``cap = min(2*S, 512, B_tok)`` tokens): a
fixed ~0.35 GiB plus, per layer, ``cap * 2 B * (1.75*H + (q+k+v)_rank + H/tp)`` of
piecewise outputs kept in the pool, plus ``cap * 2 B * topk * (3*I_expert_rank + H)``
for MoE layers. Calibrated on vLLM 0.19's "Graph capturing finished … took X GiB"
lines (Llama-3.1-8B 0.91 GiB, PP halves the layers to 0.65 GiB).
"""

from __future__ import annotations

from dataclasses import dataclass

from gatekeeper.estimator.accounting import Accounting
from gatekeeper.models.spec import ModelSpec
from gatekeeper.units import GIB, MIB, cdiv, round_up

__all__ = [
    "CUBLAS_WORKSPACE_BYTES",
    "BatchShape",
    "batch_defaults",
    "capture_size",
    "cuda_graph_bytes",
    "encoder_peak_bytes",
    "forward_peak_bytes",
    "non_torch_bytes",
    "pre_init_bytes",
    "sampler_peak_bytes",
]

LONG_CONTEXT = 32768
FUSED_MOE_CHUNK = 32768
CUDA_CONTEXT_BYTES = 512 * MIB
"""CUDA context and handles created before vLLM's init snapshot (0.51 GiB measured on
an H100 by v0.19: 'Free memory on device (78.68/79.19 GiB)')."""
TP_PRE_INIT_BYTES = 1 * GIB
"""NCCL communicators and custom all-reduce buffers made before the init snapshot under
TP (77.66 GiB free at TP=2 on the same H100)."""
CUBLAS_WORKSPACE_BYTES = 32 * MIB
"""The cuBLAS workspace torch allocates with the first handle on a stream, from its caching
allocator: ``4096 x 8`` KiB on Hopper (PyTorch's ``CublasHandlePool.cpp``,
``parseChosenWorkspaceSize``; 8 MiB + 128 KiB before sm90, not told apart here), which
cuBLASLt shares (``TORCH_CUBLASLT_UNIFIED_WORKSPACE`` is on by default). vLLM 0.33 makes the
handles before its init snapshot (``Accounting.handles_before_snapshot``), so the workspace
moves from the in-budget non-torch growth to what the worker holds outside the budget; the
handles' own driver allocations are not in any source and stay in the measured figures."""
V0_CUDA_GRAPH_BYTES = round(0.25 * GIB)
V1_CUDA_GRAPH_BASE = round(0.35 * GIB)


@dataclass(frozen=True, slots=True)
class BatchShape:
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool


def batch_defaults(
    acc: Accounting,
    *,
    total_bytes: int,
    gpu_name: str | None,
    max_model_len: int,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    llm_class: bool = False,
    throughput: bool = False,
) -> BatchShape:
    """vLLM's defaults for ``max_num_seqs`` and ``max_num_batched_tokens``: ``vllm serve``'s,
    or the ``LLM`` class's (``llm_class``), which batch twice to four times as many tokens;
    ``--performance-mode throughput`` doubles each default the operator did not set
    (``engine/arg_utils.py::_set_default_max_num_seqs_and_batched_tokens_args``)."""
    chunked = acc.chunked_prefill == "always" or (
        acc.chunked_prefill == "long" and max_model_len > LONG_CONTEXT
    )
    if acc.batch_defaults == "v1-by-gpu":
        is_a100 = gpu_name is not None and "a100" in gpu_name.lower()
        if total_bytes >= 160 * GIB:
            seqs, tokens = 1024, 16384
        elif total_bytes >= 70 * GIB and not is_a100:
            seqs, tokens = 1024, 16384 if llm_class else 8192
        else:
            seqs, tokens = 256, 8192 if llm_class else 2048
    elif acc.batch_defaults == "v1-flat":
        seqs, tokens = 256, 8192 if llm_class else 2048
    else:
        seqs, tokens = 256, 2048
    if throughput:
        seqs, tokens = 2 * seqs, 2 * tokens
    seqs = max_num_seqs or seqs
    if max_num_batched_tokens:
        tokens = max_num_batched_tokens
    elif not chunked:
        tokens = max(max_model_len, tokens)
    tokens = min(seqs * max_model_len, tokens)
    return BatchShape(min(seqs, tokens), tokens, chunked)


def forward_peak_bytes(spec: ModelSpec, layers: range, tokens: int, tp: int, act_bytes: int) -> int:
    """Peak transient activations of one forward over ``tokens`` tokens."""
    h = spec.hidden_size
    peak = 0
    for i in layers:
        if spec.moe is not None and spec.layer_moe[i]:
            moe = spec.moe
            n = cdiv(moe.expert_intermediate_size, tp)
            chunk = min(tokens, FUSED_MOE_CHUNK)
            per_token = moe.experts_per_token * (3 * n + h)
            layer = chunk * per_token + tokens * 3 * h
            if moe.shared_intermediate_size:
                layer += tokens * 3 * cdiv(moe.shared_intermediate_size, tp)
        else:
            layer = tokens * (3 * cdiv(spec.intermediate_size, tp) + 3 * h)
        peak = max(peak, layer)
    return peak * act_bytes


def encoder_peak_bytes(
    acc: Accounting,
    spec: ModelSpec,
    shape: BatchShape,
    act_bytes: int,
    *,
    items_per_prompt: int | None = None,
) -> int:
    """The multimodal profile: the vision encoder over the largest items that fit.

    Items: V0 gives each of ``max_num_seqs`` dummy sequences one image when the features
    go to cross-attention (Mllama), else as many as ``max_num_batched_tokens`` holds; V1
    fills an encoder cache of ``max(max_num_batched_tokens, tokens_per_item)`` tokens, at
    most ``items_per_prompt x max_num_seqs`` items (``--limit-mm-per-prompt``; 0 items:
    no encoder, no profile).
    Peak = patches x b x (MLP width + 3h) for a ViT block, plus the encoder features
    (``patches x output_dim``) and the projected embeddings (``tokens x H``) held at once.
    """
    v = spec.vision
    if v is None:
        return 0
    if acc.engine == "v0":
        fit = (
            shape.max_num_seqs
            if v.cross_attention
            else shape.max_num_batched_tokens // v.tokens_per_item
        )
        items = max(1, min(shape.max_num_seqs, fit))
    else:
        items = max(1, max(shape.max_num_batched_tokens, v.tokens_per_item) // v.tokens_per_item)
    if items_per_prompt is not None:
        if items_per_prompt == 0:
            return 0
        items = min(items, items_per_prompt * shape.max_num_seqs)
    patches, tokens = items * v.patches_per_item, items * v.tokens_per_item
    # Encoder activations are gathered across TP ranks, so they are not divided by TP.
    mlp = (3 if v.gated else 2) * v.intermediate_size
    block = patches * (mlp + 3 * v.hidden_size)
    return (block + patches * v.output_dim + tokens * spec.hidden_size) * act_bytes


def sampler_peak_bytes(acc: Accounting, spec: ModelSpec, requests: int, logits_bytes: int) -> int:
    """The dummy sampler run over ``requests`` rows of the padded vocabulary."""
    vocab = round_up(spec.vocab_size, 64)
    extra = acc.sampler_extra_bytes + acc.sampler_warmup_bytes
    return round(requests * vocab * (logits_bytes + extra))


CUSTOM_ALLREDUCE_SIZES = frozenset({2, 4, 6, 8})
"""World sizes vLLM's custom all-reduce supports (one node); other TP sizes use NCCL alone."""


EMBEDDED_NON_TORCH_BYTES = 10 * MIB
"""An engine embedded in a process that already used CUDA (a notebook, a trainer): the
CUDA context, cuBLAS workspaces and most kernel modules exist before vLLM's init
snapshot, so only a few lazily loaded kernels grow during the profile (vLLM 0.7-0.8
printed 0.01 GiB in such notebooks)."""


def non_torch_bytes(acc: Accounting, tp: int, pp: int, *, embedded: bool = False) -> int:
    """Non-torch memory that grows after vLLM's init snapshot, inside the budget.

    Under TP the communication buffers (custom all-reduce, NCCL symmetric memory) add
    ``non_torch_tp_bytes`` on the world sizes custom all-reduce supports; larger,
    multi-node groups fall back to NCCL's ring buffers only. From 0.33 the cuBLAS
    workspace is made before the snapshot (``CUBLAS_WORKSPACE_BYTES``), so it leaves
    this figure (an embedded engine had it before the snapshot already).
    """
    if embedded:
        base = EMBEDDED_NON_TORCH_BYTES
    else:
        base = acc.non_torch_pp_bytes if pp > 1 else acc.non_torch_bytes
        base -= CUBLAS_WORKSPACE_BYTES if acc.handles_before_snapshot else 0
    return base + (acc.non_torch_tp_bytes if tp in CUSTOM_ALLREDUCE_SIZES else 0)


def pre_init_bytes(tp: int, acc: Accounting | None = None, *, embedded: bool = False) -> int:
    """Memory a worker holds outside vLLM's budget (CUDA context, NCCL under TP; from 0.33
    the cuBLAS workspace, ``acc`` given and the engine not embedded)."""
    handles = acc is not None and acc.handles_before_snapshot and not embedded
    cublas = CUBLAS_WORKSPACE_BYTES if handles else 0
    return CUDA_CONTEXT_BYTES + (TP_PRE_INIT_BYTES if tp > 1 else 0) + cublas


def capture_size(
    shape: BatchShape,
    *,
    decode_query_len: int = 1,
    sizes: tuple[int, ...] | None = None,
    largest: int | None = None,
) -> int:
    """The largest CUDA-graph capture size, as ``config/vllm.py::_set_cudagraph_sizes``
    picks it: the largest of ``--cudagraph-capture-sizes`` within max_num_batched_tokens;
    else the largest size of vLLM's grid (``1, 2, 4``, every 8 to 256, every 16 beyond)
    within the ceiling, ``--max-cudagraph-capture-size`` (truncated to the grid, as vLLM
    truncates it) or ``min(2 x max_num_seqs x decode_query_len, 512)``, plus
    max_num_batched_tokens and the uniform decode batches (``n x decode_query_len``) that
    fit under it. ``decode_query_len`` is 1 + the draft tokens of speculative decoding."""
    tokens = shape.max_num_batched_tokens
    if sizes:
        return max((s for s in sizes if s <= tokens), default=0)
    seqs = shape.max_num_seqs
    if largest is None:
        ceiling = min(2 * seqs * decode_query_len, GRAPH_CEILING)
        if decode_query_len > 1:
            uniform = [n * decode_query_len for n in _request_counts(seqs)]
        else:
            uniform = [seqs]
        uniform = [u for u in uniform if u <= ceiling]
    else:
        ceiling, uniform = largest, []
    ceiling = min(tokens, ceiling)
    grid = [n for n in (1, 2, 4) if n <= ceiling]
    grid += list(range(8, min(ceiling + 1, 256), 8)) + list(range(256, ceiling + 1, 16))
    if tokens <= ceiling:
        grid.append(tokens)
    return max([*grid, *(u for u in uniform if u <= tokens)], default=0)


GRAPH_CEILING = 512
"""vLLM's default ceiling on capture sizes (1024 on data-center Blackwell, not modelled)."""


def _request_counts(max_reqs: int) -> list[int]:
    """Request counts of uniform decode batches (``_set_cudagraph_sizes``' ``request_counts``)."""
    max_reqs = min(max_reqs, GRAPH_CEILING)
    counts = [n for n in (1, 2, 4) if n <= max_reqs]
    counts += list(range(8, min(max_reqs + 1, 256), 8)) + list(range(256, max_reqs + 1, 16))
    return sorted({*counts, max_reqs})


def cuda_graph_bytes(
    acc: Accounting,
    spec: ModelSpec,
    layers: range,
    tp: int,
    shape: BatchShape,
    eager: bool,
    *,
    cap: int | None = None,
    base: bool = True,
) -> int:
    """CUDA-graph pool memory (0 with --enforce-eager) for graphs up to ``cap`` tokens
    (default ``capture_size(shape)``); ``base=False`` leaves out the pool's fixed part
    (a drafter's graphs share the target's pool)."""
    if eager:
        return 0
    if acc.engine == "v0":
        return V0_CUDA_GRAPH_BYTES if base else 0
    cap = capture_size(shape) if cap is None else cap
    h = spec.hidden_size
    if spec.mla is not None:
        qkv = cdiv(spec.num_attention_heads, tp) * (
            spec.mla.qk_nope_head_dim + spec.mla.qk_rope_head_dim
        )
        qkv += spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim
    else:
        kv = max(1, spec.num_kv_heads // tp)
        qkv = (cdiv(spec.num_attention_heads, tp) * spec.head_dim) + 2 * kv * spec.head_dim
    total = V1_CUDA_GRAPH_BASE if base else 0
    for i in layers:
        per_token = 1.75 * h + qkv + h / tp
        if spec.moe is not None and spec.layer_moe[i]:
            n = cdiv(spec.moe.expert_intermediate_size, tp)
            per_token += spec.moe.experts_per_token * (3 * n + h)
        total += round(cap * 2 * per_token)
    return total
