"""``--dtype`` as vLLM resolves it for a model.

Pure. vLLM 0.32 (``vllm/config/model.py``: ``_get_and_verify_dtype``, ``_resolve_auto_dtype``,
``_FLOAT16_NOT_SUPPORTED_MODELS``) on a GPU with bfloat16 (Ampere and later: the platform's
``supported_dtypes`` are bfloat16, float16, float32; the x86 CPU build's are the same).
"""

from __future__ import annotations

from gatekeeper.errors import ServeOptionsError
from gatekeeper.models.spec import ModelSpec

__all__ = ["FLOAT16_REFUSED", "resolve_dtype"]

_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "half": "float16",
           "fp16": "float16", "float32": "float32", "float": "float32", "fp32": "float32"}  # fmt: skip


FLOAT16_REFUSED = frozenset({"gemma2", "gemma3", "gemma3_text", "glm4"})
"""Model types vLLM will not run in float16 (``_FLOAT16_NOT_SUPPORTED_MODELS``)."""


def resolve_dtype(flag: str, spec: ModelSpec, *, v1: bool, pooling: bool = False) -> str:
    """``--dtype`` as vLLM 0.32 resolves it (``_get_and_verify_dtype`` and
    ``_resolve_auto_dtype`` in vllm/config/model.py, a GPU with bf16): auto keeps the
    checkpoint dtype, except that float32 checkpoints are served in bfloat16 (float16 on
    the V0 engine, and for a pooling runner), and float16 ones of a model type that
    refuses float16 (Gemma 2/3, GLM-4) in bfloat16; float16 given for those is refused."""
    no_fp16 = spec.model_type in FLOAT16_REFUSED
    if flag == "auto":
        if spec.torch_dtype == "float32":
            return "float16" if (not v1 or pooling) and not no_fp16 else "bfloat16"
        if spec.torch_dtype == "float16" and no_fp16:
            return "bfloat16"
        return spec.torch_dtype
    dtype = _DTYPES.get(flag.lower())
    if dtype is None:
        raise ServeOptionsError(
            f"dtype: {flag!r} is not a vLLM dtype; use auto, bfloat16, float16 or float32",
            field="dtype",
            value=flag,
        )
    if dtype == "float16" and no_fp16:
        raise ServeOptionsError(
            f"dtype: vLLM refuses float16 for {spec.model_type} models (numerical "
            "instability); use bfloat16 or float32",
            field="dtype",
            value=flag,
        )
    return dtype
