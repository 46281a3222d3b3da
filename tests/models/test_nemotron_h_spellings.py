"""Nemotron-H as transformers 5 writes it (``NemotronHConfig.to_dict``: a
``layers_block_type`` list, no ``num_hidden_layers``, which the class derives from the
list) and as Nemotron-H 1 checkpoints write it (``hybrid_override_pattern`` and
``num_hidden_layers``): the same model either way, as vLLM 0.32 builds the same one
(``nemotron_h.py`` reads ``config.hybrid_override_pattern``, which transformers 5 derives
from the list). tests/estimator/test_quant_conformance.py compares both with vLLM's build."""

from __future__ import annotations

from gatekeeper.estimator import GpuTarget, ServeOptions, estimate
from gatekeeper.models.hf_config import spec_from_config
from tests.support.quant_conformance_cases import FAMILIES

GPU = GpuTarget(total_bytes=80 * 2**30)
OPTIONS = ServeOptions(max_model_len=512, enforce_eager=True, vllm_version="0.32.0")


def test_the_block_list_alone_names_the_layers() -> None:
    config = FAMILIES["nemotron_h_tf5"]
    assert "num_hidden_layers" not in config
    spec = spec_from_config(config, name="nemotron-h")
    assert spec.num_layers == len(config["layers_block_type"]) == 6


def test_both_spellings_are_the_same_model() -> None:
    tf5 = spec_from_config(FAMILIES["nemotron_h_tf5"], name="nemotron-h")
    pattern = spec_from_config(FAMILIES["nemotron_h_pattern"], name="nemotron-h")
    assert tf5.layer_moe == pattern.layer_moe == (False, True, False, False, False, True)
    assert tf5.moe is not None and tf5.moe.shared_intermediate_size == 384
    sizes = [estimate(s, OPTIONS, GPU).worst.weights_bytes for s in (tf5, pattern)]
    assert sizes[0] == sizes[1] > 0


def test_neither_spelling_takes_the_class_default_as_vllm_does() -> None:
    """No list and no pattern: transformers' NemotronHConfig default layout, which vLLM
    reads too (no error asking for num_hidden_layers)."""
    from transformers import NemotronHConfig

    config = {k: v for k, v in FAMILIES["nemotron_h_tf5"].items() if k != "layers_block_type"}
    spec = spec_from_config(config, name="nemotron-h")
    assert spec.num_layers == len(NemotronHConfig().layers_block_type or ())
