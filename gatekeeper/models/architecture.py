"""What vLLM's model class builds for a config: gated MLP or not, biases, norms, positions.

Read from the config (filled with its class's defaults, ``config_defaults``) where the
config says it: ``attention_bias``, ``mlp_bias``, ``qkv_bias``, ``bias``, OPT's
``enable_bias``, Starcoder2's ``use_bias``; ``position_embedding_type`` (BERT family);
the norm's epsilon key (``layer_norm_eps`` and kin: a LayerNorm, weight and bias;
``rms_norm_eps``: an RMSNorm, weight only). What the config cannot say is hard-coded in
vLLM's model code (``vllm/model_executor/models/``), or in transformers' modeling code
for the architectures vLLM runs through its Transformers backend (``registry.py``:
``("transformers", "TransformersForCausalLM")``), and is kept in the tables below, each
with the file that hard-codes it; ``tests/models/test_hf_config_architecture.py`` checks
them against those files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ArchitectureFacts", "architecture_facts"]

UNGATED_MLP: dict[str, str] = {
    "gpt2": "vllm gpt2.py GPT2MLP (c_fc, c_proj)",
    "opt": "vllm opt.py OPTDecoderLayer (fc1, fc2)",
    "falcon": "vllm falcon.py FalconMLP (dense_h_to_4h, dense_4h_to_h)",
    "gptj": "vllm gpt_j.py GPTJMLP (fc_in, fc_out)",
    "bloom": "vllm bloom.py BloomMLP (dense_h_to_4h, dense_4h_to_h)",
    "bert": "vllm bert.py BertIntermediate, BertOutput",
    "roberta": "vllm roberta.py (bert.py's layers)",
    "xlm-roberta": "vllm roberta.py (bert.py's layers)",
    "nemotron": "vllm nemotron.py NemotronMLP (up_proj, down_proj)",
    "nemotron_h": "vllm nemotron_h.py NemotronHMLP (up_proj, down_proj; relu2), its experts too",
    "phi": "transformers modeling_phi.py PhiMLP (fc1, fc2)",
    "gpt_bigcode": "transformers modeling_gpt_bigcode.py GPTBigCodeMLP (c_fc, c_proj)",
    "gpt_neox": "transformers modeling_gpt_neox.py GPTNeoXMLP (dense_h_to_4h, dense_4h_to_h)",
    "starcoder2": "transformers modeling_starcoder2.py Starcoder2MLP (c_fc, c_proj)",
    "cosmos3_edge_text": "vllm cosmos3_edge.py (nemotron_h.py NemotronHMLPDecoderLayer)",
    "clip_text_model": "vllm clip.py CLIPMLP (fc1, fc2)",
    "siglip_text_model": "vllm siglip.py SiglipMLP (fc1, fc2)",
    "whisper": "vllm whisper.py WhisperMLP (fc1, fc2)",
}
"""Model types whose MLP is one up and one down projection (no gate)."""

ALL_BIASED: dict[str, str] = {
    "gpt2": "vllm gpt2.py (c_attn, c_proj, c_fc: bias=True)",
    "bloom": "vllm bloom.py (query_key_value, dense, dense_h_to_4h: bias=True)",
    "bert": "vllm bert.py (qkv_proj, dense: bias=True)",
    "roberta": "vllm roberta.py (bert.py's layers)",
    "xlm-roberta": "vllm roberta.py (bert.py's layers)",
    "phi": "transformers modeling_phi.py (q/k/v_proj, dense, fc1, fc2: bias=True)",
    "gpt_bigcode": "transformers modeling_gpt_bigcode.py (c_attn, c_proj, c_fc: nn.Linear)",
    "clip_text_model": "vllm clip.py CLIPAttention, CLIPMLP (qkv_proj, out_proj, fc1, fc2)",
    "siglip_text_model": "vllm siglip.py SiglipAttention, SiglipMLP (qkv_proj, out_proj, fc1, fc2)",
    "whisper": "vllm whisper.py WhisperAttention, WhisperMLP (qkv_proj, out_proj, fc1, fc2)",
}
"""Model types whose every projection has a bias, whatever the config says."""

QKV_BIASED: dict[str, str] = {
    "qwen2": "vllm qwen2.py Qwen2Attention (qkv_proj bias=True, o_proj bias=False)",
    "qwen2_moe": "vllm qwen2_moe.py Qwen2MoeAttention (qkv_proj bias=True)",
    "qwen2_vl": "vllm qwen2_vl.py (Qwen2Model's layers)",
    "qwen2_5_vl": "vllm qwen2_5_vl.py (Qwen2Model's layers)",
    # the nested layout (transformers >= 4.52 writes text_config with these model types):
    # the wrapper builds Qwen2ForCausalLM from it (init_vllm_registered_model,
    # architectures=["Qwen2ForCausalLM"] in qwen2_vl.py and qwen2_5_vl.py)
    "qwen2_vl_text": "vllm qwen2_vl.py (Qwen2ForCausalLM from text_config)",
    "qwen2_5_vl_text": "vllm qwen2_5_vl.py (Qwen2ForCausalLM from text_config)",
}
"""Model types with a q/k/v bias and no other, whatever the config says."""

QK_NORM: dict[str, str] = {
    "qwen3": "vllm qwen3.py Qwen3Attention (q_norm, k_norm)",
    "qwen3_moe": "vllm qwen3_moe.py Qwen3MoeAttention (q_norm, k_norm)",
    "gemma3": "vllm gemma3.py Gemma3Attention (q_norm, k_norm)",
    "gemma3_text": "vllm gemma3.py Gemma3Attention (q_norm, k_norm)",
    "gemma4_text": "vllm gemma4.py Gemma4Attention (q_norm, k_norm; v_norm has no weight)",
    "qwen3_vl_text": "vllm qwen3.py Qwen3DecoderLayer (qwen3_vl.py's language model)",
    "qwen3_vl_moe_text": "vllm qwen3_moe.py Qwen3MoeDecoderLayer (qwen3_vl_moe.py's)",
    "qwen3_next": "vllm qwen3_next.py Qwen3NextAttention (q_norm, k_norm)",
    "qwen3_5_text": "vllm qwen3_next.py Qwen3NextAttention (qwen3_5.py's decoder layer builds it)",
    "qwen3_5_moe_text": "vllm qwen3_next.py Qwen3NextAttention (qwen3_5.py's decoder layer)",
    "olmo2": "transformers modeling_olmo2.py Olmo2Attention (q_norm, k_norm)",
    "minimax_m3_text": "vllm ../../models/minimax_m3/nvidia/model.py MiniMaxM3Attention (q_norm, k_norm)",
}
"""Model types that normalize queries and keys per head."""

NORMS_PER_LAYER: dict[str, int] = {
    "gemma2": 4, "gemma3": 4, "gemma3_text": 4, "gemma4_text": 4, "phi": 1, "gptj": 1,
    "whisper": 3,  # vllm whisper.py: self_attn_, encoder_attn_ and final_layer_norm
    "zamba2": 1, "hrm_text": 0,
}  # fmt: skip
"""Norm modules per decoder layer where not two: Gemma 2/3/4 add pre/post-feedforward norms
(vllm gemma2.py, gemma3.py, gemma4.py); Phi and GPT-J run attention and MLP in parallel after one
norm (transformers modeling_phi.py ``input_layernorm``; vllm gpt_j.py ``ln_1``); Zamba2's
layers have the Mamba decoder's ``input_layernorm`` (vllm zamba2.py; a shared block's own
norms are counted with the block); HRM-Text's norms have no weight (vllm hrm_text.py
``RMSNorm(..., has_weight=False)``)."""

_LAYER_NORM_EPS = ("layer_norm_eps", "layer_norm_epsilon", "layernorm_epsilon")
_LAYER_NORM_TYPES = frozenset({"opt", "whisper"})  # vllm opt.py, whisper.py: nn.LayerNorm
_BERT_EMBEDDINGS = frozenset({"bert", "roberta", "xlm-roberta"})  # vllm bert.py, roberta.py
_WPE = frozenset({"gpt2", "gpt_bigcode", "clip_text_model", "siglip_text_model", "whisper"})
"""A learned position table (vllm gpt2.py wte + wpe; modeling_gpt_bigcode.py; clip.py and
siglip.py's text embeddings' ``position_embedding``; whisper.py's decoder ``embed_positions``)."""
OPT_POSITION_OFFSET = 2
"""OPT's learned position table has two rows more (vllm opt.py OPTLearnedPositionalEmbedding)."""


@dataclass(frozen=True, slots=True)
class ArchitectureFacts:
    gated_mlp: bool
    qkv_bias: bool
    output_bias: bool
    mlp_bias: bool
    qk_norm: bool
    norm_vectors: int
    """Norm weight (and bias) vectors of width ``hidden_size`` per layer."""
    learned_positions: int
    """Rows of learned absolute position (and token type) tables; 0 for rotary models."""


def _config_bias(cfg: Mapping[str, Any]) -> tuple[bool, bool, bool]:
    """(qkv, o, mlp) biases as the config says them (vllm llama.py reads ``attention_bias``
    or ``bias`` for q/k/v and o, ``qkv_bias`` for q/k/v alone)."""
    attention = bool(cfg.get("attention_bias") or cfg.get("bias"))
    for key in ("enable_bias", "use_bias"):  # OPT, Starcoder2: every projection
        if cfg.get(key):
            return True, True, True
    qkv = bool(cfg["qkv_bias"]) if cfg.get("qkv_bias") is not None else attention
    return qkv, attention, bool(cfg.get("mlp_bias") or cfg.get("bias"))


def _positions(cfg: Mapping[str, Any], model_type: str, max_pos: int) -> int:
    if model_type == "opt":
        return max_pos + OPT_POSITION_OFFSET
    if model_type in _WPE:
        return max_pos
    # BERT family, and token types; vllm bert.py BertEmbeddings reads an absent
    # position_embedding_type as "absolute" (transformers 5's BertConfig has no default)
    default = "absolute" if model_type in _BERT_EMBEDDINGS else None
    if cfg.get("position_embedding_type", default) == "absolute":
        return max_pos + int(cfg.get("type_vocab_size") or 0)
    return 0


def architecture_facts(cfg: Mapping[str, Any], model_type: str, max_pos: int) -> ArchitectureFacts:
    """The facts of ``cfg`` (the text config, with its class's defaults)."""
    qkv, out, mlp = _config_bias(cfg)
    if model_type in ALL_BIASED:
        qkv = out = mlp = True
    qkv = qkv or model_type in QKV_BIASED
    layer_norm = model_type in _LAYER_NORM_TYPES or (
        cfg.get("rms_norm_eps") is None and any(cfg.get(k) is not None for k in _LAYER_NORM_EPS)
    )
    norms = NORMS_PER_LAYER.get(model_type, 2)
    return ArchitectureFacts(
        gated_mlp=model_type not in UNGATED_MLP,
        qkv_bias=qkv,
        output_bias=out,
        mlp_bias=mlp,
        qk_norm=model_type in QK_NORM,
        norm_vectors=norms * (2 if layer_norm else 1),
        learned_positions=_positions(cfg, model_type, max_pos),
    )
