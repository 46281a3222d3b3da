"""The node side of gatekeeper's DRA driver: prepare and unprepare claims (no gRPC here).

``DraDriver.prepare`` (kubelet's ``NodePrepareResources``, one claim):

1. a claim already in the checkpoint answers with the devices it was prepared with, and
   nothing is checked again (kubelet may ask twice; a restarted agent answers the same);
2. otherwise the claim is read from the apiserver (``read_claim``) and its devices of
   this driver on this node's pool are taken (``prepared.claimed_devices``);
3. the pods the claim is reserved for are read (``read_pod``) and each container that
   runs vLLM on the claim found (``reserves.claim_users``); a pod with none is prepared
   without the flag check, which the log says;
4. under one lock, so that two prepares never promise the same bytes: the GPUs are read
   (NVML, through the inventory), each device's GPU found by its name (``slices.device_name``),
   and its bytes checked against NVML's free memory less what the other prepared claims
   there have not yet taken (``prepared.check_free``); what a claim has taken is its
   pods' processes' usage, a process's pod read from ``/proc/<pid>/cgroup``; and what
   those vLLM containers' flags let vLLM take on that GPU must fit the device's claimed
   bytes (``reserves.check_reserves``);
5. the CDI spec is written (``cdi.cdi_spec``), then the checkpoint, and the CDI device
   IDs returned.

``unprepare`` removes the claim's CDI spec and its checkpoint entry; a claim not prepared
is already unprepared.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gatekeeper.cluster.cdi import CONTROL_NODES, cdi_device_id, cdi_spec, spec_file_name
from gatekeeper.cluster.checkpoint import Checkpoint, write_atomically
from gatekeeper.cluster.prepared import (
    ClaimRef,
    PreparedClaim,
    PreparedDevice,
    PrepareError,
    check_free,
    claimed_devices,
    outstanding_bytes,
)
from gatekeeper.cluster.reserves import (
    ClaimUser,
    RankSizer,
    check_reserves,
    claim_users,
    vllm_takes,
)
from gatekeeper.cluster.slices import DRIVER_NAME, device_name
from gatekeeper.gpus.inventory import GpuInfo, InventorySnapshot

__all__ = ["DraDriver", "DriverPaths", "pod_uid"]

log = logging.getLogger("gatekeeper.cluster.dra_driver")
# kubepods-burstable-pod1a2b_3c4d.slice (systemd) or /kubepods/besteffort/pod1a2b-3c4d/ (cgroupfs)
_POD_IN_CGROUP = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)


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


def pod_uid(pid: int, proc_dir: Path = Path("/proc")) -> str | None:
    """The UID of the pod whose cgroup holds ``pid``; None outside a pod or when unreadable."""
    try:
        text = (proc_dir / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    match = _POD_IN_CGROUP.search(text)
    return match.group(1).replace("_", "-") if match else None


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
        default_release: str | None = None,
        count_prepare: Callable[[Literal["prepared", "refused"]], None] | None = None,
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
        self._release = default_release
        self._lock = threading.Lock()
        self._checkpoint = Checkpoint(paths.checkpoint)
        self.prepared: dict[str, PreparedClaim] = self._checkpoint.load()
        """The prepared claims by uid, as checkpointed."""

    def prepare(self, ref: ClaimRef) -> PreparedClaim:
        """Prepare ``ref``'s devices (see the module's steps); ``PrepareError`` when not now.
        Each outcome is counted: ``refused`` for a ``PrepareError``, else ``prepared``."""
        try:
            prepared = self._prepare(ref)
        except PrepareError:
            self._count_prepare("refused")
            raise
        self._count_prepare("prepared")
        return prepared

    def _prepare(self, ref: ClaimRef) -> PreparedClaim:
        done = self.prepared.get(ref.uid)
        if done is not None:
            return done
        claim = self._read_claim(ref.namespace, ref.name)
        claimed = claimed_devices(claim, ref, self.driver, self.node_name, self._to_bytes)
        reserved = (claim.get("status") or {}).get("reservedFor") or []
        pods = tuple(str(r.get("uid", "")) for r in reserved if r.get("resource") == "pods")
        users = self._users(ref, [r for r in reserved if r.get("resource") == "pods"])
        with self._lock:
            done = self.prepared.get(ref.uid)
            if done is not None:
                return done
            snapshot = self._read_gpus()
            taken = self._taken(snapshot)
            devices = []
            for device in claimed:
                gpu = self._gpu(ref, device.device, snapshot)
                others = outstanding_bytes(self.prepared.values(), gpu.uuid, taken)
                check_free(ref, device, gpu, others)
                device_id = cdi_device_id(self.driver, ref.uid, device.device)
                devices.append(PreparedDevice(device, gpu.index, gpu.uuid, device_id))
                self._check_flags(ref, devices[-1], gpu, users)
            prepared = PreparedClaim(ref, pods, tuple(devices))
            self._write_spec(prepared)
            self._checkpoint.save({**self.prepared, ref.uid: prepared})
            self.prepared[ref.uid] = prepared
        log.info("prepared claim %s: %s", ref, ", ".join(d.cdi_device_id for d in devices))
        return prepared

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
                log.info(
                    "claim %s: %s run no vLLM; prepared without the flag check",
                    ref,
                    ", ".join(others),
                )
        if not users and not reserved:
            log.info("claim %s: reserved for no pod; prepared without the flag check", ref)
        return users

    def _check_flags(
        self, ref: ClaimRef, device: PreparedDevice, gpu: GpuInfo, users: list[ClaimUser]
    ) -> None:
        """What the users' vLLM flags let vLLM take on ``gpu`` fits the device's bytes."""
        if not users:
            return
        size = self._size_rank
        takes = []
        for user in users:
            estimated = size(user.command, gpu.total_bytes, gpu.name) if size else None
            takes.append((user, vllm_takes(user.command, gpu.total_bytes, estimated)))
        check_reserves(ref, device, gpu.total_bytes, takes)

    def unprepare(self, ref: ClaimRef) -> None:
        """Release ``ref``: its CDI spec and its checkpoint entry go."""
        with self._lock:
            (self._paths.cdi_dir / spec_file_name(self.driver, ref.uid)).unlink(missing_ok=True)
            if ref.uid in self.prepared:
                self._checkpoint.save({u: c for u, c in self.prepared.items() if u != ref.uid})
                del self.prepared[ref.uid]
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
        """What each prepared claim's pods hold on each GPU, by (claim uid, GPU uuid)."""
        claim_of_pod = {pod: uid for uid, c in self.prepared.items() for pod in c.pod_uids}
        taken: dict[tuple[str, str], int] = {}
        for gpu in snapshot.gpus:
            for process in gpu.processes:
                pod = pod_uid(process.pid, self._paths.proc_dir)
                claim = claim_of_pod.get(pod) if pod else None
                if claim is not None:
                    key = (claim, gpu.uuid)
                    taken[key] = taken.get(key, 0) + (process.used_bytes or 0)
        return taken

    def _write_spec(self, prepared: PreparedClaim) -> None:
        dev = self._paths.dev_dir
        wanted = [*CONTROL_NODES, *(f"/dev/nvidia{d.gpu_index}" for d in prepared.devices)]
        present = [p for p in wanted if (dev / p.removeprefix("/dev/")).exists()]
        spec = cdi_spec(self.driver, prepared, present)
        path = self._paths.cdi_dir / spec_file_name(self.driver, prepared.ref.uid)
        write_atomically(path, json.dumps(spec, indent=1))
