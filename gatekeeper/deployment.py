"""A deployment's data: its live state, what survives a restart, and the plain views
the metrics and the simulator need. The ``DeploymentManager`` (``deployments.py``) owns
the lifecycle."""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gatekeeper.errors import GatekeeperError
from gatekeeper.launcher import WorkerProcess
from gatekeeper.placement import Decision, PlacementPolicy, PlacementRequest
from gatekeeper.vllm_log import MemoryFigures
from gatekeeper.worker_metrics import WorkerView, actual_components, predicted_components

__all__ = [
    "Deployment",
    "DeploymentError",
    "DeploymentRecord",
    "ManagerConfig",
    "State",
    "free_port",
    "resolve_request",
    "simulated_env",
    "slug",
    "worker_view",
]

State = Literal["admitted", "launching", "loading", "ready", "failed", "stopping", "stopped"]


class DeploymentError(GatekeeperError):
    """A deployment request cannot be carried out (conflict, unknown id, not allowed)."""

    def __init__(
        self, message: str, *, status: int, field: str | None = None, value: object = None
    ) -> None:
        super().__init__(message, field=field, value=value)
        self.status = status


@dataclass(frozen=True, slots=True)
class DeploymentRecord:
    """What survives a sidecar restart (``state_dir/deployments/ID.json``)."""

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


@dataclass(slots=True)
class Deployment:
    """A deployment's live state (mutated only on the manager's event loop)."""

    id: str
    name: str
    request: PlacementRequest
    decision_json: dict[str, Any]
    """The admission decision as recorded (with the prediction)."""
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    args: tuple[str, ...]
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

    @property
    def model(self) -> str:
        return self.request.model.name

    @property
    def predicted(self) -> dict[str, Any]:
        placement = self.decision_json.get("placement") or {}
        return dict(placement.get("predicted") or {})

    @property
    def promise_bytes(self) -> tuple[int, ...]:
        """Bytes the admission promised on each GPU, in ``gpu_indices`` order."""
        placement = self.decision_json.get("placement") or {}
        return tuple(int(b) for b in placement.get("promise_bytes") or ())

    def use_decision(self, decision: Decision) -> None:
        p = decision.placement
        assert p is not None
        self.decision_json = decision.to_json()
        self.gpu_indices, self.gpu_uuids, self.args = p.gpu_indices, p.gpu_uuids, p.args

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
            "predicted": self.predicted,
            "actual": self.actual.components()
            | (
                {"kv_cache_tokens": self.actual.kv_cache_tokens}
                if self.actual.kv_cache_tokens
                else {}
            ),
            "log_path": str(w.spec.log_path) if w is not None else None,
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
    """Workers are the simulator: tell it the predicted figures to report."""


_SIMULATED = {
    "weights_bytes": "GATEKEEPER_SIM_WEIGHTS_BYTES",
    "kv_cache_bytes": "GATEKEEPER_SIM_KV_BYTES",
    "activation_peak_bytes": "GATEKEEPER_SIM_ACTIVATION_BYTES",
    "non_torch_bytes": "GATEKEEPER_SIM_NON_TORCH_BYTES",
    "cuda_graph_bytes": "GATEKEEPER_SIM_CUDA_GRAPH_BYTES",
}


def simulated_env(d: Deployment) -> dict[str, str]:
    """A rehearsal's simulator reports the prediction as its memory (the operator's own
    ``worker_env`` still overrides it, to rehearse a wrong prediction)."""
    predicted = d.predicted
    env = {var: str(int(predicted[key])) for key, var in _SIMULATED.items() if predicted.get(key)}
    if d.promise_bytes:
        env["GATEKEEPER_SIM_ACTUAL_BYTES"] = str(d.promise_bytes[0])
    return env


def worker_view(d: Deployment) -> WorkerView:
    """What the metrics need of a deployment."""
    placement = d.decision_json.get("placement") or {}
    return WorkerView(
        worker=d.id,
        model=d.name,
        state=d.state,
        gpu_indices=tuple(d.gpu_indices),
        predicted=predicted_components(placement.get("predicted") or {}),
        predicted_total_bytes=d.promise_bytes,
        actual=actual_components(d.actual.components()),
        pid=d.worker.pid if d.worker is not None else None,
        restarts=d.restarts,
        family=d.request.model.model_type,
        applied_factors=dict(d.request.corrections),
    )


def resolve_request(base: PlacementRequest, recorded: dict[str, Any]) -> PlacementRequest:
    """A recorded request (options as a dict) rebuilt on a freshly resolved model."""
    from gatekeeper.serve_options import ServeOptions

    return PlacementRequest(
        model=base.model,
        options=ServeOptions(**recorded["options"]),
        auto_parallel=bool(recorded.get("auto_parallel", True)),
        min_kv_tokens=recorded.get("min_kv_tokens"),
        min_sequences=int(recorded.get("min_sequences", 1)),
    )


def slug(name: str) -> str:
    cleaned = "".join(c if c.isalnum() else "-" for c in name.lower().split("/")[-1])
    return cleaned.strip("-")[:40] or "model"
