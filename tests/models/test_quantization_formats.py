"""Quantization configs read as vLLM reads them: which method, which scheme per module,
and which modules stay unquantized."""

from __future__ import annotations

import pytest

from gatekeeper.errors import ModelSpecError, ServeOptionsError
from gatekeeper.models.hf_config import spec_from_config
from gatekeeper.models.quant_formats import FORMATS
from gatekeeper.models.quantization import quant_from_config, quant_from_flag


def test_modelopt_nvfp4_config_json_is_read_not_refused():
    q = quant_from_config(
        {
            "quant_method": "modelopt",
            "quant_algo": "NVFP4",
            "ignore": ["lm_head", "model.layers.0.mlp*"],
            "config_groups": {
                "group_0": {"weights": {"num_bits": 4, "type": "float"}, "targets": ["Linear"]}
            },
        }
    )
    assert (q.method, q.weight_bits, q.group_size, q.scale_bytes) == ("modelopt:nvfp4", 4, 16, 1)
    assert q.scheme_for("lm_head") is None
    assert q.scheme_for("model.layers.0.mlp.down_proj") is None  # ModelOpt wildcard
    assert q.scheme_for("model.layers.1.mlp.down_proj") is q


def test_modelopt_hf_quant_config_json_and_mixed_precision():
    legacy = quant_from_config(
        {
            "producer": {"name": "modelopt"},
            "quantization": {"quant_algo": "FP8", "exclude_modules": ["lm_head"]},
        }
    )
    assert legacy.method == "modelopt:fp8" and legacy.skips("lm_head")
    mixed = quant_from_config(
        {
            "quant_method": "modelopt",
            "quant_algo": "MIXED_PRECISION",
            "quantized_layers": {
                "model.layers.0.mlp.down_proj": {"quant_algo": "NVFP4", "group_size": 16},
                "model.layers.0.self_attn.q_proj": {"quant_algo": "FP8"},
            },
        }
    )
    down = mixed.scheme_for("model.layers.0.mlp.down_proj")
    assert down is not None and down.method == "modelopt:nvfp4"
    q_proj = mixed.scheme_for("model.layers.0.self_attn.q_proj")
    assert q_proj is not None and q_proj.method == "modelopt:fp8"
    assert mixed.scheme_for("model.layers.0.self_attn.k_proj") is None  # not listed: bf16


def test_compressed_tensors_picks_the_group_that_names_the_module():
    q = quant_from_config(
        {
            "quant_method": "compressed-tensors",
            "config_groups": {
                "dense": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                },
                "experts": {
                    "targets": ["re:.*experts.*"],
                    "weights": {
                        "num_bits": 4,
                        "type": "int",
                        "strategy": "group",
                        "group_size": 32,
                    },
                },
            },
            "ignore": ["lm_head", "re:.*mlp.gate$"],
        }
    )
    expert = q.scheme_for("model.layers.2.mlp.experts.0.gate_proj", experts=True)
    assert expert is not None and (expert.weight_bits, expert.group_size) == (4, 32)
    dense = q.scheme_for("model.layers.2.self_attn.o_proj")
    assert dense is not None and dense.weight_bits == 8
    assert q.scheme_for("model.layers.2.mlp.gate") is None
    assert not q.lm_head


def test_malformed_configs_are_value_errors_with_the_method():
    with pytest.raises(ValueError, match="compressed-tensors config is malformed"):
        quant_from_config(
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"g": {"weights": {"num_bits": [4]}, "targets": ["Linear"]}},
            }
        )
    with pytest.raises(ValueError, match="Quark weight dtype 'fp6'"):
        quant_from_config(
            {"quant_method": "quark", "global_quant_config": {"weight": {"dtype": "fp6"}}}
        )


def test_an_unsupported_method_names_the_known_ones_through_model_spec_error():
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 1,
        "intermediate_size": 128,
        "vocab_size": 64,
        "max_position_embeddings": 64,
        "quantization_config": {"quant_method": "hqq"},
    }
    with pytest.raises(ModelSpecError, match=r"'hqq' is not supported .*modelopt.*quark"):
        spec_from_config(config, name="x")


def test_flags_accept_vllms_other_names_for_the_checkpoint_method():
    nvfp4 = quant_from_config({"quant_method": "modelopt", "quant_algo": "NVFP4"})
    assert quant_from_flag("modelopt_fp4", nvfp4) is nvfp4
    gptq = quant_from_config({"quant_method": "gptq", "bits": 4, "group_size": 128})
    # MoeWNA16Method: the experts without zero points for a symmetric GPTQ (moe_wna16.py)
    wna16 = quant_from_flag("moe_wna16", gptq)
    assert wna16 is not None and wna16.scheme_for("model.layers.0.mlp.down_proj") is wna16
    assert wna16.experts_scheme is not None and wna16.experts_scheme.zero_bits == 0
    with pytest.raises(ServeOptionsError, match="does not match the checkpoint"):
        quant_from_flag("awq", nvfp4)
    bnb = quant_from_flag("bitsandbytes", None)
    assert bnb is not None and bnb.removed_in == "0.32"


# one small config per family that has other names (quant_formats.FORMATS)
_FAMILY_CONFIGS: dict[str, dict[str, object]] = {
    "awq": {"bits": 4, "group_size": 128},
    "gptq": {"bits": 4, "group_size": 128},
    "mxfp4": {},
    "modelopt": {"quant_algo": "NVFP4"},
    "compressed-tensors": {
        "config_groups": {
            "g": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
            }
        }
    },
}
_ALIASES = sorted((name, f.family) for name, f in FORMATS.items() if name != f.family)


@pytest.mark.parametrize(("alias", "family"), _ALIASES)
def test_each_other_name_reads_and_flags_as_its_family(alias: str, family: str):
    config = _FAMILY_CONFIGS[family]
    checkpoint = quant_from_config({"quant_method": family, **config})
    assert quant_from_config({"quant_method": alias, **config}) == checkpoint
    assert quant_from_flag(alias, checkpoint) is checkpoint
    other = quant_from_config({"quant_method": "fp8"})
    with pytest.raises(ServeOptionsError, match="does not match the checkpoint"):
        quant_from_flag(alias, other)
