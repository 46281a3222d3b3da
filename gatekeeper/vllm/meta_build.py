"""Build a model as vLLM builds it, on the meta device, and say what it allocates.

A standalone script, run by the Python of an environment where vLLM is installed (the
sidecar's own environment never imports vLLM, nor this file)::

    PYTHON gatekeeper/vllm/meta_build.py JOBS.json OUT.jsonl

``JOBS.json`` is a list of jobs, each ``{"id": ..., "model": DIR}`` with ``DIR`` holding a
``config.json`` and optionally ``"quantization"`` (``--quantization``), ``"dtype"``
(default ``auto``), ``"tensor_parallel_size"`` (default 1), ``"hf_overrides"``,
``"max_model_len"``, ``"trust_remote_code"``, ``"language_model_only"`` (a multimodal
class without its towers, as ``--limit-mm-per-prompt`` giving 0 to every modality). For each job, in this one process:

- ``ModelConfig`` and ``VllmConfig`` as ``vllm serve`` makes them, which picks and builds
  the quantization config (``get_quant_config``) the way vLLM does;
- ``initialize_model`` under the model dtype on the meta device: vLLM's own model class,
  its ``configure_quant_config`` (``hf_to_vllm_mapper``, ``packed_modules_mapping``) and
  ``get_quant_method(layer, prefix)`` + ``create_weights`` for every module. No kernel runs
  and ``process_weights_after_loading`` is not called (it repacks for kernels; what the
  GPU holds is what ``create_weights`` made), so nothing is allocated anywhere.

One JSON line per job goes to ``OUT.jsonl`` as soon as it is known (a crash loses only
the job in progress): every parameter and buffer (name -> ``[shape, dtype, bytes]``; a
shared tensor once), every module's class and the quantize method vLLM chose for it, and
``weights_bytes``: their sum, plus what ``process_weights_after_loading`` adds (MLA's
dequantized ``W_UV``/``W_UK_T``: ``mla_copies``) less what it frees
(``freed_after_loading``); or ``"ok": false`` with vLLM's error in one line.

Where the CPU build cannot do a step a GPU does, a stand-in answers and the row names it
in ``stubbed``: kernel choosers that need CUDA (``KERNEL_CHOOSERS``: the method's own
``create_weights`` still runs), and ``torchvision`` when it is not installed (multimodal
model files import it for their processors; a module-level stand-in lets the model class
be built; the vision tower's own layers are torch modules). Under a tensor-parallel size
above 1 the build runs as rank 0 of that many: vLLM's layers read the TP size and rank
when they are built (``get_tensor_model_parallel_world_size``/``_rank``), so those two
answer the job's size in every module that imported them; nothing communicates on the
meta device.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import tempfile
import time
import traceback
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = [
    "KERNEL_CHOOSERS",
    "STUBBED",
    "build",
    "error_line",
    "freed",
    "main",
    "methods",
    "mla_copies",
    "run",
    "setup",
    "stand_ins",
    "stub_kernels",
    "tensors",
]

_KERNELS = "vllm.model_executor.kernels.linear"
KERNEL_CHOOSERS: dict[tuple[str, str], str] = {
    (_KERNELS, "choose_mp_linear_kernel"): "class",
    (_KERNELS, "init_nvfp4_linear_kernel"): "kernel",
    (_KERNELS, "init_mxfp8_linear_kernel"): "kernel",
    (_KERNELS, "init_mxfp4_linear_kernel"): "kernel",
    (_KERNELS, "select_linear_kernel"): "kernel",
    (
        "vllm.model_executor.layers.quantization.utils.marlin_utils",
        "verify_marlin_supported",
    ): "none",
    ("vllm.model_executor.layers.fused_moe.oracle.int_wna16", "select_wna16_moe_backend"): "wna16",
    ("vllm.model_executor.layers.fused_moe.oracle.nvfp4", "select_nvfp4_moe_backend"): "nvfp4",
}
"""Kernel choosers that fail on the CPU build (Marlin 8-bit, NVFP4, MXFP4/MXFP8, WNA16
MoE need CUDA), and what answers instead when they do: a Hopper GPU's choice where the
choice changes what ``create_weights`` allocates (Marlin for WNA16 and NVFP4 experts)."""

STUBBED: list[str] = []
"""What stood in for the GPU during the current job (cleared per job)."""


class NoKernel:
    """Stands for a kernel the CPU build cannot choose: ``create_weights`` only records
    it; it runs in ``process_weights_after_loading`` and ``apply``, which are never called."""

    supports_pre_processed_weights = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def input_quant_key(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def _fallback(kind: str) -> Any:
    if kind == "class":
        return NoKernel
    if kind == "kernel":
        return NoKernel()
    if kind == "wna16":  # Hopper's WNA16 MoE backend
        from vllm.model_executor.layers.fused_moe.oracle.int_wna16 import WNA16MoEBackend

        return WNA16MoEBackend.MARLIN, NoKernel
    if kind == "nvfp4":  # Hopper runs NVFP4 experts through Marlin
        from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import NvFp4MoeBackend

        return NvFp4MoeBackend.MARLIN, NoKernel
    return None


def error_line(exc: BaseException) -> str:
    """vLLM's error in one line."""
    lines = [line.strip() for line in str(exc).splitlines()]
    return f"{type(exc).__name__}: {' '.join(lines)}"[:600]


def _replace_everywhere(original: Any, replacement: Any, name: str) -> None:
    """Rebind ``name`` in every vLLM module that imported ``original`` under it."""
    for key, module in list(sys.modules.items()):
        if (key == "vllm" or key.startswith("vllm.")) and vars(module).get(name) is original:
            setattr(module, name, replacement)


def stub_kernels() -> None:
    """Let a kernel chooser that fails on CPU answer a stand-in (named in the row), so
    that the method's own ``create_weights`` still runs."""
    for (where, name), kind in KERNEL_CHOOSERS.items():
        original = getattr(importlib.import_module(where), name, None)
        if original is None:
            continue

        def chooser(*args: Any, _original: Any = original, _n: str = name, _k: str = kind,
                    **kw: Any) -> Any:  # fmt: skip
            try:
                return _original(*args, **kw)
            except Exception as exc:
                STUBBED.append(f"{_n}: {error_line(exc)[:200]}")
                return _fallback(_k)

        _replace_everywhere(original, chooser, name)


class _AnyAttribute(type):
    """A stand-in class whose every attribute is another stand-in (``InterpolationMode.BICUBIC``)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _stand_in(name)


def _stand_in(name: str) -> Any:
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        STUBBED.append(f"torchvision.{name} called")

    return _AnyAttribute(
        name, (), {"__init__": init, "__call__": lambda self, *a, **k: a[0] if a else None}
    )


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _stand_in(name)


class _TorchvisionStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers ``import torchvision[.x]`` with stand-in modules when torchvision is not
    installed: model files import it at module level for image transforms that a meta
    build never runs."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        global _TORCHVISION_USED
        _TORCHVISION_USED = True
        return _StandInModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []  # a package: its submodules import too
        module.__version__ = "0.0.0+stand-in"  # type: ignore[attr-defined]


def _torchvision_stand_in() -> None:
    """Install the stand-in (once) when torchvision cannot be imported."""
    if any(isinstance(f, _TorchvisionStandIn) for f in sys.meta_path):
        return
    try:
        importlib.import_module("torchvision")
        return
    except Exception:
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
    sys.meta_path.insert(0, _TorchvisionStandIn())


_TORCHVISION_USED = False


def _inspect_in_process() -> None:
    """vLLM inspects a model class it has not imported in a child process (to keep CUDA
    uninitialised in the parent); on the CPU build that child lacks this process's
    stand-ins, so inspect here."""
    from vllm.model_executor.models import registry

    registry._run_in_subprocess = lambda fn: fn()


def _init_distributed(work: Path) -> None:
    """A one-process world (gloo), as a TP 1 worker has; the TP size of a job is answered
    by ``_tensor_parallel``."""
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment

    model = work / "init-model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(_INIT_CONFIG))
    config = VllmConfig(model_config=ModelConfig(model=str(model), skip_tokenizer_init=True))
    with set_current_vllm_config(config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{work}/dist")  # fmt: skip
        ensure_model_parallel_initialized(1, 1)


_INIT_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],  # an MoE model: the expert-parallel group too
    "model_type": "qwen3_moe",
    "vocab_size": 256,
    "hidden_size": 128,
    "intermediate_size": 256,
    "moe_intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "num_experts": 2,
    "num_experts_per_tok": 1,
    "max_position_embeddings": 512,
    "torch_dtype": "bfloat16",
}


def stand_ins() -> None:
    """What the CPU build lacks, stood in for: the torchvision stand-in where it is
    missing, kernel choosers that need CUDA, the registry's child-process inspection."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    _torchvision_stand_in()
    stub_kernels()
    _inspect_in_process()


def setup(work: Path | None = None) -> None:
    """Once per process, before the first build: ``stand_ins`` and a one-process
    distributed world."""
    stand_ins()
    _init_distributed(work or Path(tempfile.mkdtemp(prefix="meta-build-")))


@contextmanager
def _tensor_parallel(size: int) -> Iterator[None]:
    """Rank 0 of ``size``: vLLM's layers size their shards from the TP group's
    ``world_size`` and ``rank_in_group`` (``get_tensor_model_parallel_world_size``/``_rank``
    read them) while they are built."""
    from vllm.distributed import parallel_state

    group = parallel_state.get_tp_group()
    saved = group.world_size, group.rank_in_group
    group.world_size, group.rank_in_group = size, 0
    try:
        yield
    finally:
        group.world_size, group.rank_in_group = saved


def tensors(model: Any) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for items in (model.named_parameters(), model.named_buffers()):
        for name, t in items:
            out[name] = [list(t.shape), str(t.dtype).removeprefix("torch."),
                         t.numel() * t.element_size()]  # fmt: skip
    return out


def methods(model: Any) -> dict[str, str]:
    """module -> the class of the quantize method vLLM chose (modules that have one)."""
    out = {}
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is not None and name:
            out[name] = type(method).__name__
    return out


def _modules(model: Any) -> dict[str, list[Any]]:
    """module -> [its class, the class of the quantize method vLLM chose or None], for the
    modules that hold tensors of their own or have a quantize method."""
    out = {}
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        own = any(True for _ in module.parameters(recurse=False)) or any(
            True for _ in module.buffers(recurse=False)
        )
        if name and (own or method is not None):
            out[name] = [type(module).__name__, type(method).__name__ if method else None]
    return out


def mla_copies(model: Any) -> dict[str, int]:
    """``MLAAttention.process_weights_after_loading`` replaces ``W_UV`` and ``W_UK_T`` with
    ``split_kv_b_proj``'s output in the model dtype: views of ``kv_b_proj`` when it is
    unquantized, dequantized copies (heads x kv_lora_rank x (qk_nope + v_head) elements)
    when it is not. That step needs kernels, so the copies are counted here."""
    out = {}
    for name, module in model.named_modules():
        kv_b = getattr(module, "kv_b_proj", None)
        if type(module).__name__ != "MLAAttention" or kv_b is None:
            continue
        if type(getattr(kv_b, "quant_method", None)).__name__.startswith("Unquantized"):
            continue
        per_head = module.kv_lora_rank * (module.qk_nope_head_dim + module.v_head_dim)
        out[name] = module.num_heads * per_head * kv_b.params_dtype.itemsize
    return out


def freed(model: Any) -> dict[str, int]:
    """Parameters ``create_weights`` registers that the method's
    ``process_weights_after_loading`` frees: Quark W8A8 int8's ``weight_zero_point`` (and a
    symmetric input's ``input_zero_point``), AutoGPTQ MoE's ``w13_bias``/``w2_bias``
    unless the checkpoint loaded expert biases."""
    out: dict[str, int] = {}
    for name, module in model.named_modules():
        method = type(getattr(module, "quant_method", None)).__name__
        scheme = type(getattr(module, "scheme", None)).__name__
        drop: tuple[str, ...] = ()
        if scheme == "QuarkW8A8Int8":
            drop = ("weight_zero_point",)
            drop += ("input_zero_point",) if module.scheme.input_symmetric else ()
        elif method == "AutoGPTQMoEMethod":
            drop = ("w13_bias", "w2_bias")
        for param in drop:
            tensor = getattr(module, param, None)
            if tensor is not None:
                out[f"{name}.{param}"] = tensor.numel() * tensor.element_size()
    return out


def vllm_configs(job: dict[str, Any]) -> Any:
    """``VllmConfig`` for a job, as ``vllm serve`` would make it from the same flags."""
    from vllm.config import ModelConfig, ParallelConfig, VllmConfig

    model_config = ModelConfig(
        model=str(job["model"]),
        skip_tokenizer_init=True,
        dtype=job.get("dtype") or "auto",
        max_model_len=job.get("max_model_len"),
        quantization=job.get("quantization"),
        hf_overrides=job.get("hf_overrides") or {},
        trust_remote_code=bool(job.get("trust_remote_code")),
        enforce_eager=True,
        allow_deprecated_quantization=True,
        language_model_only=bool(job.get("language_model_only")),
    )
    return VllmConfig(
        model_config=model_config,
        parallel_config=ParallelConfig(
            tensor_parallel_size=int(job.get("tensor_parallel_size") or 1)
        ),
    )


def build(job: dict[str, Any]) -> dict[str, Any]:
    """Build one job's model on the meta device; its row (raises vLLM's error)."""
    import torch
    import vllm
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    STUBBED.clear()
    started = time.monotonic()
    tp = int(job.get("tensor_parallel_size") or 1)
    with _tensor_parallel(tp):
        vllm_config = vllm_configs(job)
        model_config = vllm_config.model_config
        with (
            set_current_vllm_config(vllm_config),
            set_default_torch_dtype(model_config.dtype),
            torch.device("meta"),
        ):
            model = initialize_model(vllm_config=vllm_config)
    held, copies, dropped = tensors(model), mla_copies(model), freed(model)
    quant = vllm_config.quant_config
    stubbed = sorted(set(STUBBED))
    if _TORCHVISION_USED:
        stubbed.append("torchvision (not installed; a module-level stand-in was imported)")
    return {
        "id": job.get("id"),
        "ok": True,
        "vllm_version": vllm.__version__,
        "architecture": model_config.architecture,
        "model_class": type(model).__name__,
        "dtype": str(model_config.dtype).removeprefix("torch."),
        "tensor_parallel_size": tp,
        "quantization": model_config.quantization,
        "config_class": type(quant).__name__ if quant is not None else None,
        "stubbed": stubbed,
        "weights_bytes": sum(v[2] for v in held.values())
        + sum(copies.values())
        - sum(dropped.values()),
        "mla_copies": copies,
        "freed_after_loading": dropped,
        "tensors": held,
        "buffers": sorted(name for name, _ in model.named_buffers()),
        "modules": _modules(model),
        "seconds": round(time.monotonic() - started, 3),
    }


def run(jobs: list[dict[str, Any]], out: Path) -> None:
    """Each job's row to ``out`` as soon as it is known (``stage: start`` before it, so
    a job that kills the process is still named)."""
    with out.open("a") as sink:
        for job in jobs:
            sink.write(json.dumps({"id": job.get("id"), "stage": "start"}) + "\n")
            sink.flush()
            try:
                row = build(job)
            except Exception as exc:
                traceback.print_exc()
                row = {"id": job.get("id"), "ok": False, "error": error_line(exc)}
            sink.write(json.dumps(row) + "\n")
            sink.flush()


def main(argv: list[str]) -> int:
    try:
        jobs_file, out_file = argv
    except ValueError:
        raise SystemExit(__doc__) from None
    jobs = json.loads(Path(jobs_file).read_text())
    if not isinstance(jobs, list):
        raise SystemExit(f"{jobs_file}: expected a JSON list of jobs")
    setup()
    run(jobs, Path(out_file))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
