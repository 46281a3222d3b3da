"""LoRA slots: the GPU memory ``--enable-lora`` reserves before any adapter is loaded.

vLLM wraps every linear layer of the model (``lora/utils.py::get_supported_lora_modules``:
all ``LinearBase`` and fused-MoE modules) and gives each ``max_loras`` slots of rank
``max_lora_rank`` in ``lora_dtype`` (auto: the model dtype), allocated while the model
loads, so they are counted in "Model loading took" (``lora/layers/*.py``,
``create_lora_weights``). Per wrapped layer and slice, on one TP rank::

    lora_a = max_loras x rank_a x in_rank        lora_b = max_loras x out_rank x rank

- column-parallel (qkv with 3 slices, gate_up with 2): ``in`` whole, ``out`` split by TP;
  ``rank_a = rank / tp`` with ``--fully-sharded-loras``;
- row-parallel (o_proj, down_proj): ``in`` split by TP, ``out`` whole (split by TP with
  ``--fully-sharded-loras``);
- replicated (MLA's ``q_a_proj``, ``kv_a_proj_with_mqa``, the MoE router): nothing split;
- fused MoE: per local expert, w1 and w3 (``rank_a x H`` and ``I_rank x rank``) and w2
  (``rank x I_rank`` and ``H x rank``);
- the embedding (``vocab x rank`` and ``H x rank``, first stage) and the LM head
  (``rank x H`` and ``vocab x rank``, last stage), whole on every rank, for the
  architectures whose vLLM class declares ``embedding_modules`` (``lora_vocab``,
  generated from vLLM's sources).

``--max-cpu-loras`` sizes a host-memory cache: no GPU bytes.

Worked example: Llama-3.1-8B (H 4096, q 4096, kv 1024, I 14336, 32 layers), bf16, TP=1,
``--max-loras 8 --max-lora-rank 256``: per layer and unit of rank, qkv 3x4096 + 6144,
o 4096 + 4096, gate_up 2x4096 + 2x14336, down 14336 + 4096 = 81,920 elements;
x 256 x 8 x 32 layers x 2 B = 10,737,418,240 B = 10.0 GiB; the embedding and LM head
slots add 8 x 256 x 2 x (128,256 + 4,096) x 2 B = 1,084,227,584 B: 11.01 GiB in all.
"""

from __future__ import annotations

from dataclasses import dataclass

from gatekeeper.estimator.lora_vocab import VOCAB_LORA_ARCHITECTURES
from gatekeeper.models.spec import DTYPE_BYTES, ModelSpec
from gatekeeper.units import cdiv

__all__ = ["DEFAULT_MAX_LORAS", "DEFAULT_MAX_LORA_RANK", "LoraSlots", "lora_bytes"]

DEFAULT_MAX_LORAS = 1
DEFAULT_MAX_LORA_RANK = 16


@dataclass(frozen=True, slots=True)
class LoraSlots:
    """What ``--enable-lora`` and its companions ask for."""

    max_loras: int
    rank: int
    dtype: str
    fully_sharded: bool


@dataclass(frozen=True, slots=True)
class _Rank:
    slots: LoraSlots
    tp: int

    def column(self, in_f: int, outs: tuple[int, ...]) -> int:
        """A column-parallel layer: ``outs`` are the whole output slices."""
        r = self.slots.rank
        rank_a = cdiv(r, self.tp) if self.slots.fully_sharded else r
        return sum(rank_a * in_f + cdiv(out, self.tp) * r for out in outs)

    def row(self, in_f: int, out: int) -> int:
        """A row-parallel layer: ``in_f`` is the whole input."""
        r = self.slots.rank
        out_b = cdiv(out, self.tp) if self.slots.fully_sharded else out
        return r * cdiv(in_f, self.tp) + out_b * r

    def replicated(self, in_f: int, out: int) -> int:
        return self.slots.rank * (in_f + out)


def _attention(spec: ModelSpec, x: _Rank) -> int:
    h, tp = spec.hidden_size, x.tp
    if spec.mla is not None:
        m = spec.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        heads = spec.num_attention_heads
        total = x.replicated(h, m.kv_lora_rank + m.qk_rope_head_dim)
        if m.q_lora_rank:
            total += x.replicated(h, m.q_lora_rank) + x.column(m.q_lora_rank, (heads * qk,))
        else:
            total += x.column(h, (heads * qk,))
        total += x.column(m.kv_lora_rank, (heads * (m.qk_nope_head_dim + m.v_head_dim),))
        return total + x.row(heads * m.v_head_dim, h)
    # KV heads replicate past tp = kv_heads: each rank's k/v slice is at least one head
    kv = max(1, spec.num_kv_heads // tp) * tp
    q_out = spec.num_attention_heads * spec.head_dim
    qkv = x.column(h, (q_out, kv * spec.head_dim, kv * spec.value_head_dim))
    return qkv + x.row(spec.num_attention_heads * spec.value_head_dim, h)


def _mlp(spec: ModelSpec, x: _Rank, inter: int, *, gated: bool) -> int:
    h = spec.hidden_size
    up = x.column(h, (inter, inter) if gated else (inter,))
    return up + x.row(inter, h)


def _moe(spec: ModelSpec, x: _Rank, ep: int) -> int:
    moe = spec.moe
    assert moe is not None
    h, r = spec.hidden_size, x.slots.rank
    experts = cdiv(moe.num_experts, ep)
    inter = moe.expert_intermediate_size if ep > 1 else cdiv(moe.expert_intermediate_size, x.tp)
    rank_a = cdiv(r, x.tp) if x.slots.fully_sharded else r
    h_b = cdiv(h, x.tp) if x.slots.fully_sharded else h
    per_expert = 2 * (rank_a * h + inter * r) + (r * inter + h_b * r)
    total = experts * per_expert + x.replicated(h, moe.num_experts)  # + the router
    if moe.shared_intermediate_size:
        total += _mlp(spec, x, moe.shared_intermediate_size, gated=True)
    return total


def lora_bytes(
    spec: ModelSpec,
    layers: range,
    slots: LoraSlots,
    *,
    tp: int,
    ep: int,
    model_dtype: str,
    first: bool = True,
    last: bool = True,
) -> int:
    """Bytes of the LoRA slots of ``layers`` on one TP rank (with the embedding's on the
    ``first`` stage and the LM head's on the ``last``)."""
    x = _Rank(slots, tp)
    elements = 0
    if spec.architecture in VOCAB_LORA_ARCHITECTURES:
        vocab_slots = slots.rank * (spec.vocab_size + spec.hidden_size)
        elements += vocab_slots * (int(first) + int(last))
    for i in layers:
        if spec.layer_attention and spec.layer_attention[i] == "none":
            pass  # a layer without attention has no q/k/v/o projections to wrap
        else:
            elements += _attention(spec, x)
        if spec.moe is not None and spec.layer_moe[i]:
            elements += _moe(spec, x, ep)
        else:
            elements += _mlp(spec, x, spec.intermediate_size, gated=spec.gated_mlp)
    dtype = model_dtype if slots.dtype == "auto" else slots.dtype
    return elements * slots.max_loras * DTYPE_BYTES[dtype]
