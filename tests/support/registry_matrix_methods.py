"""The registry matrix's columns, read by both of its sides (pure data, no imports:
``registry_matrix_vllm.py`` runs in the vLLM environment, ``registry_matrix.py`` in
gatekeeper's)."""

__all__ = ["METHODS"]

METHODS = (
    "none",
    "modelopt-nvfp4",
    "modelopt-mixed",
    "ct-nvfp4",
    "ct-w4a16",
    "fp8-block",
    "awq",
    "gptq",
)
"""Unquantized, then each quantization config as its quantizer writes it."""
