"""A process's pod, read from its cgroup (``/proc/PID/cgroup``): the node's one reader.

kubelet puts each pod's containers in a cgroup named after the pod's UID, under the
systemd driver with underscores (``kubepods-burstable-pod1a2b_3c4d….slice``), under the
cgroupfs driver with dashes (``/kubepods/besteffort/pod1a2b-3c4d…/``). The DRA driver
(what a prepared claim's pods have taken) and the per-pod figures (``attribution``) both
ask it; a process outside any pod has no UID, and is foreign memory to them.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["pod_uid"]

_POD_IN_CGROUP = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)


def pod_uid(pid: int, proc_dir: Path = Path("/proc")) -> str | None:
    """The UID of the pod whose cgroup holds ``pid``; None outside a pod or when unreadable."""
    try:
        text = (proc_dir / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    match = _POD_IN_CGROUP.search(text)
    return match.group(1).replace("_", "-") if match else None
