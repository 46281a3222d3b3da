"""Capacity plans: a file of deployments admitted in order on one node.

A plan file is TOML or YAML::

    node = "8xH100-80GB"            # optional: --node or settings otherwise
    vllm_version = "0.10.1"         # optional: the release every deployment runs
    [[deployments]]
    name = "chat"                   # optional
    model = "meta-llama/Llama-3.1-8B-Instruct"
    max_model_len = 16384           # a vllm serve flag gatekeeper models (dashes or underscores)
    kv_cache_dtype = "fp8"
    min_sequences = 8               # KV for 8 concurrent sequences of max_model_len
    min_kv_tokens = 200000          # or a token count

Each admitted deployment's promise is taken from the GPUs it lands on before the next
one is decided, as the reservations ledger does for live admissions.

A deployment's options are read with the flag table of its vLLM release: its own
``vllm_version``, else the plan's, else ``load_plan``'s ``release`` (the settings'
``default_vllm_version``), and it is estimated and launched as that release does
(``gatekeeper.placement.budget``).
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gatekeeper.errors import GatekeeperError
from gatekeeper.estimator.accounting import parse_vllm_version
from gatekeeper.estimator.options import ServeOptions, draft_reference
from gatekeeper.gpus.inventory import InventorySnapshot
from gatekeeper.models.spec import ModelSpec
from gatekeeper.placement.decision import decide
from gatekeeper.placement.gpu_search import EstimateCache, gpu_lines
from gatekeeper.placement.hints import share_suggestion
from gatekeeper.placement.policy import PlacementPolicy
from gatekeeper.placement.render import LEGEND, render_bar
from gatekeeper.placement.sizing import kv_text
from gatekeeper.placement.types import Decision, PlacementRequest, auto_parallel
from gatekeeper.units import format_gib
from gatekeeper.vllm.flags import options_from_mapping

__all__ = ["Plan", "PlanError", "PlanResult", "PlannedDeployment", "load_plan", "run_plan"]

_REQUEST_FIELDS = {"model", "name", "min_kv_tokens", "min_sequences"}


class PlanError(GatekeeperError):
    """A plan file cannot be read: which file, which entry, which key, and why."""


@dataclass(frozen=True, slots=True)
class PlannedDeployment:
    name: str
    model: str
    options: ServeOptions
    auto_parallel: bool
    min_kv_tokens: int | None
    min_sequences: int


@dataclass(frozen=True, slots=True)
class Plan:
    path: Path
    node: str | None
    deployments: tuple[PlannedDeployment, ...]
    vllm_version: str | None = None
    """The release the plan names for every deployment that names none."""


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as e:
        raise PlanError(f"plan: cannot read {path} ({e.strerror}); give a TOML or YAML file") from e
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, ValueError) as e:
        raise PlanError(
            f"plan: {path} is not valid {path.suffix.lstrip('.') or 'TOML'} ({e})"
        ) from e
    except Exception as e:  # yaml.YAMLError without importing yaml at module level
        raise PlanError(f"plan: {path} is not valid YAML ({e})") from e
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("deployments"), list)
        or not data["deployments"]
    ):
        raise PlanError(
            f"plan: {path} needs a non-empty 'deployments' list (see docs/placement.md)"
        )
    return data


def _deployment(
    path: Path, i: int, entry: object, plan_release: str | None, release: str | None
) -> PlannedDeployment:
    where = f"plan {path}: deployments[{i}]"
    if not isinstance(entry, Mapping) or not isinstance(entry.get("model"), str):
        raise PlanError(f"{where}: needs a 'model' (a catalog name, directory or hub repo id)")
    options = {k: v for k, v in entry.items() if k not in _REQUEST_FIELDS}
    if plan_release is not None and options.get("vllm_version") is None:
        options["vllm_version"] = plan_release
    try:
        serve, given = options_from_mapping(options, where=where, release=release)
    except GatekeeperError as e:
        raise PlanError(str(e)) from e
    sequences = entry.get("min_sequences", 1)
    tokens = entry.get("min_kv_tokens")
    for key, value in (("min_sequences", sequences), ("min_kv_tokens", tokens)):
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value <= 0
        ):
            raise PlanError(f"{where}: {key} = {value!r} must be a positive integer")
    return PlannedDeployment(
        name=str(entry.get("name") or f"{i}:{entry['model']}"),
        model=entry["model"],
        options=serve,
        auto_parallel=auto_parallel(given),
        min_kv_tokens=tokens,
        min_sequences=sequences,
    )


def _plan_release(path: Path, data: Mapping[str, Any]) -> str | None:
    """The plan's own ``vllm_version``, checked as a version."""
    named = data.get("vllm_version")
    if named is None:
        return None
    try:
        if not isinstance(named, str):
            raise ValueError
        parse_vllm_version(named)
    except (ValueError, GatekeeperError):
        raise PlanError(
            f"plan {path}: vllm_version = {named!r} is not a vLLM version; give one such as "
            '"0.10.1" or "0.33.0" (a string), or leave it out for the default release'
        ) from None
    return named


def load_plan(path: Path, release: str | None = None) -> Plan:
    """The plan at ``path``; options that name no release (nor does the plan) are read
    with ``release``'s flags (the settings' default; the newest table when None)."""
    data = _read(path)
    node = data.get("node")
    if node is not None and not isinstance(node, str):
        raise PlanError(f"plan {path}: 'node' must be a string such as 8xH100-80GB or a JSON path")
    if node and not Path(node).is_absolute() and (path.parent / node).is_file():
        node = str(path.parent / node)
    named = _plan_release(path, data)
    entries = data["deployments"]
    return Plan(
        path,
        node,
        tuple(_deployment(path, i, e, named, release) for i, e in enumerate(entries)),
        named,
    )


@dataclass(frozen=True, slots=True)
class PlanResult:
    names: tuple[str, ...]
    decisions: tuple[Decision, ...]
    final: InventorySnapshot
    planned: Mapping[str, int]
    policy: PlacementPolicy
    shared: tuple[Decision, ...] | None = None
    """With ``share_gpus`` off and a deployment refused: the plan's decisions with it on."""

    def sharing_line(self) -> str | None:
        """What the plan places with ``share_gpus`` on, beside what it places now."""
        if self.shared is None:
            return None
        now, on = _tally(self.decisions), _tally(self.shared)
        return (
            f"with share_gpus = true (GATEKEEPER_SHARE_GPUS=true) this plan places {on[0]} of "
            f"{len(self.decisions)} deployments on {on[1]} GPU(s); now {now[0]} on {now[1]}"
        )

    def render(self) -> str:
        out = []
        for name, d in zip(self.names, self.decisions, strict=True):
            if d.admitted and d.placement is not None:
                gpus = ",".join(str(i) for i in d.placement.gpu_indices)
                out.append(
                    f"ADMITTED {name} on GPU {gpus}: vllm serve {' '.join(d.placement.args)}"
                )
                p = d.placement
                out.append(
                    f"    {kv_text(p.estimate, p.kv_cache_bytes)}, promised "
                    f"{format_gib(max(p.promise_bytes))} per GPU"
                )
                out += [f"    warning: {w}" for w in d.warnings]
            else:
                headline = next((r for r in reversed(d.reasons) if " at TP=" in r), None)
                out.append(f"REJECTED {name}: {headline or (d.reasons[0] if d.reasons else '?')}")
                out += [f"    * {s.text}" for s in d.suggestions]
        sharing = self.sharing_line()
        if sharing:
            out.append(sharing)
        out.append("")
        out.append("headroom after the plan (r = planned workers):")
        for line in gpu_lines(self.final, self.planned, {}, self.policy):
            out.append(f"{render_bar(line)}  {format_gib(line.usable_bytes)} usable")
        out.append(LEGEND)
        return "\n".join(out)

    def to_json(self) -> dict[str, Any]:
        shared = None
        if self.shared is not None:
            placed, gpus = _tally(self.shared)
            shared = {"admitted": placed, "gpus_used": gpus, "text": self.sharing_line()}
        return {
            "with_share_gpus": shared,
            "deployments": [
                {"name": n, **d.to_json()} for n, d in zip(self.names, self.decisions, strict=True)
            ],
            "headroom": [
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "name": g.name,
                    "usable_bytes": g.usable_bytes,
                    "planned_bytes": g.reserved_bytes,
                    "total_bytes": g.total_bytes,
                }
                for g in gpu_lines(self.final, self.planned, {}, self.policy)
            ],
        }


def _tally(decisions: tuple[Decision, ...]) -> tuple[int, int]:
    """(deployments admitted, distinct GPUs they use)."""
    placed = [d.placement for d in decisions if d.placement is not None]
    return len(placed), len({i for p in placed for i in p.gpu_indices})


def run_plan(
    plan: Plan,
    snapshot: InventorySnapshot,
    policy: PlacementPolicy,
    resolve: Callable[[str], ModelSpec],
) -> PlanResult:
    """Admit the plan's deployments in order; ``resolve`` turns a reference into a spec.

    With ``share_gpus`` off and a deployment refused, the plan is run again with it on:
    each refusal that sharing would admit names ``share_gpus`` (``hints.share_suggestion``)
    and the result keeps what the plan places that way (``shared``)."""
    specs: dict[str, ModelSpec] = {}

    def spec(reference: str) -> ModelSpec:
        if reference not in specs:
            specs[reference] = resolve(reference)
        return specs[reference]

    cache = EstimateCache()
    decisions, planned = _admit(plan, snapshot, policy, spec, cache)
    shared: tuple[Decision, ...] | None = None
    if not policy.share_gpus and not all(d.admitted for d in decisions):
        sharing = dataclasses.replace(policy, share_gpus=True)
        on = _admit(plan, snapshot, sharing, spec, cache)[0]
        shared = tuple(on)
        decisions = [
            dataclasses.replace(
                d,
                suggestions=(
                    share_suggestion(s.placement, "as this plan places it"),
                    *d.suggestions,
                ),
            )
            if not d.admitted and s.placement is not None
            else d
            for d, s in zip(decisions, on, strict=True)
        ]
    names = tuple(d.name for d in plan.deployments)
    return PlanResult(names, tuple(decisions), snapshot, dict(planned), policy, shared)


def _admit(
    plan: Plan,
    snapshot: InventorySnapshot,
    policy: PlacementPolicy,
    spec: Callable[[str], ModelSpec],
    cache: EstimateCache,
) -> tuple[list[Decision], dict[str, int]]:
    """The decisions of the plan's deployments in order, each admission's promise taken
    from its GPUs before the next; and the bytes planned per GPU UUID."""
    planned: dict[str, int] = {}
    workers: dict[str, int] = {}
    decisions = []
    for dep in plan.deployments:
        draft = draft_reference(dep.options)
        request = PlacementRequest(
            spec(dep.model),
            dep.options,
            dep.auto_parallel,
            dep.min_kv_tokens,
            dep.min_sequences,
            draft=spec(draft) if draft else None,
        )
        d = decide(request, snapshot, reserved=planned, workers=workers, policy=policy, cache=cache)
        for uuid, num_bytes in d.promises():
            planned[uuid] = planned.get(uuid, 0) + num_bytes
            workers[uuid] = workers.get(uuid, 0) + 1
        decisions.append(d)
    return decisions, planned
