"""The errors gatekeeper raises.

Every error derives from ``GatekeeperError`` and its message has three parts: what
failed, the numbers or the value involved, and what to do next.

- ``ModelSpecError``: a model reference cannot be turned into architecture facts
  (unknown model, a config without a needed field, unreadable safetensors header).
- ``ServeOptionsError``: a serving option is invalid (zero size, TP that does not
  divide the heads, unknown quantization or KV dtype).
- ``UnknownGpuError``: a GPU product name is not in the GPU table.
- ``NvmlUnavailable``: NVML cannot be used at all (no driver or library, bindings
  missing, or it refused to start); ``field`` is the step (``nvmlInit`` or ``pynvml``),
  ``value`` the NVML error name or the missing module, and the message says how to
  plan without a GPU (a declared node).
"""

from __future__ import annotations

__all__ = [
    "GatekeeperError",
    "HubError",
    "ModelSpecError",
    "NvmlUnavailable",
    "ServeOptionsError",
    "UnknownGpuError",
]


class GatekeeperError(Exception):
    """Base of every error gatekeeper raises on purpose."""

    def __init__(self, message: str, *, field: str | None = None, value: object = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.value = value

    def __str__(self) -> str:
        return self.message


class ModelSpecError(GatekeeperError):
    """A model reference could not be turned into architecture facts."""


class ServeOptionsError(GatekeeperError):
    """A serving option is out of range or inconsistent with the model."""


class UnknownGpuError(GatekeeperError):
    """A GPU product name is not in the GPU table."""


class HubError(ModelSpecError):
    """The Hugging Face hub could not provide a model's config or metadata."""


class NvmlUnavailable(GatekeeperError):
    """NVML cannot be used at all: no NVIDIA driver or library, or it refused to start.

    The message says how to run without a GPU (a declared node)."""
