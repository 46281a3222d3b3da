"""gatekeeper: admission control for vLLM serving.

Estimate a model's GPU memory the way vLLM accounts it, compare with what the GPUs
have free, and only then launch; or reject with the numbers and what would fit.

The core API, pure and synchronous::

    >>> from gatekeeper import PlacementRequest, ServeOptions, StaticInventory, decide, resolve_model
    >>> from gatekeeper.gpus import parse_declared_node      # or gatekeeper.gpus.NvmlInventory()
    >>> spec = resolve_model("meta-llama/Llama-3.1-8B-Instruct")  # the embedded catalog
    >>> node = StaticInventory(parse_declared_node("2xH100-80GB"))
    >>> d = decide(PlacementRequest(spec, ServeOptions(max_model_len=16384)), node.snapshot())
    >>> d.admitted, d.placement.gpu_indices
    (True, (0,))

The wings (each package's docstring says what it does and what it may import):
``models`` (model facts), ``estimator`` (per-GPU bytes, pure), ``placement`` (decisions,
pure), ``gpus`` (the inventory seam: NVML, declared nodes), ``vllm`` (vLLM's command
line and log), ``sidecar`` (``gatekeeper serve``), ``proxy`` (the OpenAI proxy),
``metrics`` (Prometheus), ``k8s`` (the admission webhook), ``simulator`` (the stand-in
``vllm serve``) and ``cli`` (the ``gatekeeper`` command). Importing this package loads
no HTTP, NVML or Prometheus library.
"""

from typing import TYPE_CHECKING

from gatekeeper._lazy import face
from gatekeeper._version import __version__
from gatekeeper.errors import (
    GatekeeperError,
    HubError,
    ModelSpecError,
    NvmlUnavailable,
    ServeOptionsError,
    UnknownGpuError,
)

if TYPE_CHECKING:
    from gatekeeper.estimator import Estimate, GpuTarget, ServeOptions, estimate, simple_estimate
    from gatekeeper.gpus.inventory import GpuInfo, GpuInventory, InventorySnapshot
    from gatekeeper.gpus.static import StaticInventory
    from gatekeeper.models import ModelSpec, resolve_model
    from gatekeeper.placement import Decision, PlacementPolicy, PlacementRequest, decide

__all__ = [
    "Decision",
    "Estimate",
    "GatekeeperError",
    "GpuInfo",
    "GpuInventory",
    "GpuTarget",
    "HubError",
    "InventorySnapshot",
    "ModelSpec",
    "ModelSpecError",
    "NvmlUnavailable",
    "PlacementPolicy",
    "PlacementRequest",
    "ServeOptions",
    "ServeOptionsError",
    "StaticInventory",
    "UnknownGpuError",
    "__version__",
    "decide",
    "estimate",
    "resolve_model",
    "simple_estimate",
]

__getattr__, __dir__ = face(globals())
