"""Published configs read with transformers' config class defaults, as vLLM reads them.

Each config below is the model's config.json as published on the hub (copied field by
field, no download); each parameter count is computed by hand from the architecture.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import Any

import pytest

from gatekeeper.errors import ModelSpecError
from gatekeeper.estimator.weights import parameter_count
from gatekeeper.models.catalog import catalog_entries, find_in_catalog
from gatekeeper.models.config_defaults import class_defaults
from gatekeeper.models.hf_config import _read, spec_from_config, written_out
from gatekeeper.models.spec import ModelSpec

GPT2: dict[str, Any] = {
    "activation_function": "gelu_new",
    "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1,
    "bos_token_id": 50256,
    "embd_pdrop": 0.1,
    "eos_token_id": 50256,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "model_type": "gpt2",
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_layer": 12,
    "n_positions": 1024,
    "resid_pdrop": 0.1,
    "summary_activation": None,
    "summary_first_dropout": 0.1,
    "summary_proj_to_labels": True,
    "summary_type": "cls_index",
    "summary_use_proj": True,
    "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
    "vocab_size": 50257,
}
# gpt2: 12 x (c_attn 768x2304+2304, c_proj 768x768+768, c_fc 768x3072+3072,
# c_proj 3072x768+768, 2 LayerNorms 4x768) + wte 50257x768 + wpe 1024x768 + ln_f 2x768
GPT2_PARAMETERS = 12 * 7_087_872 + 50257 * 768 + 1024 * 768 + 2 * 768  # 124,439,808

LLAMA_7B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "initializer_range": 0.02,
    "max_sequence_length": 2048,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "pad_token_id": 0,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "transformers_version": "4.28.0.dev0",
    "use_cache": True,
    "vocab_size": 32000,
}
# 32 x (4 x 4096^2 + 3 x 4096 x 11008 + 2 x 4096) + 2 x 32000 x 4096 + 4096
LLAMA_7B_PARAMETERS = 6_738_415_616

_GEMMA3_TOP: dict[str, Any] = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "initializer_range": 0.02,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
}
_ROPE = {"factor": 8.0, "rope_type": "linear"}
GEMMA3_TEXT: dict[str, dict[str, Any]] = {
    "google/gemma-3-4b-it": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": _ROPE,
        "sliding_window": 1024,
    },
    "google/gemma-3-12b-it": {
        "hidden_size": 3840,
        "intermediate_size": 15360,
        "model_type": "gemma3_text",
        "num_attention_heads": 16,
        "num_hidden_layers": 48,
        "num_key_value_heads": 8,
        "rope_scaling": _ROPE,
        "sliding_window": 1024,
    },
    "google/gemma-3-27b-it": {
        "head_dim": 128,
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "model_type": "gemma3_text",
        "num_attention_heads": 32,
        "num_hidden_layers": 62,
        "num_key_value_heads": 16,
        "query_pre_attn_scalar": 168,
        "rope_scaling": _ROPE,
        "sliding_window": 1024,
    },
}
GEMMA3_PARAMETERS = {  # published: the model cards' 4.3B, 12.2B, 27.4B (safetensors)
    "google/gemma-3-4b-it": 4_300_079_472,
    "google/gemma-3-12b-it": 12_187_325_040,
    "google/gemma-3-27b-it": 27_432_406_640,
}


def _gemma3(repo: str) -> dict[str, Any]:
    return {**_GEMMA3_TOP, "text_config": GEMMA3_TEXT[repo]}


def _arch(spec: ModelSpec) -> ModelSpec:
    """The architecture facts alone (not where they were read from)."""
    return dataclasses.replace(spec, source="", declared_parameters=None, notes=())


def _within(count: int, published: int, tolerance: float = 0.01) -> bool:
    return abs(count - published) <= tolerance * published


def test_gpt2_reads_n_inner_and_tying_from_its_class():
    spec = spec_from_config(GPT2, name="gpt2")
    assert spec.intermediate_size == 4 * 768  # no n_inner: vllm gpt2.py's 4 x n_embd
    assert spec.tie_word_embeddings  # GPT2Config's default
    assert spec.learned_position_embeddings == 1024
    assert spec.rotary_dim == 0
    assert not spec.gated_mlp and spec.attention_bias and spec.mlp_bias
    assert _within(parameter_count(spec), GPT2_PARAMETERS, 0.001)


def test_llama_7b_reads_its_length_from_llamaconfig():
    spec = spec_from_config(LLAMA_7B, name="huggyllama/llama-7b")
    assert spec.max_position_embeddings == 2048
    assert spec.head_dim == 128 and spec.num_kv_heads == 32
    assert parameter_count(spec) == LLAMA_7B_PARAMETERS


def test_max_sequence_length_alone_is_a_length():
    config = {**LLAMA_7B, "model_type": "not-in-transformers", "max_sequence_length": 4096}
    assert spec_from_config(config, name="x").max_position_embeddings == 4096


@pytest.mark.parametrize("repo", sorted(GEMMA3_TEXT))
def test_gemma3_published_configs_read_as_the_catalog_writes_them_out(repo):
    published = spec_from_config(_gemma3(repo), name=repo)
    entry = find_in_catalog(repo)
    assert entry is not None
    assert _arch(published) == _arch(spec_from_config(entry.config, name=repo))
    assert _within(parameter_count(published), GEMMA3_PARAMETERS[repo])


def test_gemma3_4b_defaults_are_gemma3textconfig_s():
    spec = spec_from_config(_gemma3("google/gemma-3-4b-it"), name="google/gemma-3-4b-it")
    assert (spec.num_attention_heads, spec.num_kv_heads, spec.head_dim) == (8, 4, 256)
    assert (spec.vocab_size, spec.max_position_embeddings) == (262208, 131072)
    assert spec.tie_word_embeddings
    assert spec.layer_attention.count("full") == 34 // 6  # every 6th layer full


def test_experts_per_token_under_gemma4s_name():
    config = {
        "model_type": "not-in-transformers",
        "hidden_size": 1024,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "vocab_size": 1000,
        "max_position_embeddings": 4096,
        "intermediate_size": 2048,
        "num_experts": 8,
        "top_k_experts": 2,
        "moe_intermediate_size": 512,
    }
    moe = spec_from_config(config, name="x").moe
    assert moe is not None and moe.experts_per_token == 2


def test_a_catalog_model_does_not_import_transformers():
    code = (
        "import sys; from gatekeeper.models.source import resolve_model; "
        "resolve_model('meta-llama/Llama-3.1-8B-Instruct'); "
        "assert 'transformers' not in sys.modules, 'transformers imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


WRITTEN_OUT = [e for e in catalog_entries() if written_out(e.config) and not e.implicit_defaults]
IMPLICIT = [e for e in catalog_entries() if e.implicit_defaults]


def test_the_catalog_configs_that_leave_defaults_implicit():
    implicit = {e.repo_id for e in catalog_entries()} - {e.repo_id for e in WRITTEN_OUT}
    implicit -= {e.repo_id for e in IMPLICIT}  # marked: read with the defaults filled in
    assert all(r.startswith(("google/gemma-", "meta-llama/Llama-4-")) for r in implicit - {
        "facebook/opt-125m", "TechxGenus/DeepSeek-Coder-V2-Lite-Instruct-AWQ",
        "XiaomiMiMo/MiMo-V2-Flash"})  # fmt: skip
    assert "meta-llama/Llama-3.1-8B-Instruct" not in implicit


@pytest.mark.parametrize("entry", WRITTEN_OUT, ids=lambda e: e.repo_id)
def test_the_class_defaults_change_nothing_in_a_catalog_config(entry):
    """A catalog config read as written (no transformers import) says all its class
    would default: the reading with the defaults filled is the same."""
    filled = class_defaults(entry.config)
    assert not filled.note
    as_read = spec_from_config(entry.config, name=entry.repo_id)
    assert _arch(spec_from_config(filled.config, name="not-the-catalog")) == _arch(
        dataclasses.replace(as_read, name="not-the-catalog")
    )


@pytest.mark.parametrize("entry", IMPLICIT, ids=lambda e: e.repo_id)
def test_a_catalog_config_marked_implicit_reads_otherwise_with_the_defaults(entry):
    """``implicit_defaults`` is needed: the reading with the class defaults filled in (the
    one the catalog then takes, as vLLM's transformers does) differs from the config as
    written (transformers 5 configs: Gemma 4's per-layer heads, Kimi-K2.5's vision config,
    MiniMax-M2's rotary width, Nemotron-H's layer list)."""
    filled = class_defaults(entry.config)
    as_written = _read(entry.config, name="x", source="", checkpoint=None)
    with_defaults = spec_from_config(filled.config, name="x")
    assert _arch(as_written) != _arch(with_defaults)
    assert _arch(spec_from_config(entry.config, name=entry.repo_id)) == _arch(
        dataclasses.replace(with_defaults, name=entry.repo_id)
    )


def test_remote_code_config_names_the_missing_field_and_where_it_is_defined():
    config = {
        "architectures": ["MyForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_my.MyConfig"},
        "model_type": "my_remote_model",
        "hidden_size": 1024,
        "num_hidden_layers": 4,
        "vocab_size": 1000,
        "max_position_embeddings": 4096,
        "intermediate_size": 2048,
    }
    with pytest.raises(ModelSpecError) as e:
        spec_from_config(config, name="org/my")
    assert e.value.field == "num_attention_heads"
    assert "configuration_my.MyConfig" in str(e.value)
    assert "--trust-remote-code" in str(e.value)
    complete = {**config, "num_attention_heads": 8}
    assert spec_from_config(complete, name="org/my").num_attention_heads == 8


def test_missing_field_points_to_gatekeeper_models():
    with pytest.raises(ModelSpecError, match="gatekeeper models"):
        spec_from_config({"model_type": "not-in-transformers", "hidden_size": 8}, name="x")


def test_a_config_its_class_refuses_is_read_as_written_with_a_note():
    config = {**LLAMA_7B, "num_attention_heads": 31}  # 4096 is not a multiple of 31
    assert "LlamaConfig refused it" in class_defaults(config).note
    spec = spec_from_config(config, name="x")
    assert spec.num_attention_heads == 31
    assert any("not a multiple" in n for n in spec.notes)


def test_the_config_given_is_not_changed():
    config = {**LLAMA_7B, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    class_defaults(config)
    assert config["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
