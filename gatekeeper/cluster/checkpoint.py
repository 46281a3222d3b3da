"""The kubelet plugin's checkpoint: the prepared claims, on disk, written atomically.

As kubelet's own checkpoints (``k8s.io/kubernetes/pkg/kubelet/checkpointmanager``) and
NVIDIA's DRA driver's: one JSON file in the plugin's directory holding the data and a
checksum of it, written to a temporary file in the same directory, flushed, fsynced and
renamed over the old one, so a crash leaves the old file or the new one, never half of
either. A restarted plugin reads it and answers a prepare of a claim it prepared before
with the same devices, without checking again.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gatekeeper.cluster.prepared import PreparedClaim
from gatekeeper.errors import GatekeeperError

__all__ = ["CHECKPOINT_VERSION", "Checkpoint", "CheckpointError"]

CHECKPOINT_VERSION = "gatekeeper.dev/checkpoint/v1"


class CheckpointError(GatekeeperError):
    """The checkpoint file cannot be read as one this plugin wrote."""


def _checksum(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


class Checkpoint:
    """The prepared claims by uid, in ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, PreparedClaim]:
        """The claims last saved; none when the file does not exist yet."""
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            raise CheckpointError(
                f"checkpoint {self.path} cannot be read ({e}); move it aside and restart: "
                "kubelet prepares its pods' claims again",
                field="checkpoint",
                value=str(self.path),
            ) from e
        data = raw.get("data") if isinstance(raw, dict) else None
        if (
            not isinstance(data, dict)
            or raw.get("version") != CHECKPOINT_VERSION
            or raw.get("checksum") != _checksum(data)
        ):
            raise CheckpointError(
                f"checkpoint {self.path} is not a {CHECKPOINT_VERSION} file or its checksum "
                "does not match its data; move it aside and restart: kubelet prepares its "
                "pods' claims again",
                field="checkpoint",
                value=str(self.path),
            )
        return {uid: PreparedClaim.from_dict(c) for uid, c in data["claims"].items()}

    def save(self, claims: Mapping[str, PreparedClaim]) -> None:
        """Replace the file with ``claims``, atomically."""
        data = {"claims": {uid: c.to_dict() for uid, c in sorted(claims.items())}}
        body = {"version": CHECKPOINT_VERSION, "checksum": _checksum(data), "data": data}
        write_atomically(self.path, json.dumps(body, indent=1, sort_keys=True))


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a fsynced temporary file renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
