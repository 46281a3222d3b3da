"""Read safetensors headers without touching tensor data.

A safetensors file starts with an 8-byte little-endian header length, then that many
bytes of JSON: ``{"name": {"dtype": "BF16", "shape": [..], "data_offsets": [a, b]}, …,
"__metadata__": {…}}``. The bytes of a tensor are ``b - a``; summing them gives the
exact checkpoint size per dtype, scales and zeros included.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from gatekeeper.errors import ModelSpecError
from gatekeeper.models.spec import CheckpointTensor, CheckpointWeights

__all__ = ["MAX_HEADER_BYTES", "read_checkpoint", "read_header"]

MAX_HEADER_BYTES = 100 * 1024 * 1024
"""safetensors' own limit on the JSON header."""


def _bad(path: Path, why: str) -> ModelSpecError:
    return ModelSpecError(
        f"safetensors header of {path}: {why}; the file is truncated or not safetensors. "
        "Re-download it or remove it so the estimate uses config.json alone",
        field="safetensors",
        value=str(path),
    )


def read_header(path: Path) -> list[CheckpointTensor]:
    """The tensors one safetensors file declares (reads only its header)."""
    with path.open("rb") as f:
        raw_len = f.read(8)
        if len(raw_len) != 8:
            raise _bad(path, "shorter than the 8-byte header length")
        (length,) = struct.unpack("<Q", raw_len)
        if length > MAX_HEADER_BYTES:
            raise _bad(path, f"header length {length} exceeds {MAX_HEADER_BYTES}")
        blob = f.read(length)
    if len(blob) != length:
        raise _bad(path, f"header declares {length} bytes but the file has {len(blob)}")
    try:
        header = json.loads(blob)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad(path, f"header is not JSON ({e})") from e
    if not isinstance(header, dict):
        raise _bad(path, "header is not a JSON object")
    return [_tensor(path, name, info) for name, info in header.items() if name != "__metadata__"]


def _tensor(path: Path, name: str, info: object) -> CheckpointTensor:
    try:
        assert isinstance(info, dict)
        start, end = info["data_offsets"]
        return CheckpointTensor(
            name=name,
            dtype=str(info["dtype"]),
            shape=tuple(int(d) for d in info["shape"]),
            num_bytes=int(end) - int(start),
        )
    except (AssertionError, KeyError, TypeError, ValueError) as e:
        raise _bad(path, f"entry {name!r} lacks dtype, shape or data_offsets") from e


def read_checkpoint(directory: Path) -> CheckpointWeights | None:
    """Exact weights of a local checkpoint directory, or None when it has no safetensors.

    Every ``*.safetensors`` header is read; when the shards are absent but
    ``model.safetensors.index.json`` is there, its ``metadata.total_size`` is used.
    """
    files = sorted(directory.glob("*.safetensors"))
    if files:
        tensors = [t for path in files for t in read_header(path)]
        return CheckpointWeights(
            total_bytes=sum(t.num_bytes for t in tensors),
            tensors=tuple(tensors),
            source=f"safetensors headers ({len(files)} file{'s' if len(files) > 1 else ''})",
        )
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            total = int(json.loads(index.read_text())["metadata"]["total_size"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ModelSpecError(
                f"{index}: no metadata.total_size; fix the index or remove it",
                field="model.safetensors.index.json",
                value=str(index),
            ) from e
        return CheckpointWeights(
            total_bytes=total, source="model.safetensors.index.json total_size"
        )
    return None
