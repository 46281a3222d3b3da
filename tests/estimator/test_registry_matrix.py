"""The registry-wide conformance matrix (#36 item 2) in the suite.

Every architecture vLLM 0.32 registers gets a row: its config class's defaults
(tests/support/registry_configs.py) built by vLLM on the meta device, unquantized, against
gatekeeper's weights for the same config.json; or the reason there is nothing to build (no
config class offline, a drafter, the Transformers backend) or vLLM's error. The
quantization configs (ModelOpt NVFP4 and MIXED_PRECISION, compressed-tensors NVFP4 and
W4A16, FP8 block, AWQ, GPTQ, written from the checkpoint's own module names) run on
``QUANTIZED``, a fixed part that covers every family feature (dense, tied and untied heads,
fused and Conv1D checkpoints, experts with and without shared experts and dense layers, MLA
with MTP layers, linear attention and Mamba-1/2 mixers, layer-type lists, heterogeneous head
dims, multimodal wrappers, an encoder). The whole matrix (all 391 x 8, about 190 s on this
2-core machine) is ``python -m tests.support.registry_matrix`` and
``bench/estimator_accuracy.py --matrix``; this part takes about 80 s.

A row known to differ is listed in ``KNOWN`` with its cause and runs as a strict xfail, so
that a fix shows up as a failure asking to drop it from the list.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.real_vllm import NO_VLLM_CPU, vllm_cpu_available
from tests.support.registry_matrix import (
    METHODS,
    MatrixRow,
    format_matrix,
    registry_matrix,
    summary,
)

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not vllm_cpu_available(), reason=NO_VLLM_CPU)]

FEATURES = (
    "LlamaForCausalLM",  # dense, GQA, untied head
    "Qwen3ForCausalLM",  # q/k norms, tied head
    "Gemma2ForCausalLM",  # sliding and global layers, tied head, four norms
    "Phi3ForCausalLM",  # fused qkv_proj and gate_up_proj in the checkpoint
    "GPT2LMHeadModel",  # Conv1D, learned positions
    "Qwen3MoeForCausalLM",  # experts
    "MixtralForCausalLM",  # block_sparse_moe names
    "DeepseekV3ForCausalLM",  # MLA, dense first layers, shared experts, MTP layer in the config
    "GptOssForCausalLM",  # sinks, biased experts
    "Qwen3NextForCausalLM",  # gated delta net, layer types, shared expert gate
    "JambaForCausalLM",  # Mamba-1, an expert period and an attention period
    "FalconH1ForCausalLM",  # Mamba-2 beside attention in every layer
    "Zamba2ForCausalLM",  # Mamba-2 and a shared transformer block
    "Gemma3ForConditionalGeneration",  # wrapper, layer types, two rotary caches
    "Gemma4ForConditionalGeneration",  # heterogeneous head dims (per_layer_config)
    "Qwen3_5MoeForConditionalGeneration",  # gated delta net and experts in a wrapper
    "Llama4ForConditionalGeneration",  # interleaved experts, chunked attention
    "Qwen2_5_VLForConditionalGeneration",  # wrapper, the other name layout
    "BertModel",  # an encoder, pooling
)

_QUANTIZED = tuple(m for m in METHODS if m != "none")


KNOWN: dict[tuple[str, str], str] = {}
"""(architecture, method) -> why gatekeeper differs from vLLM's build by more than 1% (or
cannot size what vLLM built)."""


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> list[MatrixRow]:
    got = registry_matrix(Path(tmp_path_factory.mktemp("registry-matrix")))
    print("\n" + format_matrix(got))
    print(summary(got))
    return got


def _row(rows: list[MatrixRow], arch: str, method: str) -> MatrixRow:
    found = [r for r in rows if r.architecture == arch and r.method == method]
    assert found, f"{arch}/{method}: no row"
    return found[0]


def test_every_registered_architecture_has_a_row(rows: list[MatrixRow]) -> None:
    """Built, or not built with the reason (no config class offline, a drafter, vLLM's
    error); the list is vLLM's own registry (``_VLLM_MODELS``: 391 names in 0.32)."""
    by_arch = {r.architecture: r for r in rows if r.method == "none"}
    assert len(by_arch) >= 391, sorted(by_arch)
    for arch, row in by_arch.items():
        assert row.built or row.not_built, f"{arch}: neither built nor a reason"
    assert sum(r.built for r in by_arch.values()) >= 120


def test_every_family_feature_is_built_under_every_method(rows: list[MatrixRow]) -> None:
    """The matrix reaches every feature ``FEATURES`` names: built unquantized and under at
    least five of the seven quantization configs (what vLLM refuses on the CPU build, e.g.
    gpt-oss's 2880-wide layers under W4A16 group 128, carries vLLM's reason)."""
    for arch in FEATURES:
        assert _row(rows, arch, "none").built, _row(rows, arch, "none").not_built
        refused = [
            f"{m}: {_row(rows, arch, m).not_built}"
            for m in _QUANTIZED
            if not _row(rows, arch, m).built
        ]
        assert len(refused) <= 2, f"{arch}: " + "\n".join(refused)
        assert all("could not build it" in r for r in refused), refused


def test_compared_rows_are_within_1pct_unless_known(rows: list[MatrixRow]) -> None:
    """Every row vLLM built is sized by gatekeeper within 1% of vLLM's bytes; a row that
    differs is in ``KNOWN`` with its cause (its own strict xfail below)."""
    bad = [
        f"{r.architecture}/{r.method}: vLLM {r.vllm_bytes:,} B, gatekeeper "
        + (f"{r.gatekeeper_bytes:,} B ({100 * r.weights_error:+.1f}%)" if r.compared else r.error)  # type: ignore[operator]
        for r in rows
        if r.built and not r.within and (r.architecture, r.method) not in KNOWN
    ]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    ("arch", "method"),
    [
        pytest.param(a, m, marks=pytest.mark.xfail(strict=True, reason=why))
        for (a, m), why in KNOWN.items()
    ],
)
def test_known_mismatch(rows: list[MatrixRow], arch: str, method: str) -> None:
    """A known mismatch, still there (a strict xfail: a fix fails here; drop it from KNOWN)."""
    row = _row(rows, arch, method)
    assert row.within, f"gatekeeper {row.weights_error}, error {row.error!r}, {row.not_built!r}"
