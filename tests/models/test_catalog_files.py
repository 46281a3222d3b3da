"""The catalog's late-2026 models and what their entries carry beside ``config.json``.

``files`` holds the JSON a checkpoint publishes beside its config that vLLM reads too
(ModelOpt's ``hf_quant_config.json``, sentence-transformers' ``modules.json``), verbatim;
the resolver reads them as it reads them in a checkpoint directory. ``implicit_defaults``
entries are read with their config class's defaults filled in.
"""

from __future__ import annotations

import json
from pathlib import Path

from gatekeeper.models.catalog import catalog_entries, find_in_catalog
from gatekeeper.models.source import resolve_model

LATE_2026 = {
    # dense and MoE hybrids (gated delta net), their NVFP4 checkpoints
    "Qwen/Qwen3.5-27B", "Qwen/Qwen3.5-35B-A3B", "Qwen/Qwen3.5-122B-A10B",
    "Qwen/Qwen3.5-397B-A17B", "nvidia/Qwen3.6-27B-NVFP4", "nvidia/Qwen3.6-35B-A3B-NVFP4",
    "nvidia/Qwen3.5-122B-A10B-NVFP4", "nvidia/Qwen3.5-397B-A17B-NVFP4",
    "nvidia/Qwen3-235B-A22B-NVFP4", "Qwen/Qwen3-30B-A3B-FP8", "Qwen/Qwen3-32B-FP8",
    "Qwen/Qwen3-Coder-480B-A35B-Instruct", "Qwen/Qwen3-VL-8B-Instruct",
    # Gemma 4 (per-layer heads, experts beside a dense MLP)
    "google/gemma-4-26B-A4B",
    # MLA with DeepSeek's sparse attention, Kimi, GLM-5
    "deepseek-ai/DeepSeek-V3.2", "nvidia/DeepSeek-V3.2-NVFP4", "moonshotai/Kimi-K2-Instruct",
    "moonshotai/Kimi-K2.5", "nvidia/Kimi-K2.5-NVFP4", "zai-org/GLM-5", "zai-org/GLM-5-FP8",
    "nvidia/GLM-5-NVFP4", "MiniMaxAI/MiniMax-M2.5", "nvidia/MiniMax-M2.5-NVFP4",
    # Mamba-2 hybrids
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4",
    "nvidia/Nemotron-H-56B-Base-8K",
    # embedding
    "Qwen/Qwen3-Embedding-0.6B",
}  # fmt: skip
CATALOG_DIR = Path(__file__).resolve().parents[2] / "gatekeeper" / "catalog"


def test_the_late_2026_models_are_in_the_catalog() -> None:
    missing = LATE_2026 - {e.repo_id for e in catalog_entries()}
    assert not missing, sorted(missing)


def test_hf_quant_config_beside_the_config_quantizes_as_in_a_directory(tmp_path: Path) -> None:
    """nvidia/Qwen3-235B-A22B-NVFP4's config.json names no quantization: ModelOpt's
    hf_quant_config.json does, and the catalog reads it as a checkpoint directory does."""
    entry = find_in_catalog("nvidia/Qwen3-235B-A22B-NVFP4")
    assert entry is not None and "quantization_config" not in entry.config
    spec = resolve_model("qwen3:235b-nvfp4")
    assert spec.quantization is not None and spec.quantization.method == "modelopt:nvfp4"
    (tmp_path / "config.json").write_text(json.dumps(entry.config))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(entry.files["hf_quant_config.json"]))
    local = resolve_model(str(tmp_path))
    assert local.quantization == spec.quantization
    assert local.num_layers == spec.num_layers and local.moe == spec.moe


def test_modules_json_serves_an_embedder_with_the_pooling_runner() -> None:
    """Qwen3-Embedding is a Qwen3ForCausalLM whose modules.json names a Pooling module:
    vLLM (and so gatekeeper) pools it; its base model generates."""
    assert resolve_model("Qwen/Qwen3-Embedding-0.6B").sentence_transformers
    assert not resolve_model("Qwen/Qwen3-0.6B").sentence_transformers


def test_every_side_file_is_stored_verbatim_as_json() -> None:
    for path in sorted(CATALOG_DIR.glob("*.json")):
        raw = json.loads(path.read_text())
        for name, content in raw.get("files", {}).items():
            assert isinstance(content, dict | list), (path.name, name)
