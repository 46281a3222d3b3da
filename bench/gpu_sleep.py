"""The sleep/wake check of ``bench/gpu_check.py --sleep-model MODEL``, for a GPU day.

vLLM's CPU build has no sleep mode (``is_sleep_mode_available`` is CUDA, ROCm and XPU
only), so what gatekeeper's ledger keeps for a sleeping worker (its bytes less the
weights and the KV cache vLLM's CuMemAllocator releases: ``gatekeeper.vllm.sleep_mode``)
can only be checked on a GPU. On the GPU ``gpu_check`` picks:

1. ``vllm serve MODEL --enable-sleep-mode`` with ``VLLM_SERVER_DEV_MODE=1`` (the
   ``--vllm`` command, default ``vllm``), until ``/health`` answers 200; its log's
   weights and KV cache figures read as gatekeeper reads them (``StartupLog``);
2. NVML's used memory of the GPU awake, after ``POST /sleep?level=1``, and after
   ``POST /wake_up`` (a chat request answered then);
3. checks: asleep = awake - weights - KV cache within ``RESIDUE_TOLERANCE_BYTES``
   (gatekeeper's residue), and the memory back within ``MATCH_TOLERANCE_BYTES`` after
   the wake. Prints the figures as JSON and PASS or FAIL.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gatekeeper.gpus import NvmlInventory, worker_cuda_env
from gatekeeper.units import MIB, format_gib
from gatekeeper.vllm import DEV_MODE_ENV, SLEEP_FLAG, StartupLog, asleep_bytes

__all__ = ["RESIDUE_TOLERANCE_BYTES", "sleep_check"]

RESIDUE_TOLERANCE_BYTES = 512 * MIB
MATCH_TOLERANCE_BYTES = 256 * MIB
PORT = 18731


def sleep_check(nvml: NvmlInventory, gpu_index: int, model: str, vllm: str, timeout: float) -> int:
    """Run the check on ``gpu_index``; 0 PASS, 1 FAIL, 2 when vLLM is not here."""
    if shutil.which(vllm) is None:
        print(f"gpu_check: cannot run here: no {vllm!r} command (a CUDA build of vLLM)",
              file=sys.stderr)  # fmt: skip
        return 2
    before = nvml.snapshot().gpu(gpu_index).used_bytes
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / "gpu_check_sleep.log"
    command = [vllm, "serve", model, SLEEP_FLAG, "--gpu-memory-utilization", "0.5",
               "--host", "127.0.0.1", "--port", str(PORT)]  # fmt: skip
    env = {**os.environ, **worker_cuda_env([gpu_index]), **DEV_MODE_ENV}
    with open(log_path, "w") as log:
        worker = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{PORT}"
    try:
        _wait_health(worker, url, timeout, log_path)
        figures = _log_figures(log_path)
        awake = _used(nvml, gpu_index) - before
        answer = httpx.post(f"{url}/sleep", params={"level": 1}, timeout=120)
        time.sleep(2.0)
        asleep = _used(nvml, gpu_index) - before
        woke = httpx.post(f"{url}/wake_up", timeout=120)
        time.sleep(2.0)
        after = _used(nvml, gpu_index) - before
        chat = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": "hi",
                          "max_tokens": 2}, timeout=60)  # fmt: skip
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=60)
    expected = asleep_bytes(awake, figures["weights"], figures["kv_cache"])
    results: dict[str, Any] = {
        "model": model, "gpu": gpu_index, "awake_bytes": awake, "asleep_bytes": asleep,
        "after_wake_bytes": after, "expected_asleep_bytes": expected, "log": figures,
        "sleep_answer": answer.json() if answer.status_code == 200 else answer.text,
        "wake_answer": woke.json() if woke.status_code == 200 else woke.text,
        "checks": {
            "/sleep 200": answer.status_code == 200,
            "/wake_up 200 awake": woke.status_code == 200 and woke.json().get("status") == "awake",
            f"asleep = awake - weights - KV (+/-{format_gib(RESIDUE_TOLERANCE_BYTES)})":
                abs(asleep - expected) <= RESIDUE_TOLERANCE_BYTES,
            f"awake again (+/-{format_gib(MATCH_TOLERANCE_BYTES)})":
                abs(after - awake) <= MATCH_TOLERANCE_BYTES,
            "answers after the wake": chat.status_code == 200,
        },
    }  # fmt: skip
    print(json.dumps(results, indent=2))
    failed = [name for name, ok in results["checks"].items() if not ok]
    print("gpu_check --sleep-model: " + ("PASS" if not failed else "FAIL: " + "; ".join(failed)))
    print(f"awake {format_gib(awake)}, asleep {format_gib(asleep)} (gatekeeper keeps "
          f"{format_gib(expected)}), after wake {format_gib(after)}")  # fmt: skip
    return 0 if not failed else 1


def _used(nvml: NvmlInventory, index: int) -> int:
    return nvml.snapshot().gpu(index).used_bytes


def _wait_health(worker: subprocess.Popen[bytes], url: str, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if worker.poll() is not None:
            tail = log.read_text()[-2000:]
            raise RuntimeError(f"vllm serve exited {worker.returncode}:\n{tail}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"vllm serve not ready in {timeout:.0f} s (log: {log})")
        time.sleep(1.0)


def _log_figures(log: Path) -> dict[str, int]:
    state = StartupLog()
    for line in log.read_text().splitlines():
        state = state.feed(line)
    components = state.memory.components()
    return {"weights": components.get("weights", 0), "kv_cache": components.get("kv_cache", 0)}
