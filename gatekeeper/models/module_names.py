"""vLLM's names for a model class's modules, as its quantization config sees them.

vLLM asks a quantization config about each module by the name its own model class gives
it (``get_quant_method(layer, prefix)``), not by the checkpoint's name, and before that
it rewrites the config's lists the way the class maps checkpoint names
(``configure_quant_config`` in ``model_executor/model_loader/utils.py``: the class's
``hf_to_vllm_mapper.get_rename_mapper()`` applied by each config's
``apply_vllm_mapper``, and its ``packed_modules_mapping`` handed over so that a fused
module is matched through its checkpoint shards). So:

- a decoder layer is ``model.layers.N`` in a text model and ``language_model.model.layers.N``
  in the multimodal wrappers (Qwen2.5-VL, Gemma 3, Mistral 3, Llava, Llama 4), whose
  mappers turn the checkpoint's ``model.language_model.`` into ``language_model.model.``
  (and, for Qwen2-VL/2.5-VL/Mistral 3, a bare ``model.`` too);
- attention's q/k/v are one ``qkv_proj`` and a dense MLP's gate/up one ``gate_up_proj``
  (``packed_modules_mapping``); DeepSeek's ``q_a_proj`` + ``kv_a_proj_with_mqa`` are one
  ``fused_qkv_a_proj`` when ``q_lora_rank`` is set;
- routed experts are one module, ``...mlp.experts`` (Mixtral ``block_sparse_moe.experts``,
  Llama 4 ``feed_forward.experts``), whose checkpoint projections are ``gate_proj``/
  ``up_proj``/``down_proj`` (Mixtral ``w1``/``w3``/``w2``).

Each entry is read from the vLLM 0.32 model file named beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["ModuleNames", "module_names"]

_QKV = ("qkv_proj", ("q_proj", "k_proj", "v_proj"))
_GATE_UP = ("gate_up_proj", ("gate_proj", "up_proj"))
_WRAPPER_RENAMES = (
    ("model.language_model.", "language_model.model."),
    ("model.vision_tower.", "vision_tower."),
    ("model.multi_modal_projector.", "multi_modal_projector."),
    ("lm_head.", "language_model.lm_head."),
)
_VL_RENAMES = (
    ("model.language_model.", "language_model.model."),
    ("model.visual.", "visual."),
    ("lm_head.", "language_model.lm_head."),
    ("model.", "language_model.model."),
)


@dataclass(frozen=True, slots=True)
class ModuleNames:
    """How one vLLM model class names the modules a quantization config is asked about."""

    model: str = "model"
    """The decoder's prefix (``model``, ``language_model.model``, ``model.decoder``)."""
    lm_head: str = "lm_head"
    attention: str = "self_attn"
    mlp: str = "mlp"
    expert_projections: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    """The checkpoint's names of an expert's gate, up and down projections."""
    shared_experts: str = "shared_experts"
    packed: tuple[tuple[str, tuple[str, ...]], ...] = (_QKV, _GATE_UP)
    """``packed_modules_mapping``: a fused module and its checkpoint shards."""
    prefix_renames: tuple[tuple[str, str], ...] = ()
    """``hf_to_vllm_mapper.orig_to_new_prefix``, in order."""
    substr_renames: tuple[tuple[str, str], ...] = ()
    """``hf_to_vllm_mapper.orig_to_new_substr``, in order."""
    quantized_router: bool = False
    """The MoE router (``GateLinear``) is built with the quantization config (Qwen3-MoE);
    elsewhere it is not, and stays in the model dtype whatever the config says."""

    def layer(self, i: int) -> str:
        return f"{self.model}.layers.{i}"

    def to_vllm(self, name: str) -> str:
        """A checkpoint module name as the class's rename mapper writes it
        (``WeightsMapper._map_name_with_shard``: substrings, then prefixes in turn)."""
        for old, new in self.substr_renames:
            if old in name:
                name = name.replace(old, new, 1)
        for old, new in self.prefix_renames:
            if name.startswith(old):
                name = name.replace(old, new, 1)
        return name


_TEXT = ModuleNames()
_WRAPPED = ModuleNames(model="language_model.model", lm_head="language_model.lm_head")

_CLASSES: dict[str, ModuleNames] = {
    # mixtral.py: qkv packed only; MixtralMoE under block_sparse_moe, experts w1/w3/w2,
    # and a mapper turning a checkpoint's experts' gate/up/down into w1/w3/w2
    "MixtralForCausalLM": ModuleNames(
        mlp="block_sparse_moe",
        expert_projections=("w1", "w3", "w2"),
        packed=(_QKV,),
        substr_renames=((".gate_proj.", ".w1."), (".up_proj.", ".w3."), (".down_proj.", ".w2.")),
    ),
    # qwen3_moe.py: GateLinear(..., quant_config=quant_config); gate_up is packed only with
    # mlp_only_layers, the only dense MLPs it has
    "Qwen3MoeForCausalLM": ModuleNames(quantized_router=True),
    "Qwen2MoeForCausalLM": ModuleNames(shared_experts="shared_expert"),
    # deepseek_v2.py: gate_up packed; fused_qkv_a_proj added when q_lora_rank is set
    "DeepseekV2ForCausalLM": ModuleNames(packed=(_GATE_UP,)),
    "DeepseekV3ForCausalLM": ModuleNames(packed=(_GATE_UP,)),
    # gpt_oss.py: qkv packed, the mapper renames self_attn to attn
    "GptOssForCausalLM": ModuleNames(
        attention="attn", packed=(_QKV,), substr_renames=((".self_attn.", ".attn."),)
    ),
    # phi3.py: the checkpoint's qkv_proj and gate_up_proj are already fused
    "Phi3ForCausalLM": ModuleNames(
        packed=(("qkv_proj", ("qkv_proj",)), ("gate_up_proj", ("gate_up_proj",)))
    ),
    # opt.py
    "OPTForCausalLM": ModuleNames(model="model.decoder", packed=(_QKV,)),
    # gemma3_mm.py, llava.py: the wrapper's mapper, without a bare "model." rename
    "Gemma3ForConditionalGeneration": replace(_WRAPPED, prefix_renames=_WRAPPER_RENAMES),
    "LlavaForConditionalGeneration": replace(_WRAPPED, prefix_renames=_WRAPPER_RENAMES),
    # mistral3.py: the same plus "model." -> "language_model.model."
    "Mistral3ForConditionalGeneration": replace(
        _WRAPPED, prefix_renames=(*_WRAPPER_RENAMES, ("model.", "language_model.model."))
    ),
    # qwen2_vl.py, qwen2_5_vl.py
    "Qwen2VLForConditionalGeneration": replace(_WRAPPED, prefix_renames=_VL_RENAMES),
    "Qwen2_5_VLForConditionalGeneration": replace(_WRAPPED, prefix_renames=_VL_RENAMES),
    # mllama4.py: no mapper (its load_weights renames); llama4.py's feed_forward
    "Llama4ForConditionalGeneration": replace(
        _WRAPPED, mlp="feed_forward", shared_experts="shared_expert"
    ),
    "Llama4ForCausalLM": ModuleNames(mlp="feed_forward", shared_experts="shared_expert"),
    "MllamaForConditionalGeneration": _WRAPPED,
}


def module_names(architecture: str, *, q_lora_rank: int | None = None) -> ModuleNames:
    """vLLM 0.32's names for ``architecture``'s modules (a text model's by default)."""
    names = _CLASSES.get(architecture, _TEXT)
    if architecture.startswith("DeepseekV") and q_lora_rank:
        fused = ("fused_qkv_a_proj", ("q_a_proj", "kv_a_proj_with_mqa"))
        names = replace(names, packed=(*names.packed, fused))
    return names
