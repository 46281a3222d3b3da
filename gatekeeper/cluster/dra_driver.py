"""The node side of gatekeeper's DRA driver: prepare and unprepare claims (no gRPC here).

``DraDriver.prepare`` (kubelet's ``NodePrepareResources``, one claim):

1. a claim already in the checkpoint answers with the devices it was prepared with, and
   nothing is checked again (kubelet may ask twice; a restarted agent answers the same);
2. otherwise the claim is read from the apiserver (``read_claim``) and its devices of
   this driver on this node's pool are taken (``prepared.claimed_devices``), each booking
   checked against the node's ResourceSlice as published (``read_published``;
   ``allocation_check.check_published``): a device the slice does not list, zero or
   negative bytes, bytes above the device's capacity or outside its request policy are
   refused, whoever wrote the allocation;
3. the pods the claim is reserved for are read (``read_pod``) and each container that
   runs vLLM on the claim found (``reserves.claim_users``); a pod with none is prepared
   without the flag check, which the log says. What those vLLM containers' flags let vLLM
   take on each device's GPU must fit the device's claimed bytes
   (``reserves.check_reserves``). This sizing (the model resolved, perhaps from config
   files) runs outside the lock, on a snapshot read before it: a GPU's name and total
   memory do not change between that snapshot and the one under the lock;
4. under one lock, so that two prepares never promise the same bytes: the GPUs are read
   again (NVML, through the inventory), each device's GPU found by its name
   (``slices.device_name``; one that vanished meanwhile is refused), and its bytes checked
   against NVML's free memory less what the other prepared claims there have not yet
   taken and what prepares waiting ahead of it ask for (``prepared.check_free``); what a
   claim has taken is its pods' processes' usage, a process's pod read from
   ``/proc/<pid>/cgroup``;
5. bytes not free now (``BytesNotFree``): the prepare waits for them, at most
   ``wait_seconds``, never past the call's ``deadline`` (kubelet's, less a margin:
   ``kubelet_plugin``) nor its end (``alive``), in line: first come, first served, a
   later prepare never taking bytes an earlier waiter waits for. It waits on a condition
   of the lock, so it holds nothing unprepare and other prepares need; an unprepare wakes
   it at once, and it reads NVML again every ``poll_seconds`` for memory freed outside the
   claims. Admitted once the bytes are free, else refused with the same reason once the
   wait is over; with ``max_waiters`` in line a prepare is refused at once (each waiter
   holds one of the plugin's gRPC threads);
6. the CDI spec is written (``cdi.cdi_spec``), then the checkpoint, and the CDI device
   IDs returned.

``unprepare`` removes the claim's CDI spec and its checkpoint entry, and wakes the waiters;
a claim not prepared is already unprepared. ``close`` (the agent stopping) refuses the
waiters at once.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gatekeeper.cluster.allocation_check import check_published
from gatekeeper.cluster.cdi import CONTROL_NODES, cdi_device_id, cdi_spec, spec_file_name
from gatekeeper.cluster.checkpoint import Checkpoint, write_atomically
from gatekeeper.cluster.pod_cgroup import pod_uid
from gatekeeper.cluster.prepared import (
    BytesNotFree,
    ClaimedDevice,
    ClaimRef,
    PreparedClaim,
    PreparedDevice,
    PrepareError,
    Waiter,
    check_free,
    claimed_devices,
    outstanding_bytes,
    spread_taken,
    waiting_ahead,
)
from gatekeeper.cluster.reserves import (
    ClaimUser,
    RankSizer,
    check_reserves,
    claim_users,
    vllm_takes,
)
from gatekeeper.cluster.slices import DRIVER_NAME, device_name, slice_name
from gatekeeper.errors import GatekeeperError
from gatekeeper.gpus.inventory import GpuInfo, InventorySnapshot

__all__ = [
    "DEADLINE_MARGIN_SECONDS",
    "KUBELET_CALL_TIMEOUT_SECONDS",
    "DraDriver",
    "DriverPaths",
]

log = logging.getLogger("gatekeeper.cluster.dra_driver")
KUBELET_CALL_TIMEOUT_SECONDS = 45.0
"""kubelet's deadline on each call to a DRA plugin (prepare included): the constant
``defaultClientCallTimeout = 45 * time.Second`` in k8s.io/kubernetes v1.37.2
``pkg/kubelet/cm/dra/plugin/dra_plugin.go`` ("half of the kubelet retry period"), which
applies because kubelet registers plugins with no timeout of their own (``RegisterPlugin(...,
nil)`` in ``pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go``)."""
DEADLINE_MARGIN_SECONDS = 2.0
"""Kept back from a call's deadline for the last check, the files and the answer's way
back: a prepare waits at most until the deadline less this."""


@dataclass(frozen=True, slots=True)
class DriverPaths:
    """Where the driver keeps its files on the node."""

    plugin_dir: Path
    """The checkpoint's directory (and the DRA socket's): /var/lib/kubelet/plugins/<driver>."""
    cdi_dir: Path
    """Where the container runtime reads CDI specs: /var/run/cdi."""
    dev_dir: Path = Path("/dev")
    proc_dir: Path = Path("/proc")

    @property
    def checkpoint(self) -> Path:
        return self.plugin_dir / "checkpoint.json"


class DraDriver:
    """Prepares and unprepares this node's claims of ``driver``."""

    def __init__(
        self,
        node_name: str,
        paths: DriverPaths,
        read_claim: Callable[[str, str], Mapping[str, Any]],
        read_gpus: Callable[[], InventorySnapshot],
        to_bytes: Callable[[str], int],
        driver: str = DRIVER_NAME,
        *,
        read_pod: Callable[[str, str], Mapping[str, Any]] | None = None,
        size_rank: RankSizer | None = None,
        read_published: Callable[[], Mapping[str, Any] | None] | None = None,
        default_release: str | None = None,
        count_prepare: Callable[[Literal["prepared", "refused"]], None] | None = None,
        wait_seconds: float = 0.0,
        poll_seconds: float = 0.5,
        max_waiters: int = 12,
    ) -> None:
        self.node_name = node_name
        self._count_prepare = count_prepare or (lambda outcome: None)
        """Told each prepare's outcome (``agent_metrics.PrepareCounter.count``)."""
        self.driver = driver
        self._paths = paths
        self._read_claim = read_claim
        self._read_gpus = read_gpus
        self._to_bytes = to_bytes
        self._read_pod = read_pod
        self._size_rank = size_rank
        self._read_published = read_published
        """The node's ResourceSlice of ``driver`` as the apiserver has it (None: not
        published); None: allocations are not checked against it (tests of other steps)."""
        self._release = default_release
        longest = KUBELET_CALL_TIMEOUT_SECONDS - DEADLINE_MARGIN_SECONDS
        if not 0 <= wait_seconds <= longest:
            raise GatekeeperError(
                f"the prepare wait of {wait_seconds} s is outside 0-{longest:g} s (kubelet "
                f"gives a prepare {KUBELET_CALL_TIMEOUT_SECONDS:g} s, less "
                f"{DEADLINE_MARGIN_SECONDS:g} s for the answer); set --prepare-wait-seconds "
                "(or prepare_wait_seconds) in that range",
                field="prepare_wait_seconds",
                value=wait_seconds,
            )
        self.wait_seconds = wait_seconds
        """How long a prepare whose bytes are not free waits for them (step 5); 0: not at all."""
        self._poll_seconds = poll_seconds
        self.max_waiters = max_waiters
        """The most prepares waiting at once; one more is refused without waiting."""
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        """Notified when bytes may have come free: an unprepare, a waiter leaving the line."""
        self._line: list[Waiter] = []
        self._closed = False
        self._checkpoint = Checkpoint(paths.checkpoint)
        self.prepared: dict[str, PreparedClaim] = self._checkpoint.load()
        """The prepared claims by uid, as checkpointed."""

    def prepare(
        self,
        ref: ClaimRef,
        deadline: float | None = None,
        alive: Callable[[], bool] | None = None,
    ) -> PreparedClaim:
        """Prepare ``ref``'s devices (see the module's steps); ``PrepareError`` when not now.
        ``deadline`` (``time.monotonic()``) bounds the wait for bytes, and so does ``alive``
        (grpc's ``context.is_active``): false once kubelet's call ended. Each outcome is
        counted: ``refused`` for any error (a ``PrepareError``, or one the plugin answers
        kubelet with all the same: the apiserver unreachable, a CDI spec not written), else
        ``prepared``."""
        try:
            prepared = self._prepare(ref, deadline, alive)
        except Exception:
            self._count_prepare("refused")
            raise
        self._count_prepare("prepared")
        return prepared

    @property
    def waiting(self) -> tuple[ClaimRef, ...]:
        """The claims whose prepares wait for bytes now, first come first."""
        with self._lock:
            return tuple(w.ref for w in self._line)

    def _prepare(
        self, ref: ClaimRef, deadline: float | None, alive: Callable[[], bool] | None
    ) -> PreparedClaim:
        done = self.prepared.get(ref.uid)
        if done is not None:
            return done
        claim = self._read_claim(ref.namespace, ref.name)
        claimed = claimed_devices(claim, ref, self.driver, self.node_name, self._to_bytes)
        if self._read_published is not None:
            what = f"ResourceSlice {slice_name(self.node_name, self.driver)}"
            check_published(ref, claimed, self._read_published(), self._to_bytes, what)
        reserved = (claim.get("status") or {}).get("reservedFor") or []
        reserved = [r for r in reserved if r.get("resource") == "pods"]
        pods = tuple(str(r.get("uid", "")) for r in reserved)
        self._check_flags(ref, claimed, self._users(ref, reserved))
        start = time.monotonic()
        until = start + self.wait_seconds
        until = until if deadline is None else min(until, deadline)
        with self._changed:
            prepared = self._admit(Waiter(ref, claimed, alive), pods, (start, until))
        devices = ", ".join(d.cdi_device_id for d in prepared.devices)
        log.info("prepared claim %s: %s", ref, devices)
        return prepared

    def _admit(
        self, waiter: Waiter, pods: tuple[str, ...], span: tuple[float, float]
    ) -> PreparedClaim:
        """Under the lock: ``waiter``'s claim prepared once its bytes are free (step 4),
        waiting in line for them within ``span`` (its start and end, step 5)."""
        ref, claimed = waiter.ref, waiter.claimed
        try:
            while (done := self.prepared.get(ref.uid)) is None:
                try:
                    devices = self._fit(ref, claimed, waiter)
                except BytesNotFree as e:
                    self._wait(e, waiter, span)
                    continue
                done = PreparedClaim(ref, pods, devices)
                self._write_spec(done)
                self._checkpoint.save({**self.prepared, ref.uid: done})
                self.prepared[ref.uid] = done
        finally:
            if waiter in self._line:
                self._line.remove(waiter)
                self._changed.notify_all()  # those behind it no longer count its bytes
                log.info("claim %s left the line after %.2f s", ref, time.monotonic() - span[0])
        return done

    def _fit(
        self, ref: ClaimRef, claimed: tuple[ClaimedDevice, ...], waiter: Waiter
    ) -> tuple[PreparedDevice, ...]:
        """Each device's GPU read now, its bytes free (``BytesNotFree`` otherwise): free
        less the prepared claims' outstanding bytes, what waiters ahead ask, and what this
        claim's earlier devices on the same GPU take."""
        snapshot = self._read_gpus()
        taken = self._taken(snapshot)
        devices: list[PreparedDevice] = []
        for device in claimed:
            gpu = self._gpu(ref, device.device, snapshot)
            others = outstanding_bytes(self.prepared.values(), gpu.uuid, taken)
            mine = sum(d.claimed.memory_bytes for d in devices if d.gpu_uuid == gpu.uuid)
            if mine:  # its other requests there (added: a claim of its name may be prepared)
                others[ref.named] = others.get(ref.named, 0) + mine
            check_free(ref, device, gpu, others, waiting_ahead(self._line, waiter, device.device))
            device_id = cdi_device_id(self.driver, ref.uid, device.device)
            devices.append(PreparedDevice(device, gpu.index, gpu.uuid, device_id))
        return tuple(devices)

    def _wait(self, refused: BytesNotFree, waiter: Waiter, span: tuple[float, float]) -> None:
        """Waits, the lock released, until bytes may have come free (an unprepare, a waiter
        leaving) or ``poll_seconds`` pass, ``waiter`` in line; raises ``refused`` once past
        ``span``'s end, or at once when no wait is allowed or the line is full."""
        start, until = span
        if self._closed:
            raise refused.noting(
                "The agent is stopping: kubelet retries the prepare with the agent that starts next"
            ) from None
        if waiter.alive is not None and not waiter.alive():
            raise refused.noting("kubelet's call ended (cancelled, or kubelet restarted)") from None
        left = until - time.monotonic()
        queued = waiter in self._line
        if left <= 0 and not queued:
            raise refused
        if left <= 0:
            raise refused.noting(
                f"It waited {time.monotonic() - start:.2f} s for them, the most it may (the "
                f"agent's --prepare-wait-seconds {self.wait_seconds:g}, within kubelet's "
                f"{KUBELET_CALL_TIMEOUT_SECONDS:g} s deadline less "
                f"{DEADLINE_MARGIN_SECONDS:g} s)"
            ) from None
        if not queued:
            if len(self._line) >= self.max_waiters:
                raise refused.noting(
                    f"It did not wait: {len(self._line)} prepares already wait for memory on "
                    "this node, the most that may"
                ) from None
            self._line.append(waiter)
            log.info("claim %s waits up to %.2f s for its bytes: %s", waiter.ref, left, refused)
        self._changed.wait(min(self._poll_seconds, left))

    def _users(self, ref: ClaimRef, reserved: list[Mapping[str, Any]]) -> list[ClaimUser]:
        """The vLLM containers of the pods ``reserved`` that use the claim (step 3)."""
        if self._read_pod is None:
            return []
        users: list[ClaimUser] = []
        for entry in reserved:
            pod = self._read_pod(ref.namespace, str(entry.get("name")))
            if (pod.get("metadata") or {}).get("uid") != entry.get("uid"):
                continue  # a pod of that name made again: kubelet prepares for the new one
            found, others = claim_users(pod, ref.name, self._release)
            users += found
            if others and not found:
                without = "prepared without the flag check"
                log.info("claim %s: %s run no vLLM; %s", ref, ", ".join(others), without)
        if not users and not reserved:
            log.info("claim %s: reserved for no pod; prepared without the flag check", ref)
        return users

    def _check_flags(
        self, ref: ClaimRef, claimed: tuple[ClaimedDevice, ...], users: list[ClaimUser]
    ) -> None:
        """What the users' vLLM flags let vLLM take on each device's GPU fits the device's
        bytes (step 3: outside the lock; a GPU's name and total do not change)."""
        if not users:
            return
        snapshot = self._read_gpus()
        for device in claimed:
            gpu = self._gpu(ref, device.device, snapshot)
            prepared = PreparedDevice(device, gpu.index, gpu.uuid, "")
            takes = []
            for user in users:
                size = self._size_rank
                estimated = size(user.command, gpu.total_bytes, gpu.name) if size else None
                takes.append((user, vllm_takes(user.command, gpu.total_bytes, estimated)))
            check_reserves(ref, prepared, gpu.total_bytes, takes)

    def close(self) -> None:
        """The waiting prepares are refused now, and later ones do not wait: the agent
        stops, and none keeps its gRPC thread (and so the process) until its bound."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def unprepare(self, ref: ClaimRef) -> None:
        """Release ``ref``: its CDI spec and its checkpoint entry go; waiters wake."""
        with self._changed:
            (self._paths.cdi_dir / spec_file_name(self.driver, ref.uid)).unlink(missing_ok=True)
            if ref.uid in self.prepared:
                self._checkpoint.save({u: c for u, c in self.prepared.items() if u != ref.uid})
                del self.prepared[ref.uid]
                self._changed.notify_all()  # its bytes may be what a waiter waits for
                log.info("unprepared claim %s", ref)

    def _gpu(self, ref: ClaimRef, device: str, snapshot: InventorySnapshot) -> GpuInfo:
        if not snapshot.ok:
            raise PrepareError(
                f"claim {ref}: the GPUs cannot be read ({snapshot.error}); kubelet retries "
                "the prepare once NVML answers",
                field="snapshot.ok",
                value=snapshot.ok,
            )
        for gpu in snapshot.gpus:
            if device_name(gpu) == device:
                if gpu.placeable:
                    return gpu
                why = gpu.error or gpu.fence_reason
                raise PrepareError(
                    f"claim {ref}: device {device} (GPU {gpu.index}, {gpu.uuid}) is not "
                    f"usable: {why}; delete the pod to have it placed on another GPU",
                    field="device",
                    value=device,
                )
        present = ", ".join(device_name(g) for g in snapshot.gpus) or "none"
        raise PrepareError(
            f"claim {ref}: device {device} is not on this node {self.node_name} now (its "
            f"GPUs: {present}); the GPU vanished: delete the pod to have it placed again",
            field="device",
            value=device,
        )

    def _taken(self, snapshot: InventorySnapshot) -> dict[tuple[str, str], int]:
        """What each prepared claim's pods hold on each GPU, by (claim uid, GPU uuid); a
        pod's usage spread over its claims there (``prepared.spread_taken``)."""
        claims_of: dict[str, list[PreparedClaim]] = {}
        for c in self.prepared.values():
            for pod in c.pod_uids:
                claims_of.setdefault(pod, []).append(c)
        taken: dict[tuple[str, str], int] = {}
        for gpu in snapshot.gpus:
            held: dict[str, int] = {}
            for process in gpu.processes:
                uid = pod_uid(process.pid, self._paths.proc_dir)
                if uid is not None and uid in claims_of:
                    held[uid] = held.get(uid, 0) + (process.used_bytes or 0)
            for pod, used in held.items():
                for key, share in spread_taken(claims_of[pod], gpu.uuid, used).items():
                    taken[key] = taken.get(key, 0) + share
        return taken

    def _write_spec(self, prepared: PreparedClaim) -> None:
        dev = self._paths.dev_dir
        wanted = [*CONTROL_NODES, *(f"/dev/nvidia{d.gpu_index}" for d in prepared.devices)]
        present = [p for p in wanted if (dev / p.removeprefix("/dev/")).exists()]
        spec = cdi_spec(self.driver, prepared, present)
        path = self._paths.cdi_dir / spec_file_name(self.driver, prepared.ref.uid)
        write_atomically(path, json.dumps(spec, indent=1))
