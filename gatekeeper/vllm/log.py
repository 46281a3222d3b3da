"""What a vLLM worker's log says: start-up phases, its own memory figures, and the
memory errors that end a start-up. Pure: lines in, events out.

Formats (``shared/reference/vllm-memory.md`` §5), after vLLM's
``(ProcessName pid=N) LEVEL MM-DD HH:MM:SS [file.py:N]`` prefix:

- ``Model loading took 14.99 GiB memory and 6.96 seconds``
- ``Memory profiling takes 18.33 seconds. Total non KV cache memory: 17.12GiB; torch peak
  memory increase: 1.89GiB; non-torch forward increase memory: 0.25GiB; weights memory: 14.99GiB.``
- ``Available KV cache memory: 58.11 GiB``
- ``GPU KV cache size: 952,032 tokens`` (``… Maximum concurrency for …: 116.21x``)
- ``Graph capturing finished in 3 secs, took 0.91 GiB``
- ``Free memory on device (78.68/79.19 GiB) on startup. … Actual usage is 14.99 GiB for
  weight, 1.89 GiB for peak activation, 0.25 GiB for non-torch memory, and 0.91 GiB for
  CUDAGraph memory.`` (v0.19) or ``… Actual usage is X GiB for consumed memory (weights +
  non-torch), Y GiB for peak activation, and Z GiB for CUDAGraph memory.`` (v0.33)
- ``Explicitly set (0.25/23.54) GiB for KV cache on node 0.`` (the CPU worker given
  ``--kv-cache-memory-bytes`` or ``VLLM_CPU_KVCACHE_SPACE``: the KV cache, then the NUMA
  node's total memory) or ``Auto set (3.25/23.54) GiB for KV cache on node 0, with …``
  (without them: ``--gpu-memory-utilization`` of the node less what the worker holds)
- ``Starting vLLM server on http://…``
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Literal

from gatekeeper.estimator.components import MEMORY_COMPONENTS
from gatekeeper.units import GIB

__all__ = ["MemoryFigures", "Phase", "StartupLog", "failure_reason", "parse_line"]

Phase = Literal[
    "launching", "loading weights", "profiling memory", "capturing graphs", "starting server"
]

_NUM = r"(-?[\d.]+)"
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("weights", re.compile(rf"Model loading took {_NUM} ?GiB")),
    ("weights", re.compile(rf"Loading model weights took {_NUM} ?GB")),
    ("kv_cache", re.compile(rf"Available KV cache memory: {_NUM} ?GiB")),
    ("kv_cache", re.compile(rf"reserved {_NUM} GiB memory for KV Cache")),
    ("kv_cache", re.compile(rf"(?:Explicitly|Auto) set \({_NUM}/[\d.]+\) GiB for KV cache")),
    ("cuda_graph", re.compile(rf"Graph capturing finished in [\d.]+ secs?, took {_NUM} GiB")),
    ("activation_peak", re.compile(rf"torch peak memory increase: {_NUM} ?GiB")),
    ("non_torch", re.compile(rf"non-torch forward increase memory: {_NUM} ?GiB")),
    ("activation_with_graphs", re.compile(rf"consumed memory .*?{_NUM} GiB for peak activation")),
    ("activation_peak", re.compile(rf"GiB for weight, {_NUM} GiB for peak activation")),
    ("cuda_graph_estimate", re.compile(rf"Estimated CUDA graph memory: {_NUM} GiB total")),
    ("consumed", re.compile(rf"Actual usage is {_NUM} GiB for consumed memory")),
    ("non_torch", re.compile(rf"{_NUM} GiB for non-torch memory")),
)
_TOKENS = re.compile(r"KV cache size: ([\d,]+) tokens")
_PHASES: tuple[tuple[Phase, re.Pattern[str]], ...] = (
    (
        "loading weights",
        re.compile(r"Loading (model )?weights|Starting to load model|Loading safetensors"),
    ),
    (
        "profiling memory",
        re.compile(r"Model loading took|Memory profiling|Loading model weights took"),
    ),
    (
        "capturing graphs",
        re.compile(r"Capturing CUDA graph|Graph capturing|Profiling CUDA graph|KV cache size"),
    ),
    (
        "starting server",
        re.compile(r"init engine .* took|Starting vLLM (API )?server|Started server process"),
    ),
)
_FAILURES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"Free memory on device .* is less than desired GPU memory utilization"),
        "free-memory check",
    ),
    (
        re.compile(r"To serve at least one request with the model's max seq len"),
        "max_model_len check",
    ),
    (
        re.compile(r"larger than the maximum number of tokens that can be stored in KV cache"),
        "max_model_len check",
    ),
    (re.compile(r"No available memory for the cache blocks"), "no KV cache memory"),
    (  # the CPU worker (v1/worker/cpu_worker.py): its node has less free than the KV cache
        re.compile(r"on kv cache allocation is less than requested memory for kv"),
        "no KV cache memory",
    ),
    (  # the CPU worker's free-memory check: --gpu-memory-utilization of the node's memory
        re.compile(r"on startup is less than desired CPU memory utilization"),
        "free-memory check",
    ),
    (re.compile(r"Failed to load model - not enough GPU memory"), "out of memory while loading"),
    (
        re.compile(r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError"),
        "CUDA out of memory",
    ),
)


@dataclass(frozen=True, slots=True)
class MemoryFigures:
    """Per-GPU memory vLLM itself reported, in bytes (None where it said nothing)."""

    weights: int | None = None
    kv_cache: int | None = None
    activation_peak: int | None = None
    non_torch: int | None = None
    cuda_graph: int | None = None
    kv_cache_tokens: int | None = None
    activation_with_graphs: int | None = None
    """v0.33's summary: "peak activation" there includes the CUDA-graph estimate."""
    cuda_graph_estimate: int | None = None
    consumed: int | None = None
    """v0.33's summary: weights plus non-torch memory."""

    def components(self) -> dict[str, int]:
        """The components reported, by ``gatekeeper.estimator.components``' ``log_key``."""
        names = (c.log_key for c in MEMORY_COMPONENTS)
        out = {n: v for n in names if (v := getattr(self, n)) is not None}
        if "non_torch" not in out and self.consumed is not None and self.weights is not None:
            out["non_torch"] = max(0, self.consumed - self.weights)
        if "activation_peak" not in out and self.activation_with_graphs is not None:
            graphs = self.cuda_graph_estimate or 0
            out["activation_peak"] = max(0, self.activation_with_graphs - graphs)
        return out


@dataclass(frozen=True, slots=True)
class StartupLog:
    """What the log has said so far."""

    phase: Phase = "launching"
    memory: MemoryFigures = field(default_factory=MemoryFigures)
    failure: str | None = None
    """The vLLM memory error that ended the start-up, with its own text."""
    phases_seen: tuple[Phase, ...] = ()

    def feed(self, line: str) -> StartupLog:
        return parse_line(self, line)


def _phase_order(phase: Phase) -> int:
    return ["launching", *(p for p, _ in _PHASES)].index(phase)


def parse_line(state: StartupLog, line: str) -> StartupLog:
    """``state`` updated with one log line."""
    memory = state.memory
    for name, pattern in _PATTERNS:
        match = pattern.search(line)
        if match:
            memory = replace(memory, **{name: round(float(match.group(1)) * GIB)})
    tokens = _TOKENS.search(line)
    if tokens:
        memory = replace(memory, kv_cache_tokens=int(tokens.group(1).replace(",", "")))
    phase, seen = state.phase, state.phases_seen
    for candidate, pattern in _PHASES:
        if pattern.search(line) and _phase_order(candidate) > _phase_order(phase):
            phase, seen = candidate, (*seen, candidate)
    failure = state.failure or failure_reason(line)
    return StartupLog(phase=phase, memory=memory, failure=failure, phases_seen=seen)


def failure_reason(line: str) -> str | None:
    """``"<kind>: <vLLM's message>"`` when the line is one of vLLM's memory errors."""
    for pattern, kind in _FAILURES:
        match = pattern.search(line)
        if match:
            text = line[line.find("Error:") + 6 :].strip() if "Error:" in line else line.strip()
            return f"{kind}: {text[:400]}"
    return None
