"""The CDI spec that hands a prepared claim's GPUs to its containers (pure).

kubelet passes the CDI device IDs a prepare returns to the container runtime, which reads
the spec files in its CDI directory (``/var/run/cdi``) and applies their container edits
(the Container Device Interface, cncf-tags/container-device-interface ``SPEC.md``). One
spec file per claim, kind ``<driver>/gpu``, one CDI device per claimed GPU, named
``<claim uid>-<device>``, so a name is never reused for another claim. The edits:

- each device: its device node ``/dev/nvidia<index>`` where the node has it;
- the spec (applied once whichever devices are injected): the control nodes present
  (``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools``) and the env
  ``NVIDIA_VISIBLE_DEVICES`` and ``CUDA_VISIBLE_DEVICES`` = the GPUs' UUIDs (valid in
  both, whatever the GPU's index is inside the container),
  ``GATEKEEPER_CLAIMED_MEMORY_BYTES`` = the bytes claimed on each of them in the same
  order (``12884901888`` for one GPU, ``a,b`` for a TP group) and
  ``GATEKEEPER_CLAIM`` = ``namespace/name``.

Version 0.5.0: the first in which a device name may begin with a digit (a claim uid may).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gatekeeper.cluster.prepared import PreparedClaim

__all__ = [
    "CDI_VERSION",
    "CLAIMED_MEMORY_ENV",
    "CONTROL_NODES",
    "cdi_device_id",
    "cdi_kind",
    "cdi_spec",
    "spec_file_name",
]

CDI_VERSION = "0.5.0"
CLAIMED_MEMORY_ENV = "GATEKEEPER_CLAIMED_MEMORY_BYTES"
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def cdi_kind(driver: str) -> str:
    """The spec's kind: ``<driver>/gpu`` (vendor = the driver name)."""
    return f"{driver}/gpu"


def _device_name(claim_uid: str, device: str) -> str:
    return f"{claim_uid}-{device}"


def cdi_device_id(driver: str, claim_uid: str, device: str) -> str:
    """The fully qualified CDI device ID kubelet hands the runtime."""
    return f"{cdi_kind(driver)}={_device_name(claim_uid, device)}"


def spec_file_name(driver: str, claim_uid: str) -> str:
    """The claim's spec file in the CDI directory."""
    return f"{driver}-{claim_uid}.json"


def cdi_spec(driver: str, claim: PreparedClaim, present_nodes: Sequence[str]) -> dict[str, Any]:
    """The CDI spec of ``claim``'s GPUs; ``present_nodes`` are the device paths that
    exist on this node (the others are left out)."""
    present = set(present_nodes)
    devices = []
    for prepared in claim.devices:
        node = f"/dev/nvidia{prepared.gpu_index}"
        edits: Mapping[str, Any] = {"deviceNodes": [{"path": node}]} if node in present else {}
        devices.append(
            {
                "name": _device_name(claim.ref.uid, prepared.claimed.device),
                "containerEdits": dict(edits),
            }
        )
    uuids = ",".join(d.gpu_uuid for d in claim.devices)
    env = [
        f"NVIDIA_VISIBLE_DEVICES={uuids}",
        f"CUDA_VISIBLE_DEVICES={uuids}",
        f"{CLAIMED_MEMORY_ENV}={','.join(str(d.claimed.memory_bytes) for d in claim.devices)}",
        f"GATEKEEPER_CLAIM={claim.ref.namespace}/{claim.ref.name}",
    ]
    spec_edits: dict[str, Any] = {"env": env}
    control = [{"path": p} for p in CONTROL_NODES if p in present]
    if control:
        spec_edits["deviceNodes"] = control
    return {
        "cdiVersion": CDI_VERSION,
        "kind": cdi_kind(driver),
        "devices": devices,
        "containerEdits": spec_edits,
    }
