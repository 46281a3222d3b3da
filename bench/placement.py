"""Placement figures: decision latency, and packing quality against the optimum.

1. **Latency** of ``gatekeeper.placement.decision.decide`` on 8 H100s hosting 50 gatekeeper
   workers (a few still starting, so with reservations): p50 and p99 of admitted
   decisions, of rejections without suggestions (``suggest=False``) and of rejections
   with them (the suggestions run extra searches). "Warm" reuses placement's estimate
   cache, as a sidecar does for a model it has seen; "cold" empties it before each call.
2. **Packing**: seeded random mixes of small and large deployments (catalog models,
   max_model_len 4096..32768) on a declared ``8xH100-80GB`` node, admitted one by one
   in the mix's order by gatekeeper (``PlacementPolicy(share_gpus=True)``, each
   admission's promise then reserved on its GPUs), against

   - the exact optimum: the most deployments of the mix that fit together, an integer
     program solved with ``scipy.optimize.milp``. Per deployment and TP size the
     per-GPU need is gatekeeper's own (``decide`` alone on the empty node with that TP
     and ``auto_parallel=False``); a GPU holds ``GpuLine.usable_bytes`` of the empty
     node. The GPUs are identical, so a TP group is any ``t`` of them: binaries
     ``y[d, t]`` (deployment d runs at TP t) and ``z[d, t, g]`` (and uses GPU g), with
     ``sum_g z[d, t, g] = t * y[d, t]``, ``sum_t y[d, t] <= 1`` and each GPU's load
     ``sum need[d, t] * z[d, t, g] <= usable``. TP sizes that need no less per GPU
     than a smaller one are dropped (never better), and HiGHS's own symmetry detection
     handles the identical GPUs (explicit load-ordering rows made it 8x slower);
   - the rule other managers use: each worker books ``gpu_memory_utilization x total``
     (0.9) on each GPU of its group, TP is the smallest whose need fits in that, and a
     GPU takes a worker only while its booked fractions sum to at most 1.0.

   The optimum ignores order; gatekeeper decides online, in the mix's order, so it can
   fall short of the optimum even when each single decision is the right one.
3. **Sharing**, through the installed CLI: catalog fleets (``FLEETS``) and random mixes
   written as plan files and run by ``gatekeeper plan --json`` with ``share_gpus`` off and
   on (``GATEKEEPER_SHARE_GPUS``): deployments placed, GPUs used, the KV cache in all and
   the sequences of max_model_len per worker, and the refusals that name ``share_gpus``
   (docs/placement.md, "Sharing: off by default"); then the first-day fleet deployed on
   ``gatekeeper serve --rehearsal`` (the simulator as vLLM) both ways: what runs, how
   long it takes to be ready, the KV cache the simulated worker reports.

    python bench/placement.py [--mixes 100] [--seed 7] [--runs 500] [--examples 3]
    python bench/placement.py --sharing [--mixes 20]    # the sharing figures only

Needs scipy (``pip install scipy``), a bench-only dependency.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gatekeeper import (  # noqa: E402
    Decision,
    GatekeeperError,
    ModelSpec,
    PlacementPolicy,
    PlacementRequest,
    ServeOptions,
    decide,
    resolve_model,
)
from gatekeeper.gpus import GpuInfo, GpuProcess, InventorySnapshot, parse_declared_node  # noqa: E402
from gatekeeper.placement import TP_SIZES, EstimateCache  # noqa: E402
from gatekeeper.units import GIB  # noqa: E402

ESTIMATES = EstimateCache()
"""Estimates kept across the packing runs' decisions (the sidecar keeps one the same way)."""

NODE = "8xH100-80GB"
SMALL_MODELS = (
    "Qwen/Qwen3-0.6B",
    "meta-llama/Llama-3.2-1B-Instruct",
    "meta-llama/Llama-3.1-8B-Instruct",
)
LARGE_MODELS = (
    "Qwen/Qwen2.5-14B-Instruct",
    "Qwen/Qwen2.5-32B-Instruct",
    "meta-llama/Llama-3.3-70B-Instruct",
)
MODELS = SMALL_MODELS + LARGE_MODELS
LENGTHS = (4096, 8192, 16384, 32768)
MIX_SIZES = (6, 12)
"""Deployments per mix, inclusive range."""
BOOKED_FRACTION = 0.9
"""The rule's gpu_memory_utilization: the fraction of total each rank books."""
LATENCY_WORKERS = 50
SHARED = PlacementPolicy(share_gpus=True)


@dataclass(frozen=True, slots=True)
class Deployment:
    model: str
    max_model_len: int

    @property
    def label(self) -> str:
        return f"{self.model.split('/')[-1]}@{self.max_model_len // 1024}k"


class Models:
    """Model specs, resolved once."""

    def __init__(self) -> None:
        self._specs: dict[str, ModelSpec] = {}

    def spec(self, name: str) -> ModelSpec:
        if name not in self._specs:
            self._specs[name] = resolve_model(name)
        return self._specs[name]

    def request(self, d: Deployment, tp: int | None = None) -> PlacementRequest:
        """Gatekeeper picks the TP size when ``tp`` is None; else it is fixed."""
        if tp is None:
            return PlacementRequest(self.spec(d.model), ServeOptions(max_model_len=d.max_model_len))
        options = ServeOptions(max_model_len=d.max_model_len, tensor_parallel_size=tp)
        return PlacementRequest(self.spec(d.model), options, auto_parallel=False)


# --- latency -----------------------------------------------------------------------------


def busy_node(seed: int) -> tuple[InventorySnapshot, dict[str, int], dict[str, int]]:
    """8 H100s with 50 running workers spread over them; two GPUs also hold reservations
    for workers still starting."""
    rng = random.Random(seed)
    empty = parse_declared_node(NODE)
    per_gpu = [LATENCY_WORKERS // len(empty.gpus)] * len(empty.gpus)
    for i in range(LATENCY_WORKERS % len(empty.gpus)):
        per_gpu[i] += 1
    gpus: list[GpuInfo] = []
    workers: dict[str, int] = {}
    pid = 10_000
    for gpu, count in zip(empty.gpus, per_gpu, strict=True):
        # 30 to 70 GiB held on each GPU: small models fit, large ones need a TP group
        # or do not fit at all.
        budget = (30 + 40 * rng.random()) * GIB
        sizes = [int(budget * w) for w in _split(rng, count)]
        processes = tuple(GpuProcess(pid=pid + i, used_bytes=s) for i, s in enumerate(sizes))
        pid += count
        used = sum(sizes)
        gpus.append(
            dataclasses.replace(
                gpu, free_bytes=gpu.total_bytes - used, used_bytes=used, processes=processes
            )
        )
        workers[gpu.uuid] = count
    reserved = {gpus[0].uuid: 3 * GIB, gpus[5].uuid: 6 * GIB}
    return dataclasses.replace(empty, gpus=tuple(gpus)), reserved, workers


def _split(rng: random.Random, n: int) -> list[float]:
    weights = [0.5 + rng.random() for _ in range(n)]
    total = sum(weights)
    return [w / total for w in weights]


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def latency(models: Models, runs: int, seed: int) -> None:
    snapshot, reserved, workers = busy_node(seed)
    requests = [models.request(Deployment(m, n)) for m in MODELS for n in LENGTHS]

    warm = EstimateCache()  # held across decisions, as the sidecar holds one

    def call(r: PlacementRequest, suggest: bool, cold: bool = False) -> tuple[float, Decision]:
        cache = EstimateCache() if cold else warm
        start = time.perf_counter()
        d = decide(
            r,
            snapshot,
            reserved=reserved,
            workers=workers,
            policy=SHARED,
            suggest=suggest,
            cache=cache,
        )
        return time.perf_counter() - start, d

    outcome = {id(r): call(r, False)[1].admitted for r in requests}  # also warms the cache
    for r in requests:
        call(r, True)
    admitted = [r for r in requests if outcome[id(r)]]
    rejected = [r for r in requests if not outcome[id(r)]]
    print(
        f"Decision latency: {NODE}, {LATENCY_WORKERS} workers "
        f"({', '.join(str(workers[g.uuid]) for g in snapshot.gpus)} per GPU, "
        f"{sum(reserved.values()) / GIB:.0f} GiB reserved), "
        f"{len(requests)} requests ({len(admitted)} admitted, {len(rejected)} rejected), "
        f"share_gpus=True"
    )
    cases: list[tuple[str, list[PlacementRequest], bool, bool]] = [
        ("admitted, warm", admitted, False, False),
        ("rejected, suggest=False, warm", rejected, False, False),
        ("rejected, with suggestions, warm", rejected, True, False),
    ]
    cases += [
        ("admitted, cold", admitted, False, True),
        ("rejected, suggest=False, cold", rejected, False, True),
    ]
    for label, pool, suggest, cold in cases:
        if not pool:
            print(f"  {label:34s} no such request on this node")
            continue
        samples = []
        for i in range(runs):
            elapsed, d = call(pool[i % len(pool)], suggest, cold)
            assert d.admitted == outcome[id(pool[i % len(pool)])]
            samples.append(elapsed * 1000)
        print(
            f"  {label:34s} n={len(samples):4d}  p50 {statistics.median(samples):6.3f} ms  "
            f"p99 {percentile(samples, 0.99):6.3f} ms  max {max(samples):6.3f} ms"
        )


# --- packing -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Node:
    snapshot: InventorySnapshot
    usable: int
    """Usable bytes of one empty GPU (free - margin), as gatekeeper computes it."""
    total: int
    """Total bytes of one GPU, as vLLM sees it."""


class Needs:
    """Per-GPU need of each deployment at each TP size, from gatekeeper, cached."""

    def __init__(self, models: Models, node: Node) -> None:
        self._models = models
        self._node = node
        self._cache: dict[Deployment, dict[int, int]] = {}

    def of(self, d: Deployment) -> dict[int, int]:
        """TP size -> bytes per GPU, for the TP sizes whose need fits an empty GPU."""
        if d not in self._cache:
            needs: dict[int, int] = {}
            for tp in TP_SIZES:
                if tp > len(self._node.snapshot.gpus):
                    continue
                try:
                    decision = decide(
                        self._models.request(d, tp),
                        self._node.snapshot,
                        policy=SHARED,
                        suggest=False,
                        cache=ESTIMATES,
                    )
                except GatekeeperError:
                    continue  # TP does not divide the heads
                if decision.admitted and decision.placement is not None:
                    needs[tp] = decision.placement.promise_bytes[0]
            self._cache[d] = needs
        return self._cache[d]


def random_mixes(count: int, seed: int) -> list[list[Deployment]]:
    rng = random.Random(seed)
    mixes = []
    for _ in range(count):
        size = rng.randint(*MIX_SIZES)
        mixes.append(
            [
                Deployment(
                    rng.choice(SMALL_MODELS if rng.random() < 0.5 else LARGE_MODELS),
                    rng.choice(LENGTHS),
                )
                for _ in range(size)
            ]
        )
    return mixes


@dataclass(frozen=True, slots=True)
class Run:
    """Gatekeeper's decisions on one mix, admitted in order."""

    decisions: list[Decision]
    loads: dict[str, int]
    """GPU UUID -> bytes promised at the end."""
    oddities: list[str]

    @property
    def admitted(self) -> list[bool]:
        return [d.admitted for d in self.decisions]


def gatekeeper_run(models: Models, node: Node, needs: Needs, mix: Sequence[Deployment]) -> Run:
    """Admit the mix in order; note any decision that disagrees with the needs table."""
    reserved: dict[str, int] = {}
    workers: dict[str, int] = {}
    decisions = []
    oddities = []
    for i, d in enumerate(mix):
        decision = decide(
            models.request(d),
            node.snapshot,
            reserved=reserved,
            workers=workers,
            policy=SHARED,
            suggest=False,
            cache=ESTIMATES,
        )
        decisions.append(decision)
        table = needs.of(d)
        room = sorted(
            (node.usable - reserved.get(g.uuid, 0) for g in node.snapshot.gpus), reverse=True
        )
        fits = [tp for tp, b in sorted(table.items()) if room[tp - 1] >= b]
        if decision.placement is None:
            if fits:
                oddities.append(f"#{i} {d.label} rejected although TP{fits[0]} had room")
            continue
        p = decision.placement
        tp = p.flags.tensor_parallel_size
        if set(p.promise_bytes) != {table.get(tp)}:
            oddities.append(
                f"#{i} {d.label} promised {[b / GIB for b in p.promise_bytes]} GiB at TP{tp}, "
                f"alone it needs {table.get(tp, 0) / GIB:.2f} GiB"
            )
        if fits and tp != fits[0]:
            oddities.append(f"#{i} {d.label} placed at TP{tp} although TP{fits[0]} had room")
        for uuid, promise in decision.promises():
            reserved[uuid] = reserved.get(uuid, 0) + promise
            workers[uuid] = workers.get(uuid, 0) + 1
    return Run(decisions, reserved, oddities)


@dataclass(frozen=True, slots=True)
class Optimum:
    count: int
    tp: dict[int, int]
    """Deployment index -> TP size, for the deployments the optimum admits."""
    loads: list[int]
    proven: bool


def undominated(needs: Mapping[int, int]) -> dict[int, int]:
    """Drop TP sizes that need no less per GPU than a smaller one: never better to use."""
    out: dict[int, int] = {}
    for tp in sorted(needs):
        if all(needs[tp] < b for b in out.values()):
            out[tp] = needs[tp]
    return out


def optimum(needs: Sequence[Mapping[int, int]], gpus: int, usable: int) -> Optimum:
    """The most deployments that fit together (``needs[d]``: TP size -> bytes per GPU)."""
    from scipy.optimize import (  # type: ignore[import-untyped,import-not-found,unused-ignore]
        Bounds,
        LinearConstraint,
        milp,
    )

    needs = [undominated(n) for n in needs]
    pairs = [(d, tp) for d, n in enumerate(needs) for tp in sorted(n)]
    if not pairs:
        return Optimum(0, {}, [0] * gpus, True)
    y_count = len(pairs)
    width = y_count * (1 + gpus)

    def z(p: int, g: int) -> int:
        return y_count + p * gpus + g

    rows: list[np.ndarray] = []
    lower: list[float] = []
    upper: list[float] = []

    def row(coefficients: Mapping[int, float], lo: float, hi: float) -> None:
        r = np.zeros(width)
        for i, c in coefficients.items():
            r[i] = c
        rows.append(r)
        lower.append(lo)
        upper.append(hi)

    scale = 1 / GIB
    cap = usable * scale
    for d in range(len(needs)):
        row({p: 1.0 for p, (e, _) in enumerate(pairs) if e == d}, 0.0, 1.0)
    for p, (_, tp) in enumerate(pairs):
        row({p: -float(tp)} | {z(p, g): 1.0 for g in range(gpus)}, 0.0, 0.0)
    load = [{z(p, g): needs[d][tp] * scale for p, (d, tp) in enumerate(pairs)} for g in range(gpus)]
    for g in range(gpus):
        row(load[g], 0.0, cap)
    objective = np.zeros(width)
    objective[:y_count] = -1.0
    result = milp(
        objective,
        constraints=LinearConstraint(np.array(rows), lower, upper),
        integrality=np.ones(width),
        bounds=Bounds(0, 1),
        options={"time_limit": 30.0},
    )
    if result.x is None:
        raise RuntimeError(f"milp found no solution: {result.message}")
    x = np.round(result.x).astype(int)
    chosen = {pairs[p][0]: pairs[p][1] for p in range(y_count) if x[p]}
    loads = [
        sum(needs[d][tp] for p, (d, tp) in enumerate(pairs) if x[z(p, g)]) for g in range(gpus)
    ]
    return Optimum(len(chosen), chosen, loads, result.status == 0)


def booking_rule(needs: Sequence[Mapping[int, int]], gpus: int, total: int) -> list[bool]:
    """Each rank books BOOKED_FRACTION x total; a GPU's bookings may not pass 1.0."""
    booked = [0.0] * gpus
    admitted = []
    for n in needs:
        fitting = [tp for tp in sorted(n) if n[tp] <= BOOKED_FRACTION * total]
        room = [g for g in range(gpus) if booked[g] + BOOKED_FRACTION <= 1.0]
        if not fitting or len(room) < fitting[0]:
            admitted.append(False)
            continue
        for g in room[: fitting[0]]:
            booked[g] += BOOKED_FRACTION
        admitted.append(True)
    return admitted


def empty_node() -> Node:
    snapshot = parse_declared_node(NODE)
    line = decide(
        PlacementRequest(resolve_model(SMALL_MODELS[0]), ServeOptions(max_model_len=4096)),
        snapshot,
        policy=SHARED,
    ).gpus[0]
    return Node(snapshot, line.usable_bytes, line.total_bytes)


@dataclass(frozen=True, slots=True)
class MixResult:
    mix: list[Deployment]
    run: Run
    best: Optimum
    rule: list[bool]
    repackable: int
    """Gatekeeper's rejections that a repacking of what it had admitted would have taken."""

    @property
    def admitted(self) -> int:
        return sum(self.run.admitted)


def score_mix(models: Models, node: Node, needs: Needs, mix: list[Deployment]) -> MixResult:
    gpus = len(node.snapshot.gpus)
    table = [needs.of(d) for d in mix]
    run = gatekeeper_run(models, node, needs, mix)
    best = optimum(table, gpus, node.usable)
    repackable = 0
    if best.count > sum(run.admitted):
        for i, ok in enumerate(run.admitted):
            if ok:
                continue
            kept = [table[j] for j in range(i) if run.admitted[j]] + [table[i]]
            repackable += optimum(kept, gpus, node.usable).count == len(kept)
    return MixResult(mix, run, best, booking_rule(table, gpus, node.total), repackable)


def packing(models: Models, mixes: int, seed: int, examples: int) -> None:
    node = empty_node()
    needs = Needs(models, node)
    start = time.perf_counter()
    results = [score_mix(models, node, needs, mix) for mix in random_mixes(mixes, seed)]
    elapsed = time.perf_counter() - start
    n = len(results)
    ratio = {
        "gatekeeper": [r.admitted / r.best.count if r.best.count else 1.0 for r in results],
        "rule": [sum(r.rule) / r.best.count if r.best.count else 1.0 for r in results],
    }
    counts = {
        "optimum": [r.best.count for r in results],
        "gatekeeper": [r.admitted for r in results],
        "rule": [sum(r.rule) for r in results],
    }
    short = [r for r in results if r.admitted < r.best.count]
    print(
        f"\nPacking: {n} random mixes (seed {seed}) of {MIX_SIZES[0]}..{MIX_SIZES[1]} "
        f"deployments on {NODE} ({len(node.snapshot.gpus)} x {node.usable / GIB:.2f} GiB "
        f"usable), {statistics.mean(len(r.mix) for r in results):.2f} offered per mix; "
        f"not all fit in {sum(r.best.count < len(r.mix) for r in results)} mixes "
        f"({elapsed:.1f} s)"
    )
    for method, values in counts.items():
        line = f"  {method:10s} admitted per mix {statistics.mean(values):6.2f}"
        if method in ratio:
            line += (
                f"   mean ratio to optimum {100 * statistics.mean(ratio[method]):6.2f}%"
                f"  (min {100 * min(ratio[method]):.1f}%)"
            )
        print(line + (f"  (each rank books {BOOKED_FRACTION} x total)" if method == "rule" else ""))
    hard = [r for r in results if r.best.count < len(r.mix)]
    if hard:
        print(
            f"  on the {len(hard)} mixes where not all fit: gatekeeper "
            f"{100 * statistics.mean(r.admitted / r.best.count for r in hard):.2f}% of the "
            f"optimum, rule {100 * statistics.mean(sum(r.rule) / r.best.count for r in hard):.2f}%"
        )
    rejected = sum(len(r.mix) - r.admitted for r in results)
    print(
        f"  gatekeeper below the optimum in {len(short)} mixes "
        f"({sum(r.best.count - r.admitted for r in short)} deployments); of its "
        f"{rejected} rejections, {sum(r.repackable for r in results)} would have fitted "
        "had the workers admitted before it been placed differently"
    )
    report_problems(results, node)
    for r in sorted(short, key=lambda r: r.admitted - r.best.count)[:examples]:
        describe(r, needs, node)


def report_problems(results: Sequence[MixResult], node: Node) -> None:
    for i, r in enumerate(results):
        problems = list(r.run.oddities)
        if r.admitted > r.best.count:
            problems.append(f"gatekeeper admitted {r.admitted} > optimum {r.best.count}")
        if any(load > node.usable for load in r.run.loads.values()):
            problems.append("gatekeeper promised more than a GPU's usable bytes")
        if any(load > node.usable for load in r.best.loads):
            problems.append("the optimum's solution overfills a GPU (solver tolerance)")
        if not r.best.proven:
            problems.append("milp hit its time limit: the optimum is a lower bound")
        for p in problems:
            print(f"  ODDITY mix {i}: {p}")


def describe(r: MixResult, needs: Needs, node: Node) -> None:
    print(f"  example: gatekeeper {r.admitted}, optimum {r.best.count}, rule {sum(r.rule)}")
    for i, (d, decision) in enumerate(zip(r.mix, r.run.decisions, strict=True)):
        sizes = " ".join(f"TP{tp}={b / GIB:.1f}" for tp, b in sorted(needs.of(d).items()))
        p = decision.placement
        where = f"GPUs {','.join(map(str, p.gpu_indices))}" if p is not None else "rejected"
        opt = f"TP{r.best.tp[i]}" if i in r.best.tp else "left out"
        print(f"    {i:2d} {d.label:26s} {sizes:44s} gatekeeper {where:16s} optimum {opt}")
    left = [(node.usable - r.run.loads.get(g.uuid, 0)) / GIB for g in node.snapshot.gpus]
    print(f"    gatekeeper's room left per GPU (GiB): {', '.join(f'{x:.1f}' for x in left)}")


# --- sharing, both ways, through the installed CLI ------------------------------------------

FLEETS: dict[str, tuple[str, list[tuple[str, dict[str, object]]]]] = {
    "first-day": (
        "1xH200",
        [
            ("Qwen/Qwen3-0.6B", {"max_model_len": 8192}),
            ("Qwen/Qwen2.5-7B-Instruct-AWQ", {"max_model_len": 16384}),
        ],
    ),
    "team-node": (
        "8xH100-80GB",
        [
            ("meta-llama/Llama-3.3-70B-Instruct", {"max_model_len": 8192, "kv_cache_dtype": "fp8"}),
            ("Qwen/Qwen2.5-32B-Instruct", {"max_model_len": 32768}),
            ("meta-llama/Llama-3.1-8B-Instruct", {"max_model_len": 16384}),
            ("meta-llama/Llama-3.1-8B-Instruct", {"max_model_len": 8192}),
            ("Qwen/Qwen2.5-7B-Instruct-AWQ", {"max_model_len": 16384}),
            ("Qwen/Qwen2.5-14B-Instruct", {"max_model_len": 16384}),
            ("meta-llama/Llama-3.2-1B-Instruct", {"max_model_len": 8192}),
            ("Qwen/Qwen3-0.6B", {"max_model_len": 8192}),
            ("Qwen/Qwen3-8B", {"max_model_len": 32768}),
            ("mistralai/Mistral-7B-Instruct-v0.3", {"max_model_len": 16384}),
        ],
    ),
    "small-gpus": (
        "4xL4",
        [
            ("Qwen/Qwen3-0.6B", {"max_model_len": 8192}),
            ("meta-llama/Llama-3.2-1B-Instruct", {"max_model_len": 8192}),
            ("Qwen/Qwen2.5-7B-Instruct-AWQ", {"max_model_len": 8192}),
            ("meta-llama/Llama-3.1-8B-Instruct", {"max_model_len": 8192, "kv_cache_dtype": "fp8"}),
            ("google/gemma-3-4b-it", {"max_model_len": 8192}),
        ],
    ),
}
"""Catalog fleets for the sharing figures: node, then (model, vllm serve flags) in the
order they are deployed."""


@dataclass(frozen=True, slots=True)
class PlanFigures:
    """One ``gatekeeper plan --json`` run: what it placed and with what KV cache."""

    admitted: int
    deployments: int
    gpus_used: int
    kv_sequences: list[int]
    """Sequences of max_model_len each admitted worker's KV cache holds."""
    share_hints: int
    """Refusals that name share_gpus."""
    kv_bytes: int
    """The KV cache of every admitted worker (per GPU x its GPUs), summed."""


def plan_file(node: str, entries: Sequence[tuple[str, Mapping[str, object]]], path: Path) -> None:
    lines = [f'node = "{node}"']
    for model, flags in entries:
        lines += ["[[deployments]]", f'model = "{model}"']
        lines += [f"{k} = {v!r}".replace("'", '"') for k, v in flags.items()]
    path.write_text("\n".join(lines) + "\n")


def run_plan_cli(path: Path, share: bool) -> PlanFigures:
    """``gatekeeper plan FILE --json`` with ``share_gpus`` on or off (the installed CLI)."""
    import json
    import os
    import shutil
    import subprocess

    cli = shutil.which("gatekeeper", path=str(Path(sys.executable).parent)) or "gatekeeper"
    env = {**os.environ, "GATEKEEPER_SHARE_GPUS": "true" if share else "false"}
    out = subprocess.run(
        [cli, "plan", str(path), "--json"], capture_output=True, text=True, env=env, check=False
    )
    if out.returncode not in (0, 1):
        raise RuntimeError(f"gatekeeper plan failed ({out.returncode}): {out.stderr[-2000:]}")
    result = json.loads(out.stdout)
    placed = [d["placement"] for d in result["deployments"] if d["admitted"]]
    hints = [
        d for d in result["deployments"] if any(s["kind"] == "share_gpus" for s in d["suggestions"])
    ]
    return PlanFigures(
        admitted=len(placed),
        deployments=len(result["deployments"]),
        gpus_used=len({i for p in placed for i in p["gpu_indices"]}),
        kv_sequences=[p["kv_sequences"] for p in placed],
        share_hints=len(hints),
        kv_bytes=sum(p["predicted"]["kv_cache_bytes"] * len(p["gpu_indices"]) for p in placed),
    )


def _fleet_line(name: str, node: str, f: PlanFigures) -> str:
    seqs = sorted(f.kv_sequences)
    median = seqs[len(seqs) // 2] if seqs else 0
    return (
        f"  {name:<26} {node:<12} placed {f.admitted:>2}/{f.deployments:<2} GPUs used "
        f"{f.gpus_used:>2}  KV {f.kv_bytes / GIB:7.1f} GiB, sequences per worker min "
        f"{min(seqs, default=0):>3} median {median:>4}  refusals naming share_gpus {f.share_hints}"
    )


def sharing(mixes: int, seed: int) -> None:
    """The catalog fleets and ``mixes`` random mixes planned with share_gpus off and on."""
    import tempfile

    print("\n== sharing: gatekeeper plan --json with share_gpus off / on ==")
    fleets = [(name, node, list(entries)) for name, (node, entries) in FLEETS.items()]
    for i, mix in enumerate(random_mixes(mixes, seed)):
        entries: list[tuple[str, dict[str, object]]] = [
            (d.model, {"max_model_len": d.max_model_len}) for d in mix
        ]
        fleets.append((f"random mix {i}", NODE, entries))
    totals = {False: [0, 0, 0, 0, 0], True: [0, 0, 0, 0, 0]}
    with tempfile.TemporaryDirectory() as tmp:
        for name, node, entries in fleets:
            path = Path(tmp) / "plan.toml"
            plan_file(node, entries, path)
            for share in (False, True):
                f = run_plan_cli(path, share)
                totals[share][0] += f.admitted
                totals[share][1] += f.deployments
                totals[share][2] += f.gpus_used
                totals[share][3] += f.kv_bytes
                totals[share][4] += f.share_hints
                if not name.startswith("random") or mixes <= 3:
                    print(_fleet_line(f"{name} ({'on' if share else 'off'})", node, f))
    for share, (admitted, asked, used, kv, hints) in totals.items():
        print(
            f"  all {len(fleets)} fleets, share_gpus {'on ' if share else 'off'}: placed "
            f"{admitted}/{asked} deployments on {used} GPUs, KV cache {kv / GIB:.0f} GiB in all; "
            f"{asked - admitted} refused, {hints} of them naming share_gpus"
        )


REHEARSED = FLEETS["first-day"]
"""The fleet the rehearsal deploys on a live sidecar."""


def rehearsal_sharing() -> None:
    """The first-day fleet deployed on ``gatekeeper serve --rehearsal`` (the simulator as
    the worker, a declared node), share_gpus off and on: which deployments run, how long
    each takes to be ready, and the KV cache the simulated worker reports."""
    import json
    import os
    import shutil
    import signal
    import socket
    import subprocess
    import tempfile
    import urllib.request

    cli = shutil.which("gatekeeper", path=str(Path(sys.executable).parent)) or "gatekeeper"
    node, entries = REHEARSED
    print(f"\n== sharing on a rehearsal sidecar ({node}, the simulator as vLLM) ==")
    for share in (False, True):
        with tempfile.TemporaryDirectory() as tmp, socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
            probe.close()
            env = {**os.environ, "GATEKEEPER_STATE_DIR": tmp, "GATEKEEPER_GPUS": node,
                   "GATEKEEPER_SHARE_GPUS": str(share).lower(),
                   "GATEKEEPER_WORKER_ENV": '{"GATEKEEPER_SIM_STARTUP_SECONDS": "0.3"}'}  # fmt: skip
            serve = subprocess.Popen(
                [cli, "serve", "--rehearsal", "--port", str(port)], env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            url = f"http://127.0.0.1:{port}"
            try:
                for _ in range(200):
                    try:
                        urllib.request.urlopen(f"{url}/healthz", timeout=1).close()
                        break
                    except OSError:
                        time.sleep(0.1)
                token = (Path(tmp) / "rehearsal" / "admin-token").read_text().strip()
                auth = ["--url", url, "--token", token]
                for model, flags in entries:
                    length = str(flags["max_model_len"])
                    started = time.perf_counter()
                    out = subprocess.run(
                        [cli, "deploy", model, "--max-model-len", length, "--wait", "--json", *auth],
                        capture_output=True, text=True, env=env, check=False,
                    )  # fmt: skip
                    took = time.perf_counter() - started
                    if out.returncode != 0:
                        said = json.loads(out.stdout).get("error", {}).get("message", "")
                        named = "names" if "share_gpus = true" in said else "does not name"
                        print(
                            f"  share_gpus {'on ' if share else 'off'}  {model:<32} refused; it {named} share_gpus"
                        )
                        continue
                    dep = json.loads(out.stdout)["deployment"]
                    kv = (dep.get("actual") or {}).get("kv_cache_bytes", 0)
                    print(
                        f"  share_gpus {'on ' if share else 'off'}  {model:<32} ready in {took:5.1f} s, "
                        f"KV cache {kv / GIB:6.2f} GiB (simulated)"
                    )
            finally:
                os.killpg(serve.pid, signal.SIGINT)
                serve.wait(timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mixes", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--runs", type=int, default=500, help="decisions timed per case")
    parser.add_argument("--examples", type=int, default=3, help="shortfalls to print")
    parser.add_argument(
        "--sharing",
        action="store_true",
        help="only the sharing figures: catalog fleets and --mixes random mixes through "
        "`gatekeeper plan --json`, share_gpus off and on",
    )
    args = parser.parse_args()
    if args.sharing:
        sharing(args.mixes, args.seed)
        rehearsal_sharing()
        return 0
    try:
        import scipy.optimize  # type: ignore[import-untyped,import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        print("placement bench: needs scipy (pip install scipy)", file=sys.stderr)
        return 1
    started = time.perf_counter()
    models = Models()
    latency(models, args.runs, args.seed)
    packing(models, args.mixes, args.seed, args.examples)
    sharing(min(args.mixes, 20), args.seed)
    print(f"\nbench/placement.py ran in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
