"""Routed experts that sit on the decoder layer itself, beside a dense MLP (Gemma 4's MoE
layers: ``gemma4.py`` builds ``<layer>.experts`` and ``<layer>.router.proj`` next to
``<layer>.mlp``), are asked about under the layer, as vLLM asks the quantization config.

NVIDIA's Gemma 4 NVFP4 checkpoints exclude every layer's ``mlp*``, ``router*`` and
``self_attn*``: the dense MLP stays bf16 and the experts are NVFP4. gatekeeper named the
experts ``<layer>.mlp.experts``, which the exclusions matched, and sized them in bf16:
48.47 GiB for the 26B-A4B where vLLM builds 17.89 GiB (+169%)."""

from __future__ import annotations

import pytest

from gatekeeper.estimator import GpuTarget, ServeOptions, estimate
from gatekeeper.estimator.rank_weights import RankWeights, moe_prefix
from gatekeeper.models.module_names import module_names
from gatekeeper.models.source import resolve_model

GPU = GpuTarget(total_bytes=4096 * 2**30, name="declared 4 TiB")

VLLM_META_BUILD = {
    "nvidia/Gemma-4-26B-A4B-NVFP4": 19_213_850_682,
    "nvidia/Gemma-4-31B-IT-NVFP4": 33_256_110_762,
}
"""The bytes vLLM 0.32's CPU build holds for each (its meta-device build of the catalog
config and hf_quant_config.json, TP 1: ``gatekeeper estimate MODEL --weights-from
vllm=.venv-vllm-cpu/bin/python``, 2026-12-06); ``tests/models/test_catalog_vllm.py``
builds them again with ``GK_CATALOG_VLLM=all``."""


@pytest.mark.parametrize("repo", sorted(VLLM_META_BUILD))
def test_gemma4_nvfp4_weights_are_what_vllm_builds(repo: str) -> None:
    result = estimate(resolve_model(repo), ServeOptions(max_model_len=4096), GPU)
    built = VLLM_META_BUILD[repo]
    assert abs(result.worst.weights_bytes - built) / built < 1e-4
    formats = result.to_json()["weights_by_group"]
    assert set(formats["attention"]) == {"bfloat16"}  # self_attn* excluded


def test_the_26b_experts_are_nvfp4_and_its_dense_mlp_bf16() -> None:
    result = estimate(
        resolve_model("nvidia/Gemma-4-26B-A4B-NVFP4"), ServeOptions(max_model_len=4096), GPU
    )
    formats = result.to_json()["weights_by_group"]
    experts = formats["experts"]
    assert max(experts, key=experts.__getitem__) == "modelopt:nvfp4"
    assert set(formats["mlp"]) == {"bfloat16"}  # layers.N.mlp* excluded


@pytest.mark.parametrize(
    ("architecture", "module"),
    [
        ("Gemma4ForConditionalGeneration", "language_model.model.layers.3"),
        ("Gemma4ForCausalLM", "model.layers.3"),
        ("Qwen3MoeForCausalLM", "model.layers.3.mlp"),
        ("MixtralForCausalLM", "model.layers.3.block_sparse_moe"),
    ],
)
def test_the_experts_module_is_where_vllm_builds_it(architecture: str, module: str) -> None:
    spec = resolve_model("nvidia/Gemma-4-26B-A4B-NVFP4")
    names = module_names(architecture)
    c = RankWeights(spec=spec, tp=1, dtype_bytes=2, quant=None, names=names)
    assert moe_prefix(c, 3) == module
