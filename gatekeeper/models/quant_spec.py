"""``QuantSpec``: how one module's weights are stored on the GPU, and which modules a
quantization leaves alone.

A spec is the scheme of the checkpoint's default quantized linear, plus ``overrides``
(per-module schemes: compressed-tensors ``config_groups``, ModelOpt mixed precision,
Quark ``layer_quant_config``) and ``skip_patterns`` (``ignore``, ``modules_to_not_convert``,
``exclude_modules``, ``llm_int8_skip_modules`` …), matched the way the method's vLLM config
class matches them (``match``, see ``quant_match``). ``for_model(names)`` gives the spec as
vLLM holds it for one model class (its lists in vLLM's module names, its fused modules
known: ``module_names``); ``scheme_for(name)`` then answers with the scheme a module
(vLLM's name, ``model.layers.0.self_attn.qkv_proj``) gets, or ``None`` when it stays in the
model dtype.

Bytes of one rank-local projection ``[out, in]`` (``linear_bytes``), from the
``create_weights`` of each vLLM method:

- packed weights ``in x out x bits / 8``;
- group scales ``ceil(in / g) x out x scale_bytes`` (``g = 0``: one per output row,
  ``g = -1``: one per tensor; ``scale_bytes = 0`` means the model dtype), packed zero
  points ``zero_bits`` per group, an int32 ``g_idx[in]`` with act-order, or
  ``ceil(out / bn) x ceil(in / bk)`` block scales;
- ``tensor_scale_bytes`` per projection: per-tensor fp32 scales (FP8 ``input_scale``,
  NVFP4 ``weight_scale_2``/``input_scale``), compressed-tensors ``weight_shape``.

bitsandbytes 4-bit: ``in x out / 2`` uint8 plus an fp32 ``absmax`` per 64 weights and a
16-entry fp32 code (64 B), with or without double quantization (vLLM's loader
dequantizes the nested absmax to fp32 at load, ``_dequantize_dq``): 4.5 bits.
8-bit: int8 ``[out, in]`` plus an fp32 ``SCB`` per output row.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gatekeeper.errors import ModelSpecError
from gatekeeper.models.module_names import ModuleNames
from gatekeeper.models.quant_match import override, skipped
from gatekeeper.units import cdiv

__all__ = ["QuantSpec"]

_BNB_BLOCK = 64
_BNB_CODE_BYTES = 16 * 4


@dataclass(frozen=True, slots=True)
class QuantSpec:
    """How the linear weights are stored on the GPU."""

    method: str
    weight_bits: int
    group_size: int = 0
    """Weights per scale along the input dimension; 0 = one scale per output channel,
    -1 = one scale per tensor."""
    scale_bytes: int = 2
    """Bytes of one scale; 0 = the model dtype."""
    zero_bits: int = 0
    """Bits of a packed zero point per group (AWQ/GPTQ store 4-bit zeros in int32)."""
    block: tuple[int, int] | None = None
    """Block quantization (rows, cols) with one scale per block (FP8 128x128)."""
    act_order: bool = False
    double_quant: bool = False
    experts_only: bool = False
    """Only MoE experts are quantized (MXFP4, experts_int8); linears stay in the model dtype."""
    lm_head: bool = False
    """The LM head may be quantized (AWQ/GPTQ ``lm_head``, a compressed-tensors target,
    ModelOpt unless excluded): ``scheme_for(..., lm_head=True)`` decides."""
    skip_patterns: tuple[str, ...] = ()
    source: str = "checkpoint"
    tensor_scale_bytes: int = 0
    """Bytes per projection (per shard of a fused module) beside the weight and its group
    scales: per-tensor scales, which vLLM keeps per logical shard."""
    module_scale_bytes: int = 0
    """Bytes per module, fused or not (fp_quant's global scales and Hadamard matrix)."""
    overrides: tuple[tuple[str, QuantSpec], ...] = ()
    """(module pattern, scheme) pairs that win over the default scheme, first match first."""
    linear: bool = True
    """The default scheme applies to every linear; False when only ``overrides`` are
    quantized (a compressed-tensors config without a ``Linear`` target, ModelOpt
    mixed precision)."""
    removed_in: str = ""
    """The vLLM release that no longer loads this method (bitsandbytes), if any."""
    match: str = "exact"
    """How the config's lists name modules (``quant_match``): ``exact`` (fp8),
    ``substring`` (AWQ), ``compressed-tensors``, ``modelopt``, ``quark``, ``gptq``, ..."""
    maps_names: bool = True
    """The config rewrites its lists with the model class's rename mapper
    (``apply_vllm_mapper``); MoE-WNA16, MXFP4 and FBGEMM do not."""
    experts_scheme: QuantSpec | None = None
    """The routed experts' own scheme (MoE-WNA16), when not the default one."""
    packed: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """The model class's ``packed_modules_mapping`` (set by ``for_model``)."""
    expert_projections: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    symmetric: bool = True
    """Weights without zero points where the format allows (GPTQ ``sym``); MoE-WNA16
    then stores none for the experts."""
    quantized_only: tuple[str, ...] = ()
    """GPTQ's ``modules_in_block_to_quantize``: when given, a linear none of whose
    names contains one stays in the model dtype."""

    def for_model(self, names: ModuleNames) -> QuantSpec:
        """This config as vLLM holds it for one model class (``configure_quant_config``):
        its lists rewritten by the class's rename mapper, its fused modules known."""
        skips, pairs, only = self.skip_patterns, self.overrides, self.quantized_only
        if self.maps_names:
            skips = tuple(_mapped(p, names, self.match) for p in _split_wildcards(self))
            pairs = tuple((_mapped(p, names, self.match), q) for p, q in pairs)
            only = tuple(names.to_vllm(p) for p in only)
        return replace(
            self,
            skip_patterns=skips,
            overrides=pairs,
            quantized_only=only,
            packed=names.packed,
            expert_projections=names.expert_projections,
        )

    def skips(self, module_name: str, *, experts: bool = False) -> bool:
        """True when ``module_name`` (vLLM's name) is listed as not converted."""
        return skipped(
            self.match, module_name, self.skip_patterns, dict(self.packed), experts=experts
        )

    def scheme_for(
        self, module_name: str, *, experts: bool = False, lm_head: bool = False
    ) -> QuantSpec | None:
        """The scheme ``module_name`` (vLLM's name) is stored with, or None for the model
        dtype. ``experts``: the module is routed experts (``model.layers.3.mlp.experts``);
        compressed-tensors asks about expert 0's checkpoint projections, as vLLM does
        (``CompressedTensorsMoEMethod.get_moe_method``)."""
        if experts and self.match == "compressed-tensors":
            return self._ct_experts(module_name)
        if self.skips(module_name, experts=experts):
            return None
        packed = dict(self.packed)
        only = self.quantized_only
        if only and not experts and not skipped("substring", module_name, only, packed):
            return None  # gptq_utils.py: is_layer_gptq_quantized
        named = override(self.match, module_name, [p for p, _ in self.overrides], packed)
        if named is not None:
            return dict(self.overrides)[named]
        if experts and self.experts_scheme is not None:
            return self.experts_scheme
        if self.experts_only and not experts:
            return None
        if lm_head and self.match == "compressed-tensors":
            return None  # ParallelLMHead is no "Linear": only a target naming it
        return self if self.linear else None

    def _ct_experts(self, module_name: str) -> QuantSpec | None:
        found = {self.scheme_for(f"{module_name}.0.{proj}") for proj in self.expert_projections}
        if len(found) > 1:
            raise ModelSpecError(
                f"quantization_config: the experts of {module_name} have several schemes; "
                "vLLM requires one scheme for an MoE layer's gate, up and down projections "
                "and refuses to load it; give them one config group",
                field="quantization_config",
                value=module_name,
            )
        return found.pop()

    @property
    def label(self) -> str:
        return f"{self.method} ({self.source})"

    def linear_bytes(self, in_features: int, out_features: int, dtype_bytes: int) -> int:
        """Bytes of one rank-local linear weight ``[out, in]`` in this format."""
        return self.module_bytes(in_features, (out_features,), dtype_bytes)

    def module_bytes(self, in_features: int, outs: tuple[int, ...], dtype_bytes: int) -> int:
        """Bytes of one rank-local module whose output concatenates ``outs`` (the shards
        of ``QKVParallelLinear``/``MergedColumnParallelLinear``, an expert's w13): per-shard
        scales per shard (vLLM keeps one per logical shard), the act-order ``g_idx[in]``
        and ``module_scale_bytes`` once."""
        shards = sum(
            in_features * out * self.weight_bits // 8
            + self._scale_bytes(in_features, out, dtype_bytes)
            + self.tensor_scale_bytes
            for out in outs
        )
        g_idx = in_features * 4 if self.act_order else 0
        return shards + g_idx + self.module_scale_bytes

    def _scale_bytes(self, in_features: int, out_features: int, dtype_bytes: int) -> int:
        if self.method.startswith("bitsandbytes"):
            return self._bnb_scale_bytes(in_features * out_features, out_features)
        scale = self.scale_bytes if self.scale_bytes > 0 else dtype_bytes
        if self.block is not None:
            rows, cols = self.block
            return cdiv(out_features, rows) * cdiv(in_features, cols) * scale
        if self.group_size < 0:
            return scale
        groups = 1 if self.group_size == 0 else cdiv(in_features, self.group_size)
        scales = groups * out_features * scale
        zeros = groups * out_features * self.zero_bits // 8
        return scales + zeros

    def _bnb_scale_bytes(self, numel: int, out_features: int) -> int:
        if self.weight_bits == 8:
            return out_features * 4
        # double quantization is undone at load: the absmax is fp32 either way
        return cdiv(numel, _BNB_BLOCK) * 4 + _BNB_CODE_BYTES

    def tensor_bytes(self, name: str, dtype: str, num_bytes: int) -> int | None:
        """GPU bytes of a pre-quantized checkpoint tensor whose size is not its on-disk
        size cast to the model dtype, or None for the usual rule.

        Scales vLLM creates in fp32 stay fp32 (``weight_scale``, ``input_scale``,
        ``weight_scale_inv``, ``weight_scale_2``); bitsandbytes' ``absmax`` becomes fp32
        (4 B per 64-weight block, from a uint8 one under double quantization), its
        nested statistics are freed and its JSON quant state stays on the CPU."""
        leaf = name.rsplit(".", 1)[-1]
        if self.method.startswith("bitsandbytes"):
            if leaf == "absmax":
                return num_bytes * 4 if dtype == "U8" else num_bytes
            if leaf.startswith(("nested_", "quant_state")) or "bitsandbytes__" in leaf:
                return 0
            if leaf == "quant_map":
                return num_bytes
        if dtype == "F32" and (leaf.endswith(("_scale", "_scale_inv", "_scale_2"))):
            return num_bytes
        return None


def _split_wildcards(spec: QuantSpec) -> list[str]:
    """ModelOpt's ``apply_vllm_mapper`` turns ``path*`` into ``path`` and ``path.*``."""
    if spec.match != "modelopt":
        return list(spec.skip_patterns)
    out: list[str] = []
    for p in spec.skip_patterns:
        split = len(p) >= 2 and p[-1] == "*" and p[-2] != "."
        out += [p[:-1], p[:-1] + ".*"] if split else [p]
    return out


def _mapped(pattern: str, names: ModuleNames, match: str) -> str:
    """A listed name through the class's rename mapper; compressed-tensors maps only
    layer paths (a dot, no ``re:``), so class names and regexes stay as written."""
    if match == "compressed-tensors" and ("." not in pattern or pattern.startswith("re:")):
        return pattern
    return names.to_vllm(pattern)
