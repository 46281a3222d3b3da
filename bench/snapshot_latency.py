"""Snapshot latency of ``NvmlInventory`` on the NVML stand-in: 8 GPUs, 50 processes.

Builds the stand-in (gatekeeper/gpus/stand_in/fake_nvml.c) with gcc into a temporary
directory, loads it in this process, takes warm-up snapshots, then times ``--runs``
snapshots and prints the median, the 90th percentile and the extremes.

The stand-in re-reads its state file on every NVML call (about 70 per snapshot
here), so this measures gatekeeper plus pynvml plus that file parsing: an upper bound
on gatekeeper's own cost, not a figure for a real driver (``bench/gpu_check.py``).

    python bench/snapshot_latency.py [--runs 500]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gatekeeper.gpus import NvmlInventory, read_parent_map  # noqa: E402
from gatekeeper.gpus.stand_in import STATE_ENV, FakeProcess, build_stub, h100, write_state  # noqa: E402
from gatekeeper.units import GIB  # noqa: E402

GPUS = 8
PROCESSES = 50


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            library = build_stub(Path(tmp) / "lib")
        except (FileNotFoundError, RuntimeError) as e:
            print(f"snapshot_latency: cannot build the NVML stand-in: {e}", file=sys.stderr)
            return 1
        ctypes.CDLL(str(library))
        state = Path(tmp) / "state.txt"
        pids = sorted(read_parent_map())[:PROCESSES]  # real pids, as on a host
        pids += [os.getpid()] * (PROCESSES - len(pids))
        processes = [FakeProcess(i % GPUS, pid, GIB) for i, pid in enumerate(pids)]
        gpus = [
            h100(i, used_bytes=sum(1 for p in processes if p.gpu == i) * GIB) for i in range(GPUS)
        ]
        write_state(state, gpus, processes)
        os.environ[STATE_ENV] = str(state)
        return _measure(args.runs)


def _measure(runs: int) -> int:
    with NvmlInventory() as inventory:
        for _ in range(20):
            snapshot = inventory.snapshot()
        if not snapshot.ok or len(snapshot.gpus) != GPUS:
            print(f"snapshot_latency: the stand-in did not serve {GPUS} GPUs: {snapshot.error}")
            return 1
        assert sum(len(g.processes) for g in snapshot.gpus) == PROCESSES
        samples = []
        for _ in range(runs):
            start = time.perf_counter()
            inventory.snapshot()
            samples.append(time.perf_counter() - start)
    samples.sort()
    ms = [s * 1000 for s in samples]
    p90 = ms[int(0.9 * (len(ms) - 1))]
    print(
        f"NvmlInventory.snapshot on the stand-in, {GPUS} GPUs, {PROCESSES} processes, "
        f"{runs} runs: median {statistics.median(ms):.3f} ms, p90 {p90:.3f} ms, "
        f"min {ms[0]:.3f} ms, max {ms[-1]:.3f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
