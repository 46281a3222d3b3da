"""What vLLM built (``ModelSpec.built``) split into pipeline stages by the decoder's own
layer path, whatever the class calls it (``model.layers``, GPT-2's ``transformer.h``;
BERT's ``encoder.layer`` never runs under pipeline parallelism: no ``SupportsPP``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gatekeeper.estimator import ServeOptions, estimate
from gatekeeper.estimator.vllm_method import GpuTarget
from gatekeeper.models.built_weights import BuiltTensor, BuiltWeights
from gatekeeper.models.hf_config import spec_from_config
from gatekeeper.models.module_names import module_names

GPU = GpuTarget(total_bytes=80 * 2**30)
LAYERS = 4


def _config(architecture: str, model_type: str) -> dict[str, object]:
    return {
        "architectures": [architecture], "model_type": model_type, "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": LAYERS, "num_attention_heads": 4,
        "num_key_value_heads": 4, "vocab_size": 1000, "max_position_embeddings": 512,
        "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("architecture", "model_type"), [("LlamaForCausalLM", "llama"), ("GPT2LMHeadModel", "gpt2")]
)
def test_each_stage_holds_its_own_layers(architecture: str, model_type: str) -> None:
    names = module_names(architecture)
    layer = [
        BuiltTensor(f"{names.layers_path}.{i}.mlp.weight", "bfloat16", (100,), 1000 * (i + 1))
        for i in range(LAYERS)
    ]
    embed = BuiltTensor("embed_tokens.weight", "bfloat16", (10,), 70_000)
    built = BuiltWeights("0.32.0", 1, "bfloat16", None, architecture, (embed, *layer))
    spec = replace(spec_from_config(_config(architecture, model_type), name="m"), built=built)
    stages = estimate(spec, ServeOptions(pipeline_parallel_size=2), GPU).stages
    # vLLM's get_pp_indices: layers 0-1 on stage 0, 2-3 on stage 1; the embedding first
    assert [s.weights_bytes for s in stages] == [70_000 + 1000 + 2000, 3000 + 4000]
