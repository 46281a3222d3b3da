"""Check gatekeeper's NVML figures against known allocations, on a real NVIDIA GPU.

    python bench/gpu_check.py [--child-gib 1] [--grandchild-gib 2]

1. Takes a snapshot with ``NvmlInventory`` (honouring ``CUDA_VISIBLE_DEVICES``) and
   picks the placeable GPU with the most free memory.
2. Starts a child process, given that GPU the way gatekeeper gives one to a worker
   (``worker_cuda_env``), that allocates ``--child-gib`` with PyTorch and starts a
   grandchild that allocates ``--grandchild-gib``: a small vLLM-like process tree.
3. Reports NVML's per-process figures for the tree (found through /proc) against the
   allocations, the GPU's used-memory delta, and which NVML index the tree landed on.
   When NVML's pids are not this PID namespace's (a container without host PIDs) or
   it does not report per-process usage, it checks the used-memory delta instead,
   as ``attribution.worker_usage`` does.
4. Ends the tree and checks that the GPU's used memory comes back.

``--sleep-model MODEL`` runs the sleep/wake check instead (``bench/gpu_sleep.py``):
vLLM's sleep mode on that GPU, NVML's figure awake, asleep and woken, against the
residue gatekeeper's ledger keeps for a sleeping worker.

Exit status: 0 when every check passes, 1 when one fails, 2 when there is no NVIDIA
GPU, NVML or CUDA-enabled PyTorch here (with a message saying which).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_sleep import sleep_check
from gatekeeper.gpus import (
    GpuInfo,
    InventorySnapshot,
    NvmlInventory,
    process_tree,
    tree_usage,
    worker_cuda_env,
    worker_usage,
)
from gatekeeper.units import GIB, MIB, format_gib

CHILD_CODE = r"""
import os, subprocess, sys
import torch
level, amounts = int(sys.argv[1]), [int(a) for a in sys.argv[2].split(",")]
block = torch.empty(amounts[level], dtype=torch.uint8, device="cuda")
block.fill_(1)
torch.cuda.synchronize()
print(f"ready {os.getpid()} {amounts[level]}", flush=True)
child = None
if level + 1 < len(amounts):
    code = os.environ["GK_GPU_CHECK_CODE"]
    child = subprocess.Popen([sys.executable, "-c", code, str(level + 1), sys.argv[2]])
sys.stdin.read()
if child is not None:
    child.wait()
"""
CUDA_PROBE = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)"
CONTEXT_ALLOWANCE_BYTES = 2 * GIB
"""Most a CUDA context plus PyTorch's allocator may add to one process's allocation."""
MATCH_TOLERANCE_BYTES = 256 * MIB
RETURN_TOLERANCE_BYTES = 64 * MIB


class CheckError(Exception):
    """The check cannot run here (exit 2)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="NVML figures vs PyTorch allocations.")
    parser.add_argument("--child-gib", type=float, default=1.0)
    parser.add_argument("--grandchild-gib", type=float, default=2.0)
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds for start-up")
    parser.add_argument(
        "--sleep-model",
        help="instead: vLLM's sleep mode on this model (bench/gpu_sleep.py): NVML's figure "
        "awake, asleep at level 1 and woken, against what gatekeeper's ledger keeps asleep",
    )
    parser.add_argument("--vllm", default="vllm", help="the vllm command (--sleep-model)")
    args = parser.parse_args(argv)
    amounts = [int(args.child_gib * GIB), int(args.grandchild_gib * GIB)]
    try:
        with NvmlInventory(visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES")) as nvml:
            if args.sleep_model:
                gpu = pick_gpu(nvml.snapshot(), 8 * GIB)
                return sleep_check(nvml, gpu.index, args.sleep_model, args.vllm, args.timeout)
            return _check(nvml, amounts, args.timeout)
    except CheckError as e:
        print(f"gpu_check: cannot run here: {e}", file=sys.stderr)
        return 2


def _check(nvml: NvmlInventory, amounts: list[int], timeout: float) -> int:
    before = nvml.snapshot()
    gpu = pick_gpu(before, sum(amounts))
    _require_cuda_torch()
    print(f"driver {before.driver_version}, NVML {before.nvml_version}; using GPU {gpu.index} "
          f"({gpu.name}, {gpu.uuid}), used {format_gib(gpu.used_bytes)} before")  # fmt: skip
    env = {**os.environ, **worker_cuda_env([gpu.index]), "GK_GPU_CHECK_CODE": CHILD_CODE}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_CODE, "0", ",".join(map(str, amounts))],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    lines = _line_queue(child.stdout)
    try:
        ready = _wait_ready(child, lines, len(amounts), timeout)
        during = _settle(nvml, gpu.index, set(ready), timeout=30.0)
        results = compare(before, during, gpu.index, process_tree(child.pid), ready)
    finally:
        _stop(child)
    results["returned"] = _wait_return(nvml, gpu, timeout=60.0)
    print(json.dumps(results, indent=2))
    failed = [name for name, ok in results["checks"].items() if not ok]
    failed += [] if results["returned"]["ok"] else ["memory returned after exit"]
    print("gpu_check: " + ("PASS" if not failed else "FAIL: " + "; ".join(failed)))
    return 0 if not failed else 1


def pick_gpu(snapshot: InventorySnapshot, need_bytes: int) -> GpuInfo:
    """The placeable GPU with the most free memory; ``CheckError`` when none will do."""
    if not snapshot.ok:
        raise CheckError(snapshot.error or "NVML gave no snapshot")
    placeable = [g for g in snapshot.gpus if g.placeable]
    if not placeable:
        raise CheckError(f"no placeable GPU among {len(snapshot.gpus)} (unhealthy or MIG)")
    gpu = max(placeable, key=lambda g: g.free_bytes)
    if gpu.free_bytes < need_bytes + 2 * CONTEXT_ALLOWANCE_BYTES:
        raise CheckError(f"GPU {gpu.index} has only {format_gib(gpu.free_bytes)} free")
    return gpu


def _require_cuda_torch() -> None:
    if importlib.util.find_spec("torch") is None:
        raise CheckError("PyTorch is not installed; `pip install torch` (a CUDA build)")
    probe = subprocess.run([sys.executable, "-c", CUDA_PROBE], capture_output=True, check=False)
    if probe.returncode != 0:
        raise CheckError("PyTorch here cannot use CUDA (a CPU-only build?); install a CUDA build")


def _wait_ready(
    child: subprocess.Popen[str], lines: queue.Queue[str | None], count: int, timeout: float
) -> dict[int, int]:
    """pid → bytes allocated, from the processes' ``ready`` lines."""
    ready: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    while len(ready) < count:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            message = f"the allocating processes were not ready in {timeout:.0f} s"
            raise RuntimeError(message) from None
        if line is None:
            raise RuntimeError(f"an allocating process exited early (status {child.poll()})")
        _, pid, allocated = line.split()
        ready[int(pid)] = int(allocated)
    return ready


def _line_queue(stream: IO[str]) -> queue.Queue[str | None]:
    """The stream's lines, read by a thread that owns and closes it (``None`` at end of
    file): a deadline that does not depend on how the text layer buffers the pipe."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        with stream:
            for line in stream:
                lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _settle(nvml: NvmlInventory, index: int, pids: set[int], timeout: float) -> InventorySnapshot:
    """A snapshot in which NVML lists every pid (or the deadline passes)."""
    deadline = time.monotonic() + timeout
    while True:
        snapshot = nvml.snapshot()
        listed = {p.pid for g in snapshot.gpus if g.index == index for p in g.processes}
        if pids <= listed or snapshot.pid_namespace_mismatch or time.monotonic() > deadline:
            return snapshot
        time.sleep(0.2)


def compare(
    before: InventorySnapshot,
    during: InventorySnapshot,
    index: int,
    tree: frozenset[int],
    allocated: dict[int, int],
) -> dict[str, Any]:
    """NVML's figures for the tree against the allocations (pid → bytes), with checks."""
    baseline = {g.index: g.used_bytes for g in before.gpus if g.healthy}
    usage = worker_usage(during, tree, gpu_indices=[index], baseline_used_bytes=baseline)
    delta = during.gpu(index).used_bytes - baseline[index]
    per_process = {p.pid: p.used_bytes for g in during.gpus for p in g.processes if p.pid in tree}
    others = {
        g.index: g.used_bytes - baseline[g.index]
        for g in during.gpus
        if g.index != index and g.healthy and g.index in baseline
    }
    checks = {"other GPUs unchanged (+/-256 MiB)": all(
        abs(d) <= MATCH_TOLERANCE_BYTES for d in others.values()
    )}  # fmt: skip
    if usage.method == "delta":
        checks |= _delta_checks(delta, allocated)
    else:
        checks |= _pid_checks(during, index, tree, allocated, per_process, delta)
    return {
        "gpu": {"index": index, "name": during.gpu(index).name, "uuid": during.gpu(index).uuid},
        "attribution": usage.method,
        "pid_namespace_mismatch": during.pid_namespace_mismatch,
        "allocated_bytes": sum(allocated.values()),
        "tree_bytes": dict(usage.per_gpu_bytes),
        "gpu_used_delta_bytes": delta,
        "overhead_bytes": usage.total_bytes - sum(allocated.values()),
        "processes": [
            {"pid": pid, "allocated_bytes": allocated.get(pid, 0), "nvml_used_bytes": used}
            for pid, used in sorted(per_process.items())
        ],
        "checks": checks,
    }


def _pid_checks(
    during: InventorySnapshot,
    index: int,
    tree: frozenset[int],
    allocated: dict[int, int],
    per_process: dict[int, int | None],
    delta: int,
) -> dict[str, bool]:
    overheads = [(used or 0) - allocated.get(pid, 0) for pid, used in per_process.items()]
    usage = tree_usage(during, tree)
    return {
        "tree pids found by NVML": set(allocated) <= set(per_process),
        "tree only on the chosen GPU": set(usage) == {index},
        "each process holds at least its allocation": all(o >= 0 for o in overheads),
        "overhead per process under 2 GiB": all(o < CONTEXT_ALLOWANCE_BYTES for o in overheads),
        "tree sum matches the GPU's used delta (+/-256 MiB)": (
            abs(usage.get(index, 0) - delta) <= MATCH_TOLERANCE_BYTES
        ),
    }


def _delta_checks(delta: int, allocated: dict[int, int]) -> dict[str, bool]:
    overhead = delta - sum(allocated.values())
    return {
        "used delta covers the allocations": overhead >= 0,
        "used delta overhead under 2 GiB per process": (
            overhead < CONTEXT_ALLOWANCE_BYTES * len(allocated)
        ),
    }


def _stop(child: subprocess.Popen[str]) -> None:
    if child.stdin is not None:
        child.stdin.close()
    try:
        child.wait(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def _wait_return(nvml: NvmlInventory, before: GpuInfo, timeout: float) -> dict[str, Any]:
    start = time.monotonic()
    used = None
    while time.monotonic() - start < timeout:
        gpu = nvml.snapshot().gpu(before.index)
        used = gpu.used_bytes
        if used - before.used_bytes <= RETURN_TOLERANCE_BYTES:
            return {"ok": True, "seconds": round(time.monotonic() - start, 2), "used_bytes": used}
        time.sleep(0.2)
    return {"ok": False, "seconds": timeout, "used_bytes": used}


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except RuntimeError as e:
        print(f"gpu_check: FAIL: {e}", file=sys.stderr)
        raise SystemExit(1) from None
