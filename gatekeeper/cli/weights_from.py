"""``--weights-from config|vllm[=PYTHON]``: where a command takes the model's weights.

``config`` (the default) sizes them from ``config.json`` and the safetensors headers, with
gatekeeper's own tables, everywhere. ``vllm`` asks the vLLM environment the sidecar's
``worker_command`` runs (``vllm=PYTHON``: that Python's) to build the model on the meta
device at the command's TP size, dtype and quantization (``gatekeeper.vllm.meta_weights``;
cached per model, revision, quantization, TP and release). When vLLM cannot answer, the
estimate falls back to the config and says why in its warnings.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from gatekeeper.errors import ServeOptionsError
from gatekeeper.estimator.options import ServeOptions
from gatekeeper.models.catalog import find_in_catalog
from gatekeeper.models.spec import ModelSpec
from gatekeeper.settings import Settings
from gatekeeper.vllm.meta_weights import (
    MetaBuildError,
    MetaBuildRequest,
    build_weights,
    vllm_python,
)

__all__ = ["add_weights_from", "with_built_weights"]


def add_weights_from(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--weights-from",
        default="config",
        metavar="config|vllm[=PYTHON]",
        help="size the weights from config.json (default), or ask the installed vLLM "
        "(the worker command's environment, or PYTHON's) to build the model on the meta "
        "device: exact for any family it supports; nothing touches a GPU; cached",
    )


def _python(value: str, settings: Settings) -> str | None:
    """None for ``config``; the vLLM environment's Python for ``vllm[=PYTHON]``."""
    if value == "config":
        return None
    kind, _, python = value.partition("=")
    if kind != "vllm" or (value.endswith("=") and not python):
        raise ServeOptionsError(
            f"--weights-from: {value!r} is neither 'config' nor 'vllm[=PYTHON]'; give "
            "'--weights-from vllm' to ask the worker command's vLLM, or "
            "'--weights-from vllm=/path/to/venv/bin/python'",
            field="weights_from",
            value=value,
        )
    return vllm_python(python or None, list(settings.worker_command))


def _request(spec: ModelSpec, options: ServeOptions, values: Mapping[str, Any]) -> MetaBuildRequest:
    catalog = find_in_catalog(spec.name) if not spec.config_path else None
    overrides = options.hf_overrides
    return MetaBuildRequest(
        config_path=Path(spec.config_path) if spec.config_path else None,
        config=catalog.config if catalog is not None else None,
        quantization=options.quantization,
        dtype=options.dtype,
        tensor_parallel_size=options.tensor_parallel_size,
        hf_overrides=json.loads(overrides.text) if overrides is not None else None,
        trust_remote_code=bool(values.get("trust_remote_code")),
    )


def with_built_weights(
    spec: ModelSpec,
    options: ServeOptions,
    value: str,
    settings: Settings,
    values: Mapping[str, Any],
) -> tuple[ModelSpec, tuple[str, ...]]:
    """``spec`` with the weights vLLM built where ``value`` asks for them; the warnings
    to show (why it fell back to the config)."""
    try:
        python = _python(value, settings)
        if python is None:
            return spec, ()
        built = build_weights(_request(spec, options, values), python=python)
    except MetaBuildError as e:
        return spec, (f"{e.message}; the weights are sized from config.json instead",)
    return replace(spec, built=built), ()
