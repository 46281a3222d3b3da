"""Measure a real vLLM worker's own host memory on the CPU build: the figures behind
``gatekeeper.estimator.host``'s process floor (docs/host-memory.md).

    PYTHONPATH=. .venv/bin/python -m tests.support.host_baseline [KV_GIB ...]

For each KV size (``VLLM_CPU_KVCACHE_SPACE``, GiB, default 1 and 3) it serves the tiny
Llama (``build_tiny_model``) with ``--enforce-eager --max-model-len 512``, waits for
``/health``, lets it settle 5 s, and prints one JSON line: each process of the tree with
its PSS and RSS (``gatekeeper.gpus.host_usage``, as the sidecar reads them). The CPU
build keeps the KV cache in the worker's host memory, all of it touched, so the worker's
own bytes are its PSS less the KV GiB; two KV sizes show that.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from gatekeeper.gpus.host_usage import process_host_bytes
from gatekeeper.gpus.proctree import process_tree
from tests.support.real_vllm import (
    VllmServer,
    build_tiny_model,
    cpu_serve_args,
    free_port,
    remove_tree,
    short_work_dir,
    worker_env,
)

__all__ = ["measure"]


def _rss(pid: int) -> int:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0
    return next((int(x.split()[1]) * 1024 for x in lines if x.startswith("VmRSS:")), 0)


def _name(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "gone"
    text = b" ".join(argv[:3]).decode(errors="replace").strip()
    return text.rsplit("/", 1)[-1][:60]


def measure(model: Path, kv_gib: int) -> dict[str, object]:
    """One worker's process tree, measured once it is ready."""
    work, port = short_work_dir(), free_port()
    args = cpu_serve_args(["tiny-llama", "--max-model-len", "512"], model, port)
    try:
        with VllmServer(args, worker_env(work, kv_cache_gib=kv_gib), work / "vllm.log", port) as s:
            ready = s.wait_ready(600)
            time.sleep(5)
            assert s.proc is not None
            tree = sorted(set(process_tree(s.proc.pid)) | set(s.tree))
            procs = [
                {"pid": p, "process": _name(p), "pss": process_host_bytes(p), "rss": _rss(p)}
                for p in tree
            ]
    finally:
        remove_tree(work)
    return {"kv_gib": kv_gib, "ready_seconds": round(ready, 1), "processes": procs}


def main(argv: list[str]) -> None:
    sizes = [int(a) for a in argv] or [1, 3]
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "tiny-llama")
        for kv in sizes:
            print(json.dumps(measure(model, kv)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
