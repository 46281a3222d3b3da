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

vLLM 0.34's extensible KV cache (on by default on CUDA; ``shared/reference/vllm-memory.md``
§8) sizes the KV cache after warm-up and CUDA-graph capture, so "Available KV cache memory"
(``v1/worker/gpu_worker.py:795``) is then the address space reserved, not the cache. Its
lines, as vLLM 0.34.0 formats them:

- ``Memory after warmup: 62.45 GiB free, 0.12 GiB committed to the KV cache, 2.37 GiB
  kept for transient activations (2.37 GiB allocated at peak, 0.0 GiB of torch
  reservation growth); 7478 KV cache blocks (58.42 GiB) fit within the requested 79.19
  GiB. Torch may reserve up to 19.52 GiB.`` (``v1/worker/extensible_kv_cache.py:693``;
  Llama-3.1-8B on an H100, ``tests/vllm/test_log_034.py``)
- ``Remapping the KV cache from 7600 to 7478 blocks to fit the measured budget.`` (line
  525: warm-up committed more than the measured budget fits)
- ``Extended KV cache to 7478 blocks (58.42 GiB).`` (line 536: the cache as committed,
  its physical bytes; the KV figure)
- ``Disabling the extensible KV cache: the model has no KV cache. The KV cache will be
  sized from profiling estimates instead of measured memory.`` (``v1/executor/
  abstract.py:175``, a WARNING; "Available KV cache memory" is then the cache again)

and "GPU KV cache size: N tokens" (``v1/core/kv_cache_utils.py:1168``) comes after the
sizing, with the final blocks. The KV figure is the "Extended KV cache" line's, else the
blocks' bytes of "Memory after warmup"; the reserved capacity is kept apart
(``MemoryFigures.kv_cache_capacity``). With the cache off (``--kv-cache-memory-bytes``,
``--no-enable-extensible-kv-cache``) 0.34 prints no "Estimated CUDA graph memory" line: the
estimate is read from ``CUDA graph pool memory: 0.91 GiB (actual), 0.85 GiB (estimated),
difference: 0.06 GiB (6.6%).`` (``gpu_worker.py:1112``; printed by 0.33 too).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Literal

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
    (
        "cuda_graph_estimate",
        re.compile(rf"CUDA graph pool memory: [-\d.]+ GiB \(actual\), {_NUM} GiB \(estimated\)"),
    ),
    ("consumed", re.compile(rf"Actual usage is {_NUM} GiB for consumed memory")),
    ("non_torch", re.compile(rf"{_NUM} GiB for non-torch memory")),
)
_TOKENS = re.compile(r"KV cache size: ([\d,]+) tokens")
_AFTER_WARMUP = re.compile(
    rf"Memory after warmup: {_NUM} GiB free, {_NUM} GiB committed to the KV cache, {_NUM} GiB "
    rf"kept for transient activations \({_NUM} GiB allocated at peak, {_NUM} GiB of torch "
    rf"reservation growth\); (\d+) KV cache blocks \({_NUM} GiB\) fit within the requested "
    rf"{_NUM} GiB"
)
_EXTENDED = re.compile(rf"Extended KV cache to (\d+) blocks \({_NUM} GiB\)")
_REMAPPED = re.compile(r"Remapping the KV cache from (\d+) to (\d+) blocks")
_DISABLED = re.compile(r"Disabling the extensible KV cache: ")
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
        re.compile(
            r"Capturing CUDA graph|Graph capturing|Profiling CUDA graph|KV cache size"
            r"|Memory after warmup|Extended KV cache to"
        ),
    ),
    (
        "starting server",
        re.compile(r"init engine .* took|Starting vLLM (API )?server|Started server process"),
    ),
)
_FAILURES: tuple[tuple[re.Pattern[str], str], ...] = (
    (  # --enable-sleep-mode on a platform without it, the CPU build's (config/model.py)
        re.compile(r"Sleep mode is not supported on current platform"),
        "sleep mode",
    ),
    (
        re.compile(r"Free memory on device .* is less than desired GPU memory utilization"),
        "free-memory check",
    ),
    (  # vLLM 0.34 with weights held outside the process (v1/worker/utils.py:763)
        re.compile(r"Free memory on device .* is less than the engine's budget"),
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
    (  # --max-model-len auto with no room for one token (kv_cache_planning.py:1436, 0.34)
        re.compile(r"Cannot auto-fit max_model_len: not enough GPU memory"),
        "no KV cache memory",
    ),
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
    extensible_kv_cache: bool | None = None
    """vLLM 0.34's extensible KV cache: True once the log sized it after warm-up ("Memory
    after warmup", "Extended KV cache to"), False once it said "Disabling the extensible
    KV cache", None where it said neither (releases before 0.34, or the cache off by a flag)."""
    kv_cache_capacity: int | None = None
    """With the extensible KV cache, "Available KV cache memory": the address space
    reserved before warm-up (``kv_cache`` is then the cache as sized after it)."""
    kv_cache_blocks: int | None = None
    """With the extensible KV cache, the blocks committed ("Extended KV cache to N blocks",
    else "Memory after warmup"'s or "Remapping"'s count)."""
    free_after_warmup: int | None = None
    """"Memory after warmup: X GiB free": the device's free memory the sizing measured."""
    transient_reserve: int | None = None
    """"X GiB kept for transient activations": the larger of the transient peak and the
    torch reservation's growth, kept free beside the cache."""
    transient_peak: int | None = None
    """"(X GiB allocated at peak, ...": the activation peak the sizing measured."""
    torch_reserve_growth: int | None = None
    """"..., X GiB of torch reservation growth)"."""
    requested_memory: int | None = None
    """"fit within the requested X GiB": ``ceil(gpu_memory_utilization x total)``, 1.0 of
    the device by default with the extensible KV cache."""

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


def _gib(text: str) -> int:
    return round(float(text) * GIB)


def _extensible(memory: MemoryFigures, line: str) -> MemoryFigures:
    """``memory`` with vLLM 0.34's extensible-KV-cache lines read (module docstring)."""
    sized: dict[str, Any] = {}
    if (after := _AFTER_WARMUP.search(line)) is not None:
        free, _committed, reserve, peak, growth, blocks, kv, requested = after.groups()
        sized = {
            "free_after_warmup": _gib(free),
            "transient_reserve": _gib(reserve),
            "transient_peak": _gib(peak),
            "torch_reserve_growth": _gib(growth),
            "requested_memory": _gib(requested),
            "kv_cache_blocks": int(blocks),
            "kv_cache": _gib(kv),  # the blocks' bytes, until "Extended KV cache to" says
        }
    elif (extended := _EXTENDED.search(line)) is not None:
        sized = {"kv_cache_blocks": int(extended.group(1)), "kv_cache": _gib(extended.group(2))}
    elif (remapped := _REMAPPED.search(line)) is not None:
        sized = {"kv_cache_blocks": int(remapped.group(2))}
    elif _DISABLED.search(line):
        return replace(memory, extensible_kv_cache=False)
    if not sized:
        return memory
    if memory.extensible_kv_cache is not True:  # what "Available KV cache memory" said
        sized["kv_cache_capacity"] = memory.kv_cache
        if "kv_cache" not in sized:
            sized["kv_cache"] = None  # the capacity is not the cache: no figure yet
    return replace(memory, extensible_kv_cache=True, **sized)


def parse_line(state: StartupLog, line: str) -> StartupLog:
    """``state`` updated with one log line."""
    memory = state.memory
    for name, pattern in _PATTERNS:
        match = pattern.search(line)
        if match:
            if name == "kv_cache" and memory.extensible_kv_cache:
                name = "kv_cache_capacity"  # already sized: this is the reservation
            figure: dict[str, Any] = {name: _gib(match.group(1))}
            memory = replace(memory, **figure)
    memory = _extensible(memory, line)
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
