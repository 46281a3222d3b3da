"""gatekeeper: admission control for vLLM serving.

Estimate a model's GPU memory the way vLLM accounts it, compare with what the GPUs
have free, and only then launch; or reject with the numbers and what would fit.
"""

from gatekeeper.errors import GatekeeperError, ModelSpecError, ServeOptionsError, UnknownGpuError

__version__ = "0.1.0"

__all__ = [
    "GatekeeperError",
    "ModelSpecError",
    "ServeOptionsError",
    "UnknownGpuError",
    "__version__",
]
