"""Recurrent state and mixer weights of hybrid and attention-free models, per TP rank.

State per sequence and layer (``model_executor/layers/mamba/mamba_utils.py``,
``MambaStateShapeCalculator`` and ``MambaStateDtypeCalculator``); ``k`` = conv kernel,
``s`` = draft tokens of speculative decoding:

- Mamba-1: conv ``I/tp x (k-1)``, SSM ``I/tp x d_state``;
- Mamba-2: conv ``(I + 2 G' d_state)/tp x (k-1+s)`` with ``G'`` the groups padded to a
  multiple of TP when they do not divide it, SSM ``heads/tp x head_dim x d_state``;
- gated delta net: conv ``(2 Kh Kd + Vh Vd)/tp x (k-1+s)``, SSM ``Vh/tp x Vd x Kd``;
- short conv: ``C/tp x (k-1+s)``;
- lightning linear attention: ``heads/tp x d x d``;
- Kimi delta attention: conv ``(h d + 2 h d)/tp x (k-1+s)``, recurrent ``h/tp x d x d``.

The conv state is in ``--mamba-cache-dtype`` (auto: the model dtype), the SSM state in
``--mamba-ssm-cache-dtype`` (auto: the conv state's dtype; float32 for KDA, and for
Nemotron-H unless its config says otherwise).

Worked example: Granite 4.0-H Small (H 4096, Mamba-2 with 128 heads of 64, 1 group,
d_state 128, k 4, expand 2 so I = 8192), bf16, TP=1: conv (8192 + 256) x 3 x 2 B =
50,688 B, SSM 128 x 64 x 128 x 2 B = 2,097,152 B: 2,147,840 B per sequence and layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from gatekeeper.models.spec import DTYPE_BYTES, ModelSpec, StateSpec
from gatekeeper.units import cdiv

__all__ = ["MixerLinear", "mixer_linears", "mixer_weight_bytes", "state_bytes"]


def _groups(state: StateSpec, tp: int) -> int:
    """``extra_groups_for_head_shards``: groups padded so every head shard has its own."""
    g = state.n_groups
    return g if g % tp == 0 else g + tp - g


def state_bytes(
    state: StateSpec,
    tp: int,
    model_dtype: str,
    *,
    cache_dtype: str = "auto",
    ssm_cache_dtype: str = "auto",
    speculative_tokens: int = 0,
) -> int:
    """Bytes of one layer's recurrent state for one sequence on one TP rank."""
    conv_b = DTYPE_BYTES[model_dtype if cache_dtype == "auto" else cache_dtype]
    if ssm_cache_dtype != "auto":
        ssm_b = DTYPE_BYTES[ssm_cache_dtype]
    elif state.kind == "kda":
        ssm_b = 4
    elif state.ssm_dtype:
        ssm_b = DTYPE_BYTES[state.ssm_dtype]
    else:
        ssm_b = conv_b
    width = state.conv_kernel - 1 + speculative_tokens
    kind = state.kind
    if kind == "mamba1":
        inner = cdiv(state.intermediate_size, tp)
        return inner * (state.conv_kernel - 1) * conv_b + inner * state.state_size * ssm_b
    if kind == "mamba2":
        conv_dim = state.intermediate_size + 2 * _groups(state, tp) * state.state_size
        ssm = cdiv(state.num_heads, tp) * state.head_dim * state.state_size
        return cdiv(conv_dim, tp) * width * conv_b + ssm * ssm_b
    if kind == "gdn":
        conv_dim = 2 * state.num_k_heads * state.head_k_dim + state.num_heads * state.head_dim
        ssm = cdiv(state.num_heads, tp) * state.head_dim * state.head_k_dim
        return cdiv(conv_dim, tp) * width * conv_b + ssm * ssm_b
    if kind == "short_conv":
        return cdiv(state.intermediate_size, tp) * width * conv_b
    if kind == "linear_attention":
        return cdiv(state.num_heads, tp) * state.head_dim * state.head_dim * conv_b
    # kda
    conv_dim = 3 * state.num_heads * state.head_dim
    recurrent = cdiv(state.num_heads, tp) * state.head_dim * state.head_dim
    return cdiv(conv_dim, tp) * width * conv_b + recurrent * ssm_b


@dataclass(frozen=True, slots=True)
class MixerLinear:
    """One of a state mixer's linears that vLLM builds with the quantization config: its
    name under the mixer, its input width and its output shards on one rank (the
    ``output_sizes`` of a ``MergedColumnParallelLinear``: one scheme, per-shard scales)."""

    name: str
    in_features: int
    outs: tuple[int, ...]


def mixer_linears(
    spec: ModelSpec, tp: int, *, replicated_ba: bool = False
) -> tuple[MixerLinear, ...]:
    """The mixer linears vLLM builds with ``quant_config`` (and so quantizes as the
    config says), per rank; the rest of the mixer stays in the model dtype.

    The gated delta net (``layers/mamba/gdn/qwen_gdn_linear_attn.py``,
    ``QwenGatedDeltaNetAttention``): ``in_proj_qkvz`` (H -> q, k, v, z), ``in_proj_ba``
    (H -> b, a, one per value head each) and ``out_proj`` (Vh Vd -> H). Qwen3.5/3.6
    (``gqa_interleaved_layout=False``: the checkpoint's ``in_proj_qkv`` + ``in_proj_z``
    and ``in_proj_b`` + ``in_proj_a``) build them as four and two output shards;
    Qwen3-Next (its checkpoint fuses them, interleaved by key-head group) as one each.
    ``replicated_ba``: vLLM replicates Qwen3.5's ``in_proj_ba`` on every rank under
    AWQ, GPTQ and INC on CUDA (``maybe_disable_tp``: Marlin needs 64 output rows).
    Its ``conv1d`` is built without the config (model dtype).

    Mamba-2 (``mamba_mixer2.py``): ``in_proj`` (H -> z, x, B, C, dt: five shards when the
    groups divide TP, else one) and ``out_proj`` (I -> H). The short convolution
    (``short_conv.py``, LFM2): ``in_proj`` (three shards of C) and ``out_proj``. Mamba-1
    (``mamba_mixer.py``), lightning attention and KDA: none here (Mamba-1's are built
    without the config; the others are sized whole in the model dtype)."""
    s = spec.state
    if s is None:
        return ()
    h = spec.hidden_size
    if s.kind == "mamba2":
        # the groups as ``mixer_weight_bytes`` counts them: the extra groups vLLM adds when
        # they do not divide TP are not modelled in the weights
        i, heads = s.intermediate_size // tp, s.num_heads // tp
        gn = s.n_groups * s.state_size // tp
        shards = (i, i, gn, gn, heads) if s.n_groups % tp == 0 else (2 * i + 2 * gn + heads,)
        return (MixerLinear("in_proj", h, shards), MixerLinear("out_proj", i, (h,)))
    if s.kind == "short_conv":
        c = s.intermediate_size // tp
        return (MixerLinear("in_proj", h, (c, c, c)), MixerLinear("out_proj", c, (h,)))
    if s.kind != "gdn":
        return ()
    k = s.num_k_heads * s.head_k_dim // tp
    v = s.num_heads * s.head_dim // tp
    heads = s.num_heads // tp
    qkvz: tuple[int, ...]
    ba: tuple[int, ...]
    if s.gqa_interleaved:
        qkvz, ba = (2 * k + 2 * v,), (2 * heads,)
    else:
        qkvz = (k, k, v, v)
        ba = (s.num_heads, s.num_heads) if replicated_ba and tp > 1 else (heads, heads)
    return (
        MixerLinear("in_proj_qkvz", h, qkvz),
        MixerLinear("in_proj_ba", h, ba),
        MixerLinear("out_proj", v, (h,)),
    )


def _gdn_vector_bytes(s: StateSpec, tp: int, dtype_bytes: int) -> int:
    """The gated delta net's weights besides its linears: ``conv1d`` ((2 Kh Kd + Vh Vd)/tp
    x k), ``dt_bias`` (Vh/tp, model dtype), ``A_log`` (Vh/tp, float32 whatever the model
    dtype) and the gated norm (Vd, whole on every rank)."""
    conv = (2 * s.num_k_heads * s.head_k_dim + s.num_heads * s.head_dim) // tp * s.conv_kernel
    heads = s.num_heads // tp
    return (conv + heads + s.head_dim) * dtype_bytes + heads * 4


def mixer_weight_bytes(spec: ModelSpec, tp: int, dtype_bytes: int) -> int:
    """One state mixer's weights on one TP rank, in the model dtype (the projections of
    ``mamba_mixer.py``, ``mamba_mixer2.py``, the gated delta net, ``short_conv.py``):

    - Mamba-1: in_proj H -> 2I, conv1d I x k (+bias), x_proj I -> r + 2N, dt_proj r -> I
      (+bias), A I x N, D I, out_proj I -> H;
    - Mamba-2: in_proj H -> 2I + 2GN + heads, conv1d (I + 2GN) x k (+bias), dt_bias, A, D
      (heads), a gated norm I, out_proj I -> H;
    - gated delta net: ``mixer_linears`` (in_proj_qkvz H -> 2 Kh Kd + 2 Vh Vd, in_proj_ba
      H -> 2 Vh, out_proj Vh Vd -> H) and ``_gdn_vector_bytes`` (conv1d, dt_bias, A_log in
      float32, the gated norm);
    - short conv: in_proj H -> 3C, conv1d C x k, out_proj C -> H;
    - linear attention and KDA: q, k, v, a gate and out_proj, ``heads x d`` wide.
    """
    s = spec.state
    assert s is not None
    h = spec.hidden_size
    if s.kind == "mamba1":
        i, n, r = s.intermediate_size, s.state_size, s.dt_rank
        elements = (
            h * 2 * i + i * s.conv_kernel + i + i * (r + 2 * n) + r * i + i + i * n + i + i * h
        )
        return cdiv(elements, tp) * dtype_bytes
    if s.kind == "mamba2":
        i, gn = s.intermediate_size, 2 * s.n_groups * s.state_size
        conv = (i + gn) * (s.conv_kernel + 1)
        elements = h * (2 * i + gn + s.num_heads) + conv + 3 * s.num_heads + i + i * h
        return cdiv(elements, tp) * dtype_bytes
    if s.kind == "gdn":
        linears = sum(m.in_features * sum(m.outs) for m in mixer_linears(spec, tp))
        return linears * dtype_bytes + _gdn_vector_bytes(s, tp, dtype_bytes)
    if s.kind == "short_conv":
        c = s.intermediate_size
        return cdiv(h * 3 * c + c * s.conv_kernel + c * h, tp) * dtype_bytes
    width = s.num_heads * s.head_dim
    return cdiv(5 * h * width, tp) * dtype_bytes
