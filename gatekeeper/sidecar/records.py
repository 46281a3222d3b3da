"""A deployment's record: what survives a sidecar restart, written, read, and turned
back into a live ``Deployment``, in one place.

Each launched deployment is recorded in ``state_dir/deployments/ID.json``, a JSON
object of four parts:

- ``record``: ``DeploymentRecord``'s fields (the worker's arguments, address, GPUs, pid
  and the pid's start time);
- ``request``: what admission was asked (the options as ``options_record`` writes them,
  ``min_sequences``, ``min_kv_tokens``, ``auto_parallel``, and the vLLM release the
  worker was admitted for), read back by ``resolve_request``;
- ``decision``: the admission decision's JSON (``recorded_admission`` reads its
  prediction and promise);
- ``body``: the deploy body the admin API took (``DeployBody``'s fields, whatever
  they are), shown again in the summary of the adopted deployment. Files written
  before it was recorded have none (read as ``{}``);
- ``idle``: the deployment's idle policy (``idle_action``, ``sleep_level``), so that an
  adopting sidecar puts it to sleep (or finds it asleep) as its first one did; absent
  or unreadable: ``stop``.

``write_record`` writes one from a launched deployment (atomically: a temporary file,
then a rename); ``read_record`` reads one; ``recorded_deployment`` makes the live
``Deployment`` an adopting sidecar resumes; ``launch_spec`` the worker's ``LaunchSpec``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gatekeeper.estimator.options import ServeOptions
from gatekeeper.placement.types import PlacementRequest, Prediction
from gatekeeper.sidecar.deployment import Deployment
from gatekeeper.sidecar.launcher import LaunchSpec
from gatekeeper.vllm.flags import options_from_mapping, options_record
from gatekeeper.vllm.sleep_mode import IdlePolicy, sleep_level_problem

__all__ = [
    "DeploymentRecord",
    "RecordFile",
    "launch_spec",
    "read_record",
    "record_path",
    "recorded_admission",
    "recorded_deployment",
    "remove_record",
    "resolve_request",
    "write_record",
]


@dataclass(frozen=True, slots=True)
class DeploymentRecord:
    """The worker's part of a record (``record`` in the file)."""

    id: str
    name: str
    model: str
    args: list[str]
    host: str
    port: int
    gpu_indices: list[int]
    gpu_uuids: list[str]
    pid: int | None
    log_path: str
    work_dir: str
    created_at: float
    pid_start_ticks: int | None = None
    """The worker's start time (``/proc/PID/stat`` field 22, clock ticks since boot), so
    that an adopting sidecar tells the worker from a later process given the same pid.
    Absent from records written before it was recorded: such a pid is unverifiable."""


@dataclass(frozen=True, slots=True)
class RecordFile:
    """One record file, read."""

    record: DeploymentRecord
    request: dict[str, Any]
    """What admission was asked (``resolve_request`` reads it)."""
    decision: dict[str, Any] | None
    """The admission decision's JSON; None when the file holds none that is an object."""
    body: dict[str, Any]
    """The deploy body; ``{}`` in files written before it was recorded."""
    idle: IdlePolicy = dataclasses.field(default_factory=IdlePolicy)
    """The idle policy; ``stop`` in files written before it was recorded."""


def record_path(records_dir: Path, deployment_id: str) -> Path:
    """Where a deployment's record is (``state_dir/deployments/ID.json``)."""
    return records_dir / f"{deployment_id}.json"


def write_record(records_dir: Path, d: Deployment, default_vllm_version: str) -> None:
    """Record a launched deployment (its worker started); ``default_vllm_version`` is
    the release the sidecar admits for when the options name none."""
    assert d.worker is not None
    spec = d.worker.spec
    record = DeploymentRecord(
        id=d.id,
        name=d.name,
        model=d.model,
        args=list(spec.args),
        host=spec.host,
        port=spec.port,
        gpu_indices=list(d.gpu_indices),
        gpu_uuids=list(d.gpu_uuids),
        pid=d.worker.pid,
        log_path=str(spec.log_path),
        work_dir=str(spec.work_dir),
        created_at=d.created_at,
        pid_start_ticks=d.pid_start_ticks,
    )
    request = {
        "options": options_record(d.request.options),
        "min_sequences": d.request.min_sequences,
        "min_kv_tokens": d.request.min_kv_tokens,
        "auto_parallel": d.request.auto_parallel,
        # the release the worker was admitted for: a restarted sidecar reads with it
        "vllm_version": d.request.options.vllm_version or default_vllm_version,
    }
    payload = {
        "record": asdict(record),
        "request": request,
        "decision": d.decision_record(),
        "body": dict(d.body),
        "idle": d.idle.to_json(),
    }
    path = record_path(records_dir, d.id)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


def remove_record(records_dir: Path, deployment_id: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        record_path(records_dir, deployment_id).unlink()


def read_record(path: Path) -> RecordFile:
    """A record file, read; raises ``OSError``, ``ValueError`` (not JSON), ``KeyError``
    or ``TypeError`` (not a record) for one that cannot be used."""
    data = json.loads(path.read_text())
    decision = data.get("decision")
    body = data.get("body")
    request = data["request"]
    if not isinstance(request, dict):
        raise TypeError(f"{path}: 'request' is {type(request).__name__}, not an object")
    return RecordFile(
        record=DeploymentRecord(**data["record"]),
        request=request,
        decision=decision if isinstance(decision, dict) else None,
        body=body if isinstance(body, dict) else {},
        idle=_idle(data.get("idle")),
    )


def _idle(data: object) -> IdlePolicy:
    """The recorded idle policy; ``stop`` when absent or not one gatekeeper writes."""
    if not isinstance(data, dict):
        return IdlePolicy()
    action, level = data.get("idle_action"), data.get("sleep_level", 1)
    if action != "sleep" or sleep_level_problem(level) is not None:
        return IdlePolicy()
    return IdlePolicy("sleep", level)


def recorded_deployment(
    found: RecordFile, request: PlacementRequest, *, ready_at: float | None
) -> Deployment:
    """The live deployment of a recorded worker an adopting sidecar resumes (its worker
    process is attached by the caller). Its decision is the record's JSON: this sidecar
    did not make it."""
    r = found.record
    prediction, promise = recorded_admission(found.decision)
    return Deployment(
        id=r.id,
        name=r.name,
        request=request,
        decision=None,
        prediction=prediction,
        promise_bytes=promise,
        recorded_decision=found.decision,
        gpu_indices=tuple(r.gpu_indices),
        gpu_uuids=tuple(r.gpu_uuids),
        args=tuple(r.args),
        port=r.port,
        created_at=r.created_at,
        ready_at=ready_at,
        pid_start_ticks=r.pid_start_ticks,
        body=found.body,
        idle=found.idle,
    )


def launch_spec(
    record: DeploymentRecord, command: tuple[str, ...], env: dict[str, str]
) -> LaunchSpec:
    """The recorded worker's launch, as the sidecar that started it had it."""
    return LaunchSpec(
        worker_id=record.id,
        command=command,
        args=tuple(record.args),
        host=record.host,
        port=record.port,
        gpu_indices=tuple(record.gpu_indices),
        log_path=Path(record.log_path),
        work_dir=Path(record.work_dir),
        env=env,
    )


def recorded_admission(decision: object) -> tuple[Prediction | None, tuple[int, ...]]:
    """The prediction and the promise a deployment record's decision holds; what is
    missing or malformed reads as none (the worker is still adopted on its health)."""
    if not isinstance(decision, dict) or not isinstance(decision.get("placement"), dict):
        return None, ()
    placement = decision["placement"]
    predicted = placement.get("predicted")
    prediction = Prediction.from_json(predicted) if isinstance(predicted, dict) else None
    promise = placement.get("promise_bytes")
    valid = isinstance(promise, list) and all(
        isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in promise
    )
    return prediction, tuple(promise) if valid else ()


def resolve_request(
    base: PlacementRequest, recorded: dict[str, Any], release: str | None = None
) -> PlacementRequest:
    """A recorded request (options as a dict) rebuilt on a freshly resolved model.

    The options are read with the flags of the release the record names (the one its
    sidecar admitted the worker with), else ``release`` (this sidecar's configured one).
    Fields at ``ServeOptions``' defaults are left out first: a record lists every field,
    and a release that predates a flag must not refuse its default (``runner: auto``
    under vLLM 0.8.5)."""
    named = recorded.get("vllm_version")
    options = recorded["options"]
    given = (
        {k: v for k, v in options.items() if _DEFAULTS.get(k, _UNSET) != v}
        if isinstance(options, dict)
        else options
    )
    return PlacementRequest(
        model=base.model,
        options=options_from_mapping(
            given,
            where="deployment record",
            release=named if isinstance(named, str) else release,
        )[0],
        auto_parallel=bool(recorded.get("auto_parallel", True)),
        min_kv_tokens=recorded.get("min_kv_tokens"),
        min_sequences=int(recorded.get("min_sequences", 1)),
        draft=base.draft,
    )


_UNSET = object()
_DEFAULTS: dict[str, Any] = {
    f.name: list(f.default) if isinstance(f.default, tuple) else f.default
    for f in dataclasses.fields(ServeOptions)
    if f.default is not dataclasses.MISSING
}
"""``ServeOptions``' defaults as ``options_record`` writes them (tuples as lists)."""
