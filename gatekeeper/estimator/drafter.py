"""The speculative drafter's share of one rank: weights, KV pages, forward, CUDA graphs.

``speculative`` reads the config; this module sizes what the chosen method loads (see
its docstring for vLLM's rules). Worked example: Llama-3.1-8B with
``{"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B",
"num_speculative_tokens": 3}`` (one Llama layer, H 4096, 32 heads, 8 KV heads, I 14336),
bf16, TP=1: layer 436,224,000 B (q 4096x4096, k and v 4096x1024, o 4096x4096, MLP
3x4096x14336, two norms) + fc 8192x4096x2 B = 67,108,864 B, embedding and LM head
and the final norm 8,192 B, embedding and LM head shared: 503,341,056 B = 0.47 GiB; KV +8x128x2x2 B = 4,096 B per token (131,072 for the
target's 32 layers).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gatekeeper.errors import ServeOptionsError
from gatekeeper.estimator.accounting import Accounting
from gatekeeper.estimator.kv_cache import indexer_bytes_per_token, page_bytes_per_token
from gatekeeper.estimator.options import KvDtype
from gatekeeper.estimator.overhead import BatchShape, cuda_graph_bytes, forward_peak_bytes
from gatekeeper.estimator.rank_weights import RankWeights, decoder_layer_bytes
from gatekeeper.estimator.speculative import Speculative
from gatekeeper.estimator.weights import layer_bytes, lm_head_bytes, weight_plan
from gatekeeper.models.module_names import ModuleNames
from gatekeeper.models.quantization import QuantSpec
from gatekeeper.models.spec import ModelSpec

__all__ = ["DraftCost", "draft_cost", "mtp_prefix"]


@dataclass(frozen=True, slots=True)
class DraftCost:
    """What the drafter adds on the rank that holds it (the last pipeline stage)."""

    weights_bytes: int
    kv_bytes_per_token: int
    forward_peak_bytes: int
    cuda_graph_bytes: int


@dataclass(frozen=True, slots=True)
class DraftContext:
    """The target's resolved serving facts a drafter shares."""

    acc: Accounting
    spec: ModelSpec
    tp: int
    dtype_bytes: int
    quant: QuantSpec | None
    kv: KvDtype
    shape: BatchShape
    eager: bool
    cap: int


def _head_model(sp: Speculative, spec: ModelSpec, draft: ModelSpec | None) -> ModelSpec:
    if sp.method == "mtp":
        if not spec.mtp_layers:
            raise ServeOptionsError(
                f"speculative_config: method mtp needs multi-token-prediction layers, and "
                f"{spec.name}'s config declares none (num_nextn_predict_layers); use eagle "
                "or a draft model",
                field="speculative_config",
                value="mtp",
            )
        return spec
    assert draft is not None, "speculative methods with a draft need its spec"
    return draft


def _head_weights(sp: Speculative, c: DraftContext, head: ModelSpec) -> int:
    """EAGLE and MTP heads: their layers, their input projection, their own LM head."""
    h = c.spec.hidden_size
    if sp.method == "mtp":
        target = RankWeights.of(c.spec, c.tp, c.dtype_bytes, c.quant)
        prefix = mtp_prefix(c.spec, target.names)
        if prefix:
            return _mtp_module_weights(target, prefix)
        last = c.spec.num_layers - 1
        one = layer_bytes(c.spec, last, tp=c.tp, dtype_bytes=c.dtype_bytes, quant=c.quant)
        eh_proj = 2 * h * h * c.dtype_bytes
        return c.spec.mtp_layers * (one + eh_proj + 3 * h * c.dtype_bytes)
    quant = head.quantization
    layers = sum(
        layer_bytes(head, i, tp=c.tp, dtype_bytes=c.dtype_bytes, quant=quant)
        for i in range(head.num_layers)
    )
    inputs = 3 if sp.method == "eagle3" else 2
    fc = inputs * h * head.hidden_size * c.dtype_bytes
    total = layers + fc + head.hidden_size * c.dtype_bytes  # + the final norm
    if sp.method == "eagle3":
        # the first layer's qkv reads [embeddings, hidden]: twice the input width
        q = head.num_attention_heads * head.head_dim
        kv = 2 * max(1, head.num_kv_heads // c.tp) * head.head_dim * c.tp
        total += head.hidden_size * (q + kv) // c.tp * c.dtype_bytes
        if head.draft_vocab_size:
            total += lm_head_bytes(
                head, tp=c.tp, dtype_bytes=c.dtype_bytes, quant=None, vocab=head.draft_vocab_size
            )
            total += head.draft_vocab_size * 8  # d2t: draft to target token ids (int64)
    return total


def mtp_prefix(spec: ModelSpec, names: ModuleNames) -> str:
    """Where a gated-delta-net model's MTP drafter builds its modules: under the checkpoint
    prefix the target class's rename mapper drops (``"mtp.": None`` in ``qwen3_5.py`` and
    ``qwen3_next.py``), which ``Qwen3_5MTP``/``Qwen3NextMTP`` build under
    (``maybe_prefix(prefix, "mtp")``); empty for other models (DeepSeek's MTP layers are
    ``model.layers.<num_hidden_layers + N>``)."""
    if spec.state is None or spec.state.kind != "gdn":
        return ""
    mapper = names.extra.get("mapper") or {}
    dropped = [str(old) for old, new in mapper.get("prefix") or () if new is None]
    return next((d.rstrip(".") for d in dropped if d.startswith("mtp")), "")


def _mtp_module_weights(target: RankWeights, prefix: str) -> int:
    """A Qwen3.5/3.6 or Qwen3-Next MTP drafter (``qwen3_5_mtp.py``, ``qwen3_next_mtp.py``):
    ``mtp.layers.N`` full-attention layers with the target's MLP or experts, ``mtp.fc``
    (2H -> H) and three norms. The proposer hands it the target's quantization config,
    already rewritten by the target's class (``mtp.`` names pass unchanged), so the
    checkpoint's lists name its modules as ``mtp.layers.0.self_attn.q_proj``; ``fc`` stays
    in the model dtype under ModelOpt NVFP4 (``modelopt_fp4``: the checkpoints store it
    bf16 but do not list it), and a GPTQ ``dynamic`` rule ``-:...mtp...`` leaves the
    layers unquantized."""
    s, q, h = target.spec, target.quant, target.spec.hidden_size
    last = s.num_layers - 1
    layers_q = None if q is not None and _gptq_skips_mtp(q) else q
    total = 0
    for n in range(s.mtp_layers):
        layer = replace(target, quant=layers_q, layer_prefix=f"{prefix}.layers.{n}")
        total += decoder_layer_bytes(layer, last)
    fc_quantized = q is not None and q.method not in _MODELOPT_FP4
    total += target.linear(f"{prefix}.fc", 2 * h, h, quantizable=fc_quantized)
    return total + target.vec(3 * h)  # norm, pre_fc_norm_hidden, pre_fc_norm_embedding


_MODELOPT_FP4 = ("modelopt:nvfp4", "modelopt:w4a16_nvfp4")
"""gatekeeper's methods of vLLM's ``ModelOptNvFp4Config`` (``get_name() == "modelopt_fp4"``)."""


def _gptq_skips_mtp(q: QuantSpec) -> bool:
    """``Qwen3_5MultiTokenPredictor``: a GPTQ checkpoint's ``dynamic`` with a ``-:`` rule
    naming ``mtp`` builds the MTP layers without quantization."""
    return q.match == "gptq" and any(p.startswith("-:") and "mtp" in p for p in q.skip_patterns)


def draft_cost(sp: Speculative, c: DraftContext, draft: ModelSpec | None) -> DraftCost:
    """The drafter's bytes on one rank; zero for the prompt-lookup methods."""
    if not sp.on_gpu:
        return DraftCost(0, 0, 0, 0)
    head = _head_model(sp, c.spec, draft)
    tp = sp.draft_tensor_parallel_size or c.tp
    if sp.method == "draft_model":
        weights = weight_plan(
            head, tp=tp, pp=1, dtype_bytes=c.dtype_bytes, quant=head.quantization
        ).max_bytes
    else:
        weights = _head_weights(sp, c, head)
    layers = range(head.num_layers)
    if sp.method == "mtp":
        layers = range(c.spec.num_layers - 1, c.spec.num_layers)
    n = c.spec.num_layers
    kv_layers = range(n, n + c.spec.mtp_layers) if sp.method == "mtp" else range(head.num_layers)
    page = page_bytes_per_token(head, tp, c.kv)
    kv = sum(page + indexer_bytes_per_token(head, i) for i in kv_layers)
    forward = forward_peak_bytes(head, layers, c.shape.max_num_batched_tokens, tp, c.dtype_bytes)
    graphs = cuda_graph_bytes(c.acc, head, layers, tp, c.shape, c.eager, cap=c.cap, base=False)
    if sp.method == "mtp":
        graphs *= c.spec.mtp_layers
    return DraftCost(weights, kv, forward, graphs)
