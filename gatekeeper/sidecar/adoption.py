"""Adoption: a sidecar that starts takes over the workers an earlier one left running.

For each record in ``state_dir/deployments`` (``gatekeeper.sidecar.records``),
``adopt_recorded`` decides:

- the recorded process group is alive and is the worker's (``recorded_worker_alive``:
  the pid with the recorded start time) and its ``/health`` answers: **serving**,
  adopted whatever its ledger rows say (they are made ready: its memory is in NVML's
  figure);
- alive, not answering yet, with a live reservation (or none at all: a lost ledger):
  **loading**, adopted and awaited by the manager;
- anything else: stopped if it is the worker's, its reservation released and its
  record removed.

``stop_unrecorded_workers`` stops the workers an earlier sidecar spawned but never
recorded (killed between spawn and record), found by the marker in their environment.
``adopt_all`` does both at start-up and releases the reservations nobody adopted; the
``DeploymentManager`` registers and supervises what is adopted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from gatekeeper.errors import GatekeeperError
from gatekeeper.gpus.inventory import InventorySnapshot
from gatekeeper.placement.types import PlacementRequest
from gatekeeper.sidecar.deployment import Deployment, ManagerConfig, process_start_ticks
from gatekeeper.sidecar.launcher import (
    LaunchSpec,
    WorkerProcess,
    marked_workers,
    process_group_alive,
)
from gatekeeper.sidecar.ledger import Ledger
from gatekeeper.sidecar.records import (
    DeploymentRecord,
    launch_spec,
    read_record,
    recorded_deployment,
    resolve_request,
)

__all__ = ["adopt_all", "adopt_recorded", "recorded_worker_alive", "stop_unrecorded_workers"]

logger = logging.getLogger(__name__)

Health = Callable[[str, int], Awaitable[bool]]
"""``health(host, port)``: whether a worker's ``/health`` answers 200."""


async def adopt_all(
    records_dir: Path,
    resolve: Callable[[str], PlacementRequest],
    *,
    ledger: Ledger,
    config: ManagerConfig,
    health: Health,
    snapshot: Callable[[], Awaitable[InventorySnapshot]],
    resume: Callable[[Deployment, bool], None],
    restore: Callable[[Deployment, InventorySnapshot], Awaitable[int]],
) -> list[str]:
    """Adopt every recorded worker ``adopt_recorded`` takes, handing each to ``resume``
    (with whether it serves) and writing back its rows if the ledger has none
    (``restore``); then stop the unrecorded workers and release the reservations of
    the deployments not adopted. Returns the adopted ids."""
    live = {r.deployment_id for r in await asyncio.to_thread(ledger.live)}
    adopted: list[str] = []
    reading = await snapshot()
    for path in sorted(records_dir.glob("*.json")):
        found = await adopt_recorded(
            path, live, resolve, ledger=ledger, config=config, health=health
        )
        if found is None:
            continue
        d, healthy = found
        resume(d, healthy)
        adopted.append(d.id)
        # A ledger moved aside or lost holds no row of it: written back from its
        # record (and NVML) before any admission is answered (#27 item 4).
        if await restore(d, reading):
            logger.warning("deployment %s: its reservation was written back", d.id)
    await stop_unrecorded_workers(config, set(adopted))
    # A reservation whose deployment was not adopted has no worker behind it (the
    # sidecar died between admission and launch, or its record was unreadable): it
    # would block its GPU until it expired. One sidecar owns a state directory.
    for deployment_id in sorted(live - set(adopted)):
        await asyncio.to_thread(ledger.release, deployment_id)
    return adopted


async def adopt_recorded(
    path: Path,
    live: set[str],
    resolve: Callable[[str], PlacementRequest],
    *,
    ledger: Ledger,
    config: ManagerConfig,
    health: Health,
) -> tuple[Deployment, bool] | None:
    """The deployment of the record at ``path`` with its worker attached, and whether
    it serves (else it is loading); None when it was not adopted (stopped, released,
    its record removed). ``live``: the deployment ids with live ledger rows."""
    try:
        found = read_record(path)
        request = resolve_request(
            resolve(found.record.model),
            found.request,
            release=config.policy.default_vllm_version,
        )
    except (OSError, ValueError, KeyError, TypeError, GatekeeperError):
        path.unlink(missing_ok=True)
        return None
    record = found.record
    spec = launch_spec(record, config.worker_command, config.worker_env)
    ours = recorded_worker_alive(record) and record.pid is not None
    healthy = ours and await health(record.host, record.port)
    # Serving: adopted whatever its row says (a row left pending by a sidecar killed
    # while the worker loaded may have expired by now; the worker's memory is in
    # NVML's figure). Still loading with a live row: adopted and awaited.
    known = ours and bool(await asyncio.to_thread(ledger.by_deployment, record.id))
    loading = ours and not healthy and (record.id in live or not known)
    if not (healthy or loading):
        await _let_go(path, spec, record.pid if ours else None, ledger, config)
        return None
    assert record.pid is not None
    if healthy:
        await asyncio.to_thread(ledger.adopt_ready, record.id)
    d = recorded_deployment(found, request, ready_at=time.time() if healthy else None)
    d.worker = WorkerProcess.adopt(spec, record.pid)
    d.actual = d.worker.startup().memory
    return d, healthy


async def _let_go(
    path: Path, spec: LaunchSpec, pid: int | None, ledger: Ledger, config: ManagerConfig
) -> None:
    """A recorded worker not adopted: stopped when ``pid`` is still the worker's, its
    reservation released and its record removed."""
    if pid is not None:
        await WorkerProcess.adopt(spec, pid).stop(config.stop_grace_seconds)
    await asyncio.to_thread(ledger.release, spec.worker_id)
    path.unlink(missing_ok=True)


async def stop_unrecorded_workers(config: ManagerConfig, adopted: set[str]) -> None:
    """Stop the workers an earlier sidecar spawned but never recorded (killed between
    spawn and record): found by the marker in their environment."""
    work_root = config.state_dir / "work"
    found = await asyncio.to_thread(marked_workers, work_root)
    for pid, worker_id in found.items():
        if worker_id in adopted:
            continue
        logger.warning("stopping worker %s (pid %d): it has no deployment record", worker_id, pid)
        spec = LaunchSpec(
            worker_id=worker_id,
            command=config.worker_command,
            args=(),
            host=config.worker_host,
            port=0,
            gpu_indices=(),
            log_path=config.state_dir / "logs" / f"{worker_id}.log",
            work_dir=work_root / worker_id,
            env={},
        )
        await WorkerProcess.adopt(spec, pid).stop(config.stop_grace_seconds)


def recorded_worker_alive(record: DeploymentRecord, proc: Path = Path("/proc")) -> bool:
    """True when the recorded worker's process group is alive and is the worker's: the
    only case in which adoption may signal it.

    The pid alone is not enough, the kernel hands it on once the worker is gone: the
    process holding it must have the recorded start time. A record without one (written
    before start times were recorded) is unverifiable and never signalled. A group
    whose leader is gone is the worker's leftovers (its engine and TP processes): Linux
    reuses no pid while a process group of that id lives.
    """
    if record.pid is None or record.pid_start_ticks is None:
        return False
    ticks = process_start_ticks(record.pid, proc)
    if ticks is not None and ticks != record.pid_start_ticks:
        return False
    return process_group_alive(record.pid, proc)
