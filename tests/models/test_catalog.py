"""Static checks of the embedded model catalog (gatekeeper/catalog/*.json). No network.

Every file must have the documented shape, name the repo it is stored under, carry the
architecture fields the estimator reads, and (where it states ``parameters``) agree with an
independent parameter count computed from its own config.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CATALOG_DIR = REPO_ROOT / "gatekeeper" / "catalog"
CATALOG_FILES = sorted(CATALOG_DIR.glob("*.json"))

TOP_KEYS = {
    "repo_id",
    "aliases",
    "provenance",
    "parameters",
    "implicit_defaults",
    "config",
    "files",
}
REQUIRED_TOP_KEYS = TOP_KEYS - {"parameters", "implicit_defaults", "files"}
# the JSON files beside config.json that vLLM reads and the catalog may carry (verbatim)
SIDE_FILES = {
    "hf_quant_config.json",
    "modules.json",
    "sentence_bert_config.json",
    "tokenizer_config.json",
}
TEXT_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
    "max_position_embeddings",
)
MOE_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
# q_lora_rank is named even when null (no q LoRA): absent, transformers' DeepseekV2Config and
# DeepseekV3Config default it to 1536, which is how vLLM would read such a copy.
MLA_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
# Config classes whose tie_word_embeddings default is True when the key is absent (Gemma, OPT
# rely on it); the other families here default to untied (DeepseekV2Config, LlamaConfig, ...).
TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3", "gemma3_text", "opt"}
DENSE_TOLERANCE = 0.03
SPARSE_TOLERANCE = 0.05

REQUIRED_REPOS = {
    "meta-llama/Llama-2-7b-chat-hf",
    "meta-llama/Llama-2-13b-hf",
    "meta-llama/Llama-2-13b-chat-hf",
    "meta-llama/Llama-2-70b-chat-hf",
    "meta-llama/Meta-Llama-3-8B-Instruct",
    "meta-llama/Meta-Llama-3-70B-Instruct",
    "meta-llama/Llama-3.1-8B",
    "meta-llama/Llama-3.1-8B-Instruct",
    "meta-llama/Llama-3.1-70B-Instruct",
    "meta-llama/Llama-3.1-405B-Instruct",
    "meta-llama/Llama-3.2-1B-Instruct",
    "meta-llama/Llama-3.2-3B-Instruct",
    "meta-llama/Llama-3.2-11B-Vision-Instruct",
    "meta-llama/Llama-3.3-70B-Instruct",
    "meta-llama/Llama-4-Scout-17B-16E-Instruct",
    "meta-llama/Llama-4-Maverick-17B-128E-Instruct",
    "mistralai/Mistral-7B-Instruct-v0.3",
    "mistralai/Mistral-Small-24B-Instruct-2501",
    "mistralai/Mixtral-8x7B-Instruct-v0.1",
    "mistralai/Mixtral-8x22B-Instruct-v0.1",
    "mistralai/Mistral-Nemo-Instruct-2407",
    "Qwen/Qwen2.5-0.5B-Instruct",
    "Qwen/Qwen2.5-3B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct",
    "Qwen/Qwen2.5-14B-Instruct",
    "Qwen/Qwen2.5-32B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct-AWQ",
    "Qwen/Qwen3-8B",
    "Qwen/Qwen3-14B",
    "Qwen/Qwen3-30B-A3B",
    "Qwen/Qwen3-235B-A22B",
    "google/gemma-2-2b-it",
    "google/gemma-2-9b-it",
    "google/gemma-2-27b-it",
    "google/gemma-3-4b-it",
    "google/gemma-3-12b-it",
    "google/gemma-3-27b-it",
    "microsoft/Phi-3-mini-4k-instruct",
    "microsoft/Phi-3-medium-4k-instruct",
    "deepseek-ai/DeepSeek-V2-Lite",
    "deepseek-ai/DeepSeek-V2-Lite-Chat",
    "deepseek-ai/DeepSeek-V3",
    "deepseek-ai/DeepSeek-R1-Distill-Llama-8B",
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B",
    "ibm-granite/granite-3.1-8b-instruct",
    "ibm-granite/granite-3.3-8b-instruct",
    "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
}


def _load(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict), path.name
    return data


def _all_entries() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, _load(path)) for path in CATALOG_FILES]


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def _is_multimodal(config: dict[str, Any]) -> bool:
    # Qwen2.5-VL keeps its text fields at the top level next to vision_config.
    return "vision_config" in config or "text_config" in config


def _is_quantized(config: dict[str, Any]) -> bool:
    return bool(config.get("quantization_config"))


def _is_moe(text: dict[str, Any]) -> bool:
    return any(text.get(key) for key in MOE_EXPERT_KEYS)


def _is_mla(text: dict[str, Any]) -> bool:
    return text.get("kv_lora_rank") is not None


def _shared_configs_dir() -> Path | None:
    for base in (REPO_ROOT / "shared", REPO_ROOT.parent / "shared"):
        candidate = base / "calibration" / "configs"
        if candidate.is_dir():
            return candidate
    return None


# --------------------------------------------------------------------------- independent count


def _int(cfg: dict[str, Any], key: str, default: int = 0) -> int:
    value = cfg.get(key)
    return int(value) if value else default


def _head_dim(cfg: dict[str, Any]) -> int:
    return _int(cfg, "head_dim") or _int(cfg, "hidden_size") // _int(cfg, "num_attention_heads")


def _gqa_attention_params(cfg: dict[str, Any]) -> int:
    """q, k, v, o projections (+ biases, qk-norm, attention sinks) of one layer."""
    hidden = _int(cfg, "hidden_size")
    heads = _int(cfg, "num_attention_heads")
    kv_heads = _int(cfg, "num_key_value_heads", heads)
    head_dim = _head_dim(cfg)
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    total = hidden * q_dim + 2 * hidden * kv_dim + q_dim * hidden
    model_type = cfg.get("model_type")
    if model_type == "qwen2":  # q/k/v biases, no o bias
        total += q_dim + 2 * kv_dim
    elif model_type == "opt" or cfg.get("attention_bias"):
        total += q_dim + 2 * kv_dim + hidden
    if model_type in {"qwen3", "qwen3_moe", "gemma3_text"}:  # per-head q/k RMSNorm
        total += 2 * head_dim
    if model_type == "gpt_oss":  # per-head attention sinks
        total += heads
    return total


def _mla_attention_params(cfg: dict[str, Any]) -> int:
    """DeepSeek multi-head latent attention of one layer (q_lora_rank null = no q LoRA)."""
    hidden = _int(cfg, "hidden_size")
    heads = _int(cfg, "num_attention_heads")
    nope, rope = _int(cfg, "qk_nope_head_dim"), _int(cfg, "qk_rope_head_dim")
    kv_rank, v_dim = _int(cfg, "kv_lora_rank"), _int(cfg, "v_head_dim")
    q_rank = _int(cfg, "q_lora_rank")
    q_out = heads * (nope + rope)
    q_params = hidden * q_out if not q_rank else hidden * q_rank + q_rank + q_rank * q_out
    kv_params = hidden * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + v_dim)
    return q_params + kv_params + heads * v_dim * hidden


def _dense_mlp_params(cfg: dict[str, Any]) -> int:
    hidden = _int(cfg, "hidden_size")
    if cfg.get("model_type") == "opt":  # fc1/fc2 with biases
        ffn = _int(cfg, "ffn_dim")
        return 2 * hidden * ffn + ffn + hidden
    return 3 * hidden * _int(cfg, "intermediate_size")  # gate, up, down


def _moe_layer_params(cfg: dict[str, Any]) -> int:
    hidden = _int(cfg, "hidden_size")
    experts = max(_int(cfg, key) for key in MOE_EXPERT_KEYS)
    expert_size = _int(cfg, "moe_intermediate_size") or _int(cfg, "intermediate_size")
    total = experts * 3 * hidden * expert_size + hidden * experts  # experts + router
    total += _int(cfg, "n_shared_experts") * 3 * hidden * expert_size
    total += 3 * hidden * _int(cfg, "shared_expert_intermediate_size")
    if cfg.get("model_type") == "gpt_oss":  # expert biases (gate_up + down)
        total += experts * 3 * expert_size
    return total


def _is_dense_layer(cfg: dict[str, Any], idx: int) -> bool:
    """Which layers of a MoE model keep a dense MLP (DeepSeek and Qwen-MoE conventions)."""
    if not _is_moe(cfg) or idx < _int(cfg, "first_k_dense_replace"):
        return True
    if idx in (cfg.get("mlp_only_layers") or []):
        return True
    if "decoder_sparse_step" in cfg:  # Qwen MoE: layer idx is sparse if (idx + 1) % step == 0
        return (idx + 1) % _int(cfg, "decoder_sparse_step", 1) != 0
    return idx % _int(cfg, "moe_layer_freq", 1) != 0  # DeepSeek; Mixtral/gpt-oss: all sparse


def _layer_norm_params(cfg: dict[str, Any]) -> int:
    hidden = _int(cfg, "hidden_size")
    if cfg.get("model_type") in {"gemma2", "gemma3_text", "opt"}:
        # Gemma: pre/post attention and pre/post feed-forward RMSNorms; OPT: 2 LayerNorms + bias
        return 4 * hidden
    return 2 * hidden


def _embedding_params(cfg: dict[str, Any]) -> int:
    hidden, vocab = _int(cfg, "hidden_size"), _int(cfg, "vocab_size")
    total = vocab * hidden
    if not cfg.get("tie_word_embeddings", cfg.get("model_type") in TIED_BY_DEFAULT):
        total += vocab * hidden
    if cfg.get("model_type") == "opt":  # learned positions (offset 2) + final LayerNorm bias
        total += (_int(cfg, "max_position_embeddings") + 2) * hidden + hidden
    return total + hidden  # final norm


def count_parameters(cfg: dict[str, Any]) -> int:
    """Rough independent parameter count of a text decoder described by ``cfg``."""
    attention = _mla_attention_params(cfg) if _is_mla(cfg) else _gqa_attention_params(cfg)
    total = _embedding_params(cfg)
    for idx in range(_int(cfg, "num_hidden_layers")):
        total += attention + _layer_norm_params(cfg)
        total += _dense_mlp_params(cfg) if _is_dense_layer(cfg, idx) else _moe_layer_params(cfg)
    return total


def _relative_error(cfg: dict[str, Any], published: int) -> float:
    return abs(count_parameters(cfg) - published) / published


def _entries_with_parameters(*, sparse: bool) -> list[tuple[str, dict[str, Any], int]]:
    selected = []
    for path, entry in _all_entries():
        config = entry["config"]
        if "parameters" not in entry or _is_multimodal(config):
            continue
        is_sparse = _is_moe(config) or _is_mla(config)
        wanted = is_sparse if sparse else not is_sparse and not _is_quantized(config)
        if wanted:
            selected.append((path.name, config, int(entry["parameters"])))
    return selected


DENSE_ENTRIES = _entries_with_parameters(sparse=False)
SPARSE_ENTRIES = _entries_with_parameters(sparse=True)


# --------------------------------------------------------------------------- tests


def test_catalog_is_populated() -> None:
    assert len(CATALOG_FILES) >= 45


def test_required_models_present() -> None:
    present = {_load(path)["repo_id"] for path in CATALOG_FILES}
    missing = REQUIRED_REPOS - present
    assert not missing, sorted(missing)


@pytest.mark.parametrize("path", CATALOG_FILES, ids=lambda p: p.stem)
def test_file_shape(path: Path) -> None:
    entry = _load(path)
    assert set(entry) >= REQUIRED_TOP_KEYS, path.name
    assert set(entry) <= TOP_KEYS, set(entry) - TOP_KEYS
    assert isinstance(entry["repo_id"], str)
    assert isinstance(entry["provenance"], str)
    assert entry["provenance"].strip()
    assert isinstance(entry["config"], dict)
    aliases = entry["aliases"]
    assert isinstance(aliases, list)
    assert aliases
    for alias in aliases:
        assert isinstance(alias, str)
        assert alias
        assert alias == alias.lower()
        assert alias == alias.strip()
    assert len(set(aliases)) == len(aliases)
    if "parameters" in entry:
        assert isinstance(entry["parameters"], int)
        assert entry["parameters"] > 0
    files = entry.get("files", {})
    assert isinstance(files, dict)
    assert set(files) <= SIDE_FILES, set(files) - SIDE_FILES
    for name in files:
        assert name in entry["provenance"], f"{path.name}: the provenance does not name {name}"


@pytest.mark.parametrize("path", CATALOG_FILES, ids=lambda p: p.stem)
def test_repo_id_matches_file_name(path: Path) -> None:
    repo_id = _load(path)["repo_id"]
    assert repo_id.count("/") == 1
    assert path.name == repo_id.replace("/", "__") + ".json"


def test_aliases_unique_across_catalog() -> None:
    """Aliases are unique and never shadow another entry's repo id or bare repo name."""
    entries = _all_entries()
    names: dict[str, str] = {}
    for _, entry in entries:
        repo_id = entry["repo_id"]
        names[repo_id.lower()] = repo_id
        names[repo_id.split("/")[-1].lower()] = repo_id
    owners: dict[str, str] = {}
    for _, entry in entries:
        repo_id = entry["repo_id"]
        for alias in entry["aliases"]:
            assert alias not in owners, f"{alias!r} in {owners.get(alias)} and {repo_id}"
            owners[alias] = repo_id
            assert names.get(alias, repo_id) == repo_id, f"{alias!r} shadows {names[alias]}"


@pytest.mark.parametrize("path", CATALOG_FILES, ids=lambda p: p.stem)
def test_config_has_architecture_fields(path: Path) -> None:
    config = _load(path)["config"]
    assert isinstance(config.get("architectures"), list)
    assert config["architectures"]
    assert isinstance(config.get("model_type"), str)
    text = _text_config(config)
    # gpt-oss (mxfp4) ships without torch_dtype; every unquantized checkpoint states it
    # (transformers 5 writes it as ``dtype``; Qwen3-VL only in its text_config).
    dtype = next((c[k] for c in (config, text) for k in ("torch_dtype", "dtype") if c.get(k)), None)
    if dtype is not None or not _is_quantized(config):
        assert dtype in {"float16", "bfloat16", "float32"}
    for field in TEXT_FIELDS:
        assert isinstance(text.get(field), int), field
        assert text[field] > 0, field
    width = (
        text.get("intermediate_size") or text.get("ffn_dim") or text.get("moe_intermediate_size")
    )
    assert isinstance(width, int)  # Qwen3.5 MoE: experts only
    if text.get("model_type") != "opt":
        assert isinstance(text.get("num_key_value_heads"), int)
        assert text["num_attention_heads"] % text["num_key_value_heads"] == 0
    if _is_multimodal(config):
        assert isinstance(config.get("vision_config"), dict)


@pytest.mark.parametrize("path", CATALOG_FILES, ids=lambda p: p.stem)
def test_moe_mla_quant_fields(path: Path) -> None:
    config = _load(path)["config"]
    text = _text_config(config)
    if _is_moe(text):
        top_k = text.get("num_experts_per_tok") or text.get("top_k_experts")  # Gemma 4
        assert isinstance(top_k, int)
        assert top_k >= 1
    if _is_mla(text):
        for key in MLA_KEYS:
            assert key in text, key
    if _is_quantized(config):
        assert isinstance(config["quantization_config"].get("quant_method"), str)


@pytest.mark.parametrize("path", CATALOG_FILES, ids=lambda p: p.stem)
def test_sliding_window_fields(path: Path) -> None:
    text = _text_config(_load(path)["config"])
    model_type = text.get("model_type")
    if model_type in {"gemma2", "gemma3_text", "gpt_oss"}:
        assert isinstance(text.get("sliding_window"), int)
    if model_type == "gemma3_text":
        assert isinstance(text.get("sliding_window_pattern"), int)
    if model_type == "gpt_oss":
        layer_types = text.get("layer_types")
        assert isinstance(layer_types, list)
        assert len(layer_types) == text["num_hidden_layers"]


def test_dense_parameter_check_covers_a_dozen_models() -> None:
    assert len(DENSE_ENTRIES) >= 12


@pytest.mark.parametrize(
    ("name", "config", "published"), DENSE_ENTRIES, ids=[e[0] for e in DENSE_ENTRIES]
)
def test_dense_parameter_count(name: str, config: dict[str, Any], published: int) -> None:
    error = _relative_error(config, published)
    assert error <= DENSE_TOLERANCE, f"{name}: {count_parameters(config)} vs {published}"


@pytest.mark.parametrize(
    ("name", "config", "published"), SPARSE_ENTRIES, ids=[e[0] for e in SPARSE_ENTRIES]
)
def test_moe_and_mla_parameter_count_roughly(
    name: str, config: dict[str, Any], published: int
) -> None:
    error = _relative_error(config, published)
    assert error <= SPARSE_TOLERANCE, f"{name}: {count_parameters(config)} vs {published}"


def test_shared_calibration_configs_copied_verbatim() -> None:
    shared = _shared_configs_dir()
    if shared is None:
        pytest.skip("shared/calibration/configs not available")
    for model_dir in sorted(p for p in shared.iterdir() if p.is_dir()):
        path = CATALOG_DIR / f"{model_dir.name}.json"
        assert path.is_file(), f"missing catalog file for {model_dir.name}"
        expected = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        assert _load(path)["config"] == expected, model_dir.name
