"""A deployment's data: its live state, what survives a restart, and the plain view the
metrics need. The ``DeploymentManager`` (``gatekeeper.sidecar.manager``) owns the
lifecycle."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gatekeeper.errors import GatekeeperError
from gatekeeper.gpus.attribution import tree_usage
from gatekeeper.gpus.inventory import InventorySnapshot
from gatekeeper.metrics.worker_states import State
from gatekeeper.metrics.workers import WorkerView, actual_components, predicted_components
from gatekeeper.placement.policy import PlacementPolicy
from gatekeeper.placement.types import Decision, PlacementRequest, Prediction
from gatekeeper.sidecar.launcher import WorkerProcess
from gatekeeper.sidecar.ledger import Promise, host_promises
from gatekeeper.vllm.log import MemoryFigures
from gatekeeper.vllm.sleep_mode import IdlePolicy, asleep_bytes, asleep_host_bytes

__all__ = [
    "Deployment",
    "DeploymentError",
    "ManagerConfig",
    "State",
    "check_name",
    "free_port",
    "process_start_ticks",
    "restored_promises",
    "slug",
    "worker_view",
]


class DeploymentError(GatekeeperError):
    """A deployment request cannot be carried out (conflict, unknown id, not allowed)."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        field: str | None = None,
        value: object = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, field=field, value=value)
        self.status = status
        self.retry_after = retry_after
        """Seconds after which a retry may succeed (``Retry-After``), when it may."""


@dataclass(slots=True)
class Deployment:
    """A deployment's live state (mutated only on the manager's event loop)."""

    id: str
    name: str
    request: PlacementRequest
    decision: Decision | None
    """This sidecar's admission of the worker; ``None`` for a worker adopted from an
    earlier sidecar, whose admission survives only in its record."""
    prediction: Prediction | None
    """The per-GPU bytes the admission sized the worker by (None when an adopted worker's
    record holds none)."""
    promise_bytes: tuple[int, ...]
    """Bytes the admission promised on each GPU, in ``gpu_indices`` order."""
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    args: tuple[str, ...]
    recorded_decision: dict[str, Any] | None = None
    """An adopted worker's decision as its record holds it (written back unchanged)."""
    state: State = "admitted"
    worker: WorkerProcess | None = None
    port: int = 0
    error: str | None = None
    restarts: int = 0
    created_at: float = field(default_factory=time.time)
    ready_at: float | None = None
    last_used: float = field(default_factory=time.time)
    actual: MemoryFigures = field(default_factory=MemoryFigures)
    ready_event: asyncio.Event = field(default_factory=asyncio.Event)
    supervisor: asyncio.Task[None] | None = None
    stopping: bool = False
    pid_start_ticks: int | None = None
    """The worker's start time, read at launch (see ``records.DeploymentRecord``)."""
    body: dict[str, Any] = field(default_factory=dict)
    """The deploy body the admin API took (``DeployBody``'s fields as JSON), recorded and
    shown in the summary as it is; ``{}`` for a preloaded or on-demand deployment."""
    idle: IdlePolicy = field(default_factory=IdlePolicy)
    """What the worker becomes when idle: stopped, or put to sleep (``sidecar.sleep``)."""

    def kept_asleep(self) -> tuple[int, ...]:
        """GPU bytes per GPU (``gpu_indices`` order) the worker keeps while asleep: its
        promise less the weights and KV cache vLLM's sleep mode releases."""
        p = self.prediction or Prediction()
        return tuple(asleep_bytes(b, p.weights_bytes, p.kv_cache_bytes) for b in self.promise_bytes)

    def gpu_bytes(self) -> int:
        """GPU bytes the worker holds now, as the ledger counts them (asleep: the residue)."""
        return sum(self.kept_asleep() if self.state == "sleeping" else self.promise_bytes)

    def host_asleep_bytes(self) -> int:
        """Host bytes its sleeping weights take (level 1), 0 awake or at level 2."""
        if self.state != "sleeping" or self.prediction is None:
            return 0
        weights = self.prediction.weights_bytes
        return asleep_host_bytes(self.idle.sleep_level, weights, len(self.gpu_indices))

    @property
    def model(self) -> str:
        return self.request.model.name

    @classmethod
    def admitted(
        cls,
        deployment_id: str,
        name: str,
        request: PlacementRequest,
        decision: Decision,
        body: dict[str, Any] | None = None,
    ) -> Deployment:
        """A new deployment from an admitting decision."""
        return cls(
            id=deployment_id, name=name, request=request, body=dict(body or {}), **_placed(decision)
        )

    def use_decision(self, decision: Decision) -> None:
        """Run with a new admission (a restart's)."""
        for name, value in _placed(decision).items():
            setattr(self, name, value)
        self.recorded_decision = None

    def decision_record(self) -> dict[str, Any]:
        """The admission decision for the deployment's record (its JSON form)."""
        if self.decision is not None:
            return self.decision.to_json()
        return dict(self.recorded_decision or {})

    def summary(self, in_flight: int = 0) -> dict[str, Any]:
        w = self.worker
        return {
            "id": self.id,
            "name": self.name,
            "model": self.model,
            "state": self.state,
            "phase": w.startup().phase if w is not None and self.state == "loading" else None,
            "error": self.error,
            "gpus": list(self.gpu_indices),
            "port": self.port,
            "pid": w.pid if w is not None else None,
            "restarts": self.restarts,
            "uptime_seconds": round(time.time() - self.ready_at, 1) if self.ready_at else None,
            "in_flight": in_flight,
            "last_used": self.last_used,
            "vllm_args": list(self.args),
            "predicted": self.prediction.to_json() if self.prediction else {},
            "actual": self.actual.components()
            | (
                {"kv_cache_tokens": self.actual.kv_cache_tokens}
                if self.actual.kv_cache_tokens
                else {}
            ),
            "log_path": str(w.spec.log_path) if w is not None else None,
            "warnings": list(self.decision_record().get("warnings") or []),
            "body": dict(self.body),
            **self.idle.to_json(),
            "gpu_bytes": self.gpu_bytes(),
            "host_asleep_bytes": self.host_asleep_bytes(),
        }


def _placed(decision: Decision) -> dict[str, Any]:
    """The fields of a ``Deployment`` an admitting decision sets (``admitted``, and
    ``use_decision`` on a restart)."""
    p = decision.placement
    assert p is not None
    return {
        "decision": decision,
        "prediction": p.prediction,
        "promise_bytes": p.promise_bytes,
        "gpu_indices": p.gpu_indices,
        "gpu_uuids": p.gpu_uuids,
        "args": p.args,
    }


def free_port(host: str, low: int, high: int, taken: set[int]) -> int:
    """The first port in [low, high] not used by a deployment and free to bind."""
    for port in range(low, high + 1):
        if port in taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        return port
    raise DeploymentError(
        f"worker ports: none free in {low}-{high}; widen GATEKEEPER_WORKER_PORT_MIN/MAX",
        status=503,
        field="worker_port_min",
    )


@dataclass(frozen=True, slots=True)
class ManagerConfig:
    """The plain values the manager needs from the settings."""

    state_dir: Path
    worker_command: tuple[str, ...]
    worker_env: dict[str, str]
    worker_host: str
    port_min: int
    port_max: int
    startup_timeout_seconds: float
    stop_grace_seconds: float
    drain_seconds: float
    restart_policy: Literal["never", "on-failure"]
    restart_limit: int
    restart_backoff_seconds: float
    policy: PlacementPolicy
    rehearsal: bool = False
    idle: IdlePolicy = field(default_factory=IdlePolicy)
    """The global idle policy (``idle_action``, ``sleep_level``)."""
    idle_seconds: float = 300.0
    wake_timeout_seconds: float = 120.0
    admission_timeout_seconds: float = 30.0
    health_interval_seconds: float = 10.0
    """Liveness: a ready worker's ``/health`` is probed this often ..."""
    health_timeout_seconds: float = 5.0
    """... each probe waiting this long ..."""
    health_failures: int = 3
    """... and this many failures in a row make it ``unhealthy``."""
    host_memory_root: Path = Path("/")
    """Where host memory is read (``gatekeeper.gpus.host_memory.ProcHostMemory``)."""
    host_margin_bytes: int = 1 << 30
    """Host bytes kept available beyond every worker's predicted host memory."""


def process_start_ticks(pid: int, proc: Path = Path("/proc")) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/PID/stat`` field
    22), or None when there is no such process. A pid and its start time name one
    process for the life of the machine, a pid alone only until it is reused."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
        # Field 2 (the command name) is in parentheses and may hold spaces or ')'.
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def worker_view(d: Deployment) -> WorkerView:
    """What the metrics need of a deployment."""
    return WorkerView(
        worker=d.id,
        model=d.name,
        state=d.state,
        gpu_indices=tuple(d.gpu_indices),
        predicted=predicted_components(d.prediction.to_json() if d.prediction else {}),
        predicted_total_bytes=d.promise_bytes,
        actual=actual_components(d.actual.components()),
        pid=d.worker.pid if d.worker is not None else None,
        restarts=d.restarts,
        family=d.request.model.model_type,
        applied_factors=dict(d.request.corrections),
    )


def restored_promises(
    d: Deployment, snapshot: InventorySnapshot, pids: frozenset[int]
) -> tuple[Promise, ...]:
    """The reservation of a running worker the ledger lost, rebuilt: the bytes its
    admission promised on each GPU (its record's decision), else what NVML shows its
    process tree (``pids``) holding there, else 1 byte (the row still counts the
    worker on its GPU, which is what keeps a second worker off it with sharing off),
    with the host bytes its decision promised (``placement.host_bytes``; 0 in a record
    from before host memory was counted)."""
    recorded = d.promise_bytes if len(d.promise_bytes) == len(d.gpu_uuids) else ()
    used = tree_usage(snapshot, pids)
    pairs = [
        (uuid, (recorded[i] if recorded else 0) or used.get(index, 0) or 1)
        for i, (uuid, index) in enumerate(zip(d.gpu_uuids, d.gpu_indices, strict=False))
    ]
    placed = d.decision_record().get("placement")
    host = placed.get("host_bytes") if isinstance(placed, dict) else None
    return host_promises(pairs, host if isinstance(host, int) and host > 0 else 0)


_NAME = re.compile(r"[A-Za-z0-9_./][A-Za-z0-9_./:@+-]{0,255}")
NAME_RULE = (
    "1 to 256 of the letters A-Z and a-z, digits and . _ / : @ + -, beginning with a "
    'letter, digit, "_", "." or "/" (e.g. "llama-8b", "Qwen/Qwen3-8B")'
)


def check_name(name: str) -> None:
    """Refuse a deployment name that could be read as something else: it is passed to the
    worker as ``--served-model-name NAME`` (``--x`` would be a flag), and goes into log
    lines and headers (a NUL, CR or LF would split them)."""
    if not _NAME.fullmatch(name):
        raise DeploymentError(
            f"name = {name!r} is not a deployment name: use {NAME_RULE}",
            status=400,
            field="name",
            value=name,
        )


def slug(name: str) -> str:
    cleaned = "".join(c if c.isalnum() else "-" for c in name.lower().split("/")[-1])
    return cleaned.strip("-")[:40] or "model"
