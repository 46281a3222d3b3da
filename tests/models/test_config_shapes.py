"""Configs in every shape (#26): each published config gatekeeper holds, mutated field by
field, is read and estimated without an internal error.

The seeds are the catalog's configs, the calibration set's (``../shared/calibration/
configs``) and the conformance families' (hybrid and state-space layouts the catalog lacks).
A mutation puts another JSON value in one field (top level, ``text_config``,
``vision_config``, ``rope_scaling``, ``quantization_config``): another type, ``null``, a
per-layer list where a scalar was, zero, negatives, huge numbers, NaN-like strings, or
deletes it; the runner, convert and dtype flags are drawn too. Every case ends in a spec and an estimate, or in a ``GatekeeperError`` naming
the field; the CLI's internal-error path (``cli/output.error_code`` == "internal_error",
printed as "gatekeeper: internal error") is hit zero times. The newer transformers
formats of the same families are read as transformers and vLLM read them.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gatekeeper.cli.output import error_code
from gatekeeper.errors import GatekeeperError, ModelSpecError
from gatekeeper.estimator.options import ServeOptions
from gatekeeper.estimator.runner import CONVERTS, RUNNERS
from gatekeeper.estimator.vllm_method import GpuTarget, estimate
from gatekeeper.models.catalog import catalog_entries
from gatekeeper.models.hf_config import spec_from_config
from gatekeeper.models.spec import ModelSpec
from tests.support.conformance_families import FAMILIES

GIB = 2**30
H100 = GpuTarget(total_bytes=round(79.19 * GIB), name="H100-80GB")
CALIBRATION = Path(__file__).resolve().parents[3] / "shared" / "calibration" / "configs"
NESTED = ("text_config", "vision_config", "rope_scaling", "rope_parameters", "quantization_config")

NEMOTRON_H: dict[str, Any] = {
    "model_type": "nemotron_h",
    "architectures": ["NemotronHForCausalLM"],
    "vocab_size": 1000,
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "intermediate_size": 256,
    "max_position_embeddings": 1024,
    "hybrid_override_pattern": "M-M*",
    "mamba_num_heads": 4,
    "mamba_head_dim": 64,
    "n_groups": 1,
    "ssm_state_size": 16,
    "conv_kernel": 4,
    "tie_word_embeddings": False,
}


def _family_seed(name: str, family: dict[str, Any]) -> dict[str, Any]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = next(v for v in CONFIG_MAPPING.values() if v.__name__ == family["config"])
    model_type = cls.model_type
    return {"model_type": model_type, "architectures": [family["model"]], **family["kwargs"]}


def _seeds() -> list[tuple[str, dict[str, Any]]]:
    seeds = [(e.repo_id, e.config) for e in catalog_entries()]
    for path in sorted(CALIBRATION.glob("*/config.json")):
        seeds.append((path.parent.name, json.loads(path.read_text())))
    seeds += [(f"family/{n}", _family_seed(n, f)) for n, f in sorted(FAMILIES.items())]
    return [*seeds, ("family/nemotron_h", NEMOTRON_H)]


SEEDS = _seeds()


def _paths(config: dict[str, Any]) -> list[tuple[str, ...]]:
    """Every field a mutation can reach: top level, and one level into the nested parts."""
    paths: list[tuple[str, ...]] = [(k,) for k in config]
    for outer in NESTED:
        if isinstance(config.get(outer), dict):
            paths += [(outer, k) for k in config[outer]]
            for inner in NESTED:
                if isinstance(config[outer].get(inner), dict):
                    paths += [(outer, inner, k) for k in config[outer][inner]]
    return paths


def _layers(config: dict[str, Any]) -> int:
    text = config.get("text_config")
    text = text if isinstance(text, dict) and text else config
    n = text.get("num_hidden_layers") or text.get("n_layer") or 4
    return n if isinstance(n, int) and 0 < n <= 512 else 4  # a mutated count: any list


DELETE = object()
ODD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, -1, -7, 1, 2**31, 2**62, 10**30, 0.0, -0.5, 1.5, 1e300]),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["NaN", "inf", "-inf", "-1", "12", "1e400", "", "linear", "auto"]),
    st.text(max_size=6),
    st.lists(st.integers(min_value=-2, max_value=4), max_size=5),
    st.dictionaries(st.sampled_from(["a", "type", "factor"]), st.integers(), max_size=2),
    st.just(DELETE),
)


def _mutate(config: dict[str, Any], path: tuple[str, ...], value: Any, layers: int) -> None:
    parent = config
    for key in path[:-1]:
        parent = parent[key]
    original = parent[path[-1]]
    if value is DELETE:
        del parent[path[-1]]
    elif value == "per-layer":
        parent[path[-1]] = [original] * layers
    else:
        parent[path[-1]] = value


def _outcome(
    config: Any, name: str, options: ServeOptions | None = None
) -> ModelSpec | GatekeeperError:
    """The spec and its estimate, or the GatekeeperError; an internal error fails."""
    try:
        spec = spec_from_config(config, name=name)
        estimate(spec, options or ServeOptions(), H100)
        return spec
    except GatekeeperError as e:
        assert e.field, f"{type(e).__name__} without a field: {e}"
        assert e.field.split(".")[-1] in str(e), f"the message does not name {e.field}: {e}"
        return e
    except Exception as e:  # the path the CLI reports as "gatekeeper: internal error"
        assert error_code(e) == "internal_error"
        pytest.fail(f"internal error on {name}: {type(e).__name__}: {e}")


@settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(data=st.data())
def test_mutated_configs_never_end_in_an_internal_error(data: st.DataObject) -> None:
    name, seed = data.draw(st.sampled_from(SEEDS), label="seed")
    config = copy.deepcopy(seed)
    for _ in range(data.draw(st.integers(min_value=1, max_value=2), label="mutations")):
        path = data.draw(st.sampled_from(_paths(config)), label="path")
        value = data.draw(st.one_of(ODD_VALUES, st.just("per-layer")), label="value")
        _mutate(config, path, value, _layers(config))
    options = ServeOptions(
        runner=data.draw(st.sampled_from(RUNNERS), label="runner"),
        convert=data.draw(st.sampled_from(CONVERTS), label="convert"),
        dtype=data.draw(st.sampled_from(["auto", "float16", "bfloat16", "float32"]), label="dtype"),
    )
    _outcome(config, f"mutated/{name}", options)


def test_every_seed_is_read_and_estimated() -> None:
    """The seeds themselves: a spec each, so that the mutations start from readable configs."""
    for name, seed in SEEDS:
        assert isinstance(_outcome(seed, f"seed/{name}"), ModelSpec), name


def _spec(config: dict[str, Any]) -> ModelSpec:
    out = _outcome(config, "org/model")
    assert isinstance(out, ModelSpec), out
    return out


def _same(a: ModelSpec, b: ModelSpec) -> None:
    skip = {"notes"}
    for field in ModelSpec.__dataclass_fields__:
        if field not in skip:
            assert getattr(a, field) == getattr(b, field), field


def test_rope_parameters_read_as_rope_scaling() -> None:
    """transformers 5 writes ``rope_parameters`` where configs said ``rope_scaling``."""
    seeds = [(n, s) for n, s in SEEDS if isinstance(s.get("rope_scaling"), dict)]
    assert len(seeds) >= 5
    for _, seed in seeds:
        newer = {k: v for k, v in seed.items() if k != "rope_scaling"}
        newer["rope_parameters"] = {**seed["rope_scaling"], "rope_theta": 10000.0}
        _same(_spec(newer), _spec(seed))


def test_nemotron_h_layers_block_type_read_as_its_pattern() -> None:
    """transformers 5's NemotronHConfig lists ``layers_block_type`` for the pattern string
    (configuration_nemotron_h.py ``_pattern_to_list``)."""
    newer = {k: v for k, v in NEMOTRON_H.items() if k != "hybrid_override_pattern"}
    newer["layers_block_type"] = ["linear_attention", "mlp", "linear_attention", "full_attention"]
    spec = _spec(newer)
    _same(spec, _spec(NEMOTRON_H))
    assert spec.layer_attention == ("none", "none", "none", "full")
    assert spec.layer_state == (True, False, True, False)
    legacy = {**newer, "layers_block_type": ["mamba", "mlp", "mamba", "attention"]}
    _same(_spec(legacy), spec)


def test_sliding_window_per_layer_as_vllm_remaps_it() -> None:
    """vllm/transformers_utils/configs/mistral.py ``_remap_mistral_sliding_window``: the
    list repeats over the layers, null a full layer."""
    seed = dict(next(s for n, s in SEEDS if n == "mistralai/Mistral-7B-Instruct-v0.3"))
    spec = _spec({**seed, "sliding_window": [4096, None]})
    assert spec.layer_attention == ("sliding", "full") * 16
    assert spec.sliding_window == 4096
    full = _spec({**seed, "sliding_window": [None]})
    assert set(full.layer_attention) == {"full"}


def test_moe_layer_freq_per_layer() -> None:
    """A 0/1 per layer (vllm/transformers_utils/configs/minimax_m3.py)."""
    seed = next(s for n, s in SEEDS if n == "deepseek-ai/DeepSeek-V2-Lite")
    flags = [i % 2 for i in range(seed["num_hidden_layers"])]
    spec = _spec({**seed, "moe_layer_freq": flags})
    assert spec.layer_moe == tuple(bool(f) for f in flags)


@pytest.mark.parametrize(
    ("seed", "field", "value"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "rope_scaling", "linear"),
        ("Qwen/Qwen3-30B-A3B", "mlp_only_layers", "1,2"),
        ("mistralai/Mistral-7B-Instruct-v0.3", "sliding_window", [1024, 2048]),
        ("mistralai/Mistral-7B-Instruct-v0.3", "sliding_window", [4096, None, None]),
        ("mistralai/Mistral-7B-Instruct-v0.3", "layer_types", ["full_attention"]),
        ("meta-llama/Llama-3.1-8B-Instruct", "num_hidden_layers", "32"),
        ("meta-llama/Llama-3.1-8B-Instruct", "num_hidden_layers", 2**62),
        ("meta-llama/Llama-3.1-8B-Instruct", "architectures", "LlamaForCausalLM"),
        ("deepseek-ai/DeepSeek-V2-Lite", "moe_layer_freq", [1, 0]),
        ("deepseek-ai/DeepSeek-V2-Lite", "moe_layer_freq", 0),
        ("meta-llama/Llama-3.1-8B-Instruct", "torch_dtype", math.nan),
        ("meta-llama/Llama-3.1-8B-Instruct", "quantization_config", "fp8"),
    ],
)
def test_shapes_nobody_reads_name_the_field(seed: str, field: str, value: Any) -> None:
    config = next(s for n, s in SEEDS if n == seed)
    out = _outcome({**config, field: value}, "org/model")
    assert isinstance(out, ModelSpecError), out
    assert out.field == field
    assert "config.json says" in str(out) or "expected" in str(out)
