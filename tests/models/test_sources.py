"""Model facts from local directories (config.json, safetensors headers) and the catalog."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from gatekeeper.errors import ModelSpecError
from gatekeeper.estimator.options import ServeOptions
from gatekeeper.estimator.vllm_method import GpuTarget, estimate
from gatekeeper.models.catalog import catalog_entries, find_in_catalog
from gatekeeper.models.safetensors import read_header
from gatekeeper.models.source import load_model_dir, resolve_model
from gatekeeper.units import GIB

TINY = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def write_tiny(directory: Path, *, with_weights: bool) -> dict[str, np.ndarray]:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(TINY))
    tensors: dict[str, np.ndarray] = {}
    if with_weights:
        tensors = {
            "model.embed_tokens.weight": np.zeros((1000, 64), np.float16),
            "model.layers.0.self_attn.q_proj.weight": np.zeros((64, 64), np.float16),
            "model.layers.0.self_attn.k_proj.weight": np.zeros((32, 64), np.float16),
            "model.layers.1.mlp.down_proj.qweight": np.zeros((16, 64), np.int32),
            "model.layers.1.mlp.down_proj.scales": np.zeros((1, 64), np.float16),
            "lm_head.weight": np.zeros((1000, 64), np.float16),
        }
        save_file(tensors, str(directory / "model.safetensors"))
    return tensors


def test_safetensors_headers_give_exact_bytes(tmp_path):
    tensors = write_tiny(tmp_path / "m", with_weights=True)
    spec = load_model_dir(tmp_path / "m")
    assert spec.checkpoint is not None
    assert spec.checkpoint.total_bytes == sum(t.nbytes for t in tensors.values())
    by_dtype = spec.checkpoint.bytes_by_dtype()
    assert by_dtype["I32"] == 16 * 64 * 4
    assert by_dtype["F16"] == sum(t.nbytes for t in tensors.values() if t.dtype == np.float16)
    e = estimate(spec, ServeOptions(dtype="float16"), GpuTarget(total_bytes=16 * GIB))
    assert e.weights_source.startswith("safetensors headers")
    vocab_padding = 2 * (1024 - 1000) * 64 * 2  # embed + lm_head padded to 64 rows
    assert e.worst.weights_bytes == spec.checkpoint.total_bytes + vocab_padding + 256 * 16 * 2


def test_header_is_read_without_the_data(tmp_path):
    write_tiny(tmp_path / "m", with_weights=True)
    path = tmp_path / "m" / "model.safetensors"
    header_len = int.from_bytes(path.read_bytes()[:8], "little")
    truncated = tmp_path / "t.safetensors"
    truncated.write_bytes(path.read_bytes()[: 8 + header_len])  # no tensor data at all
    assert len(read_header(truncated)) == 6


def test_truncated_header_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes((10_000).to_bytes(8, "little") + b"{}")
    with pytest.raises(ModelSpecError, match="truncated or not safetensors"):
        read_header(bad)


def test_index_total_size_is_used_when_shards_are_absent(tmp_path):
    write_tiny(tmp_path / "m", with_weights=False)
    index = {"metadata": {"total_size": 3_000_000}, "weight_map": {}}
    (tmp_path / "m" / "model.safetensors.index.json").write_text(json.dumps(index))
    spec = load_model_dir(tmp_path / "m")
    assert spec.checkpoint is not None and spec.checkpoint.total_bytes == 3_000_000
    e = estimate(spec, ServeOptions(), GpuTarget(total_bytes=16 * GIB))
    assert e.weights_source == "model.safetensors.index.json total_size"
    assert e.worst.weights_bytes == pytest.approx(3_000_000 + 256 * 16 * 2, rel=0.01)


def test_directory_with_only_config_json_uses_the_architecture(tmp_path):
    write_tiny(tmp_path / "m", with_weights=False)
    spec = resolve_model(str(tmp_path / "m"))
    e = estimate(spec, ServeOptions(), GpuTarget(total_bytes=16 * GIB))
    params = 2 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128 + 128) + 2 * 1024 * 64 + 64
    assert e.worst.weights_bytes == params * 2 + 256 * 16 * 2
    assert e.weights_source.startswith("architecture")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"num_hidden_layers": 0}, "num_hidden_layers"),  # absent, LlamaConfig gives 32
        ({"hidden_size": -1}, "hidden_size"),
        ({"torch_dtype": "int4"}, "torch_dtype"),
        ({"quantization_config": {"quant_method": "mystery"}}, "quantization_config"),
    ],
)
def test_bad_config_names_the_field(tmp_path, change, field):
    config = {**TINY, **change}
    (tmp_path / "config.json").write_text(
        json.dumps({k: v for k, v in config.items() if v is not None})
    )
    with pytest.raises(ModelSpecError) as info:
        load_model_dir(tmp_path)
    assert field in str(info.value)


def test_multimodal_config_counts_the_vision_tower():
    spec = resolve_model("meta-llama/Llama-3.2-11B-Vision")
    assert spec.vision_parameters > 500_000_000
    assert spec.hidden_size == 4096 and spec.num_layers == 40


def test_catalog_covers_the_families_and_the_calibration_models():
    ids = {e.repo_id for e in catalog_entries()}
    assert len(ids) >= 40
    for family in (
        "Llama-2",
        "Llama-3.1",
        "Llama-3.2",
        "Llama-3.3",
        "Llama-4",
        "Mixtral",
        "Qwen2.5",
        "Qwen3",
        "gemma-2",
        "gemma-3",
        "Phi-3",
        "phi-4",
        "DeepSeek-V3",
        "DeepSeek-R1",
        "gpt-oss",
        "granite",
    ):
        assert any(family.lower() in i.lower() for i in ids), family
    calibration = Path(__file__).resolve().parents[3] / "shared/calibration/configs"
    if calibration.is_dir():
        for folder in calibration.iterdir():
            assert find_in_catalog(folder.name.replace("__", "/")) is not None, folder.name


def test_every_catalog_model_estimates_on_an_h100():
    for entry in catalog_entries():
        spec = resolve_model(entry.repo_id)
        e = estimate(
            spec, ServeOptions(max_model_len=4096), GpuTarget(total_bytes=round(79.19 * GIB))
        )
        assert e.worst.weights_bytes > 0, entry.repo_id


def test_unknown_model_without_network_says_how_to_proceed():
    with pytest.raises(ModelSpecError, match="GATEKEEPER_ALLOW_NETWORK"):
        resolve_model("someone/unknown-model")


@pytest.mark.parametrize("value", ["512", 0, -1, True, [512]])
def test_a_tokenizer_config_length_that_is_no_number_names_the_file(
    tmp_path: Path, value: object
) -> None:
    config = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 64,
              "num_hidden_layers": 1, "num_attention_heads": 1, "vocab_size": 100,
              "intermediate_size": 128, "max_position_embeddings": 512,
              "position_embedding_type": "absolute"}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": value}))
    with pytest.raises(ModelSpecError, match=r"model_max_length: .*tokenizer_config.json says"):
        load_model_dir(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 128}))
    spec = load_model_dir(tmp_path)
    assert spec.for_runner(pooling=True).default_max_model_len == 128
    assert spec.for_runner(pooling=False).default_max_model_len == 512
