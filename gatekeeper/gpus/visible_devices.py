"""``CUDA_VISIBLE_DEVICES``: which GPUs the sidecar manages, and what a worker gets (pure).

The sidecar's own ``CUDA_VISIBLE_DEVICES`` (passed in by the entry point, never read
here) restricts the GPUs it manages. Entries are NVML indices (nvidia-smi's numbering,
PCI bus order) or GPU UUIDs, whole or a unique prefix as CUDA accepts
(``GPU-8f1c``). As in CUDA, an unset variable means every GPU, an empty one none, and
a negative index ends the list (``-1`` hides every GPU). Anything else that matches no
GPU is an error rather than CUDA's silent truncation, because a sidecar that manages
the wrong GPUs is worse than one that does not start. MIG instance UUIDs (``MIG-…``)
are refused: gatekeeper fences MIG GPUs (see docs/gpus.md).

A worker is given the GPUs' NVML indices together with
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (``worker_cuda_env``), so CUDA's device 0 in the
worker is the GPU gatekeeper chose, whatever the sidecar's own variable says.
"""

from __future__ import annotations

from collections.abc import Sequence

from gatekeeper.errors import GatekeeperError

__all__ = ["VisibleDevicesError", "parse_visible_devices", "select_devices", "worker_cuda_env"]


class VisibleDevicesError(GatekeeperError):
    """``CUDA_VISIBLE_DEVICES`` names a GPU that is not there, or names one twice."""


def parse_visible_devices(value: str | None) -> tuple[str, ...] | None:
    """Split ``CUDA_VISIBLE_DEVICES``: ``None`` when unset (every GPU), ``()`` for none.

    ``parse_visible_devices("0, 2")`` is ``("0", "2")``; ``"1,-1,3"`` is ``("1",)``.
    """
    if value is None:
        return None
    tokens: list[str] = []
    for raw in value.split(","):
        token = raw.strip()
        if token.startswith("-") and token[1:].isdigit():
            break
        if not token:
            if value.strip():
                raise VisibleDevicesError(
                    f"CUDA_VISIBLE_DEVICES={value!r} has an empty entry; list GPU indices "
                    "or UUIDs separated by commas, e.g. 0,1 or GPU-8f1c...",
                    field="CUDA_VISIBLE_DEVICES",
                    value=value,
                )
            break
        tokens.append(token)
    return tuple(tokens)


def select_devices(
    tokens: Sequence[str], gpus: Sequence[tuple[int, str | None]], *, value: str
) -> tuple[int, ...]:
    """NVML indices of the GPUs ``tokens`` name, in index order.

    ``gpus`` is every GPU as (NVML index, UUID or ``None`` if it did not answer);
    ``value`` is the variable as given, for messages.
    """
    chosen: list[int] = []
    for token in tokens:
        index = _match(token, gpus, value)
        if index in chosen:
            raise VisibleDevicesError(
                f"CUDA_VISIBLE_DEVICES={value!r} names GPU {index} twice; list each GPU once",
                field="CUDA_VISIBLE_DEVICES",
                value=value,
            )
        chosen.append(index)
    return tuple(sorted(chosen))


def _match(token: str, gpus: Sequence[tuple[int, str | None]], value: str) -> int:
    where = f"CUDA_VISIBLE_DEVICES={value!r}"
    indices = [i for i, _ in gpus]
    if token.isdigit():
        if int(token) in indices:
            return int(token)
        problem = f"names GPU {token}, but NVML sees {_describe(indices)}"
    elif token.upper().startswith("MIG-"):
        problem = (
            f"names the MIG instance {token}; gatekeeper fences MIG GPUs, so give whole GPUs "
            "(index or GPU- UUID) and disable MIG on them to place vLLM there"
        )
    else:
        found = [i for i, uuid in gpus if uuid is not None and uuid.startswith(token)]
        if len(found) == 1:
            return found[0]
        what = "no GPU" if not found else f"{len(found)} GPUs ({_describe(found)})"
        problem = f"entry {token!r} matches {what} by UUID"
        silent = [i for i, uuid in gpus if uuid is None]
        if silent and not found:
            problem += f" ({_describe(silent)} did not report a UUID: check `nvidia-smi`)"
    raise VisibleDevicesError(
        f"{where} {problem}; set it to indices or UUIDs that `gatekeeper gpus` lists "
        "(run it with CUDA_VISIBLE_DEVICES unset), or unset it to manage every GPU",
        field="CUDA_VISIBLE_DEVICES",
        value=value,
    )


def _describe(indices: Sequence[int]) -> str:
    if not indices:
        return "no GPUs"
    return ("GPU " if len(indices) == 1 else "GPUs ") + ", ".join(str(i) for i in sorted(indices))


def worker_cuda_env(indices: Sequence[int]) -> dict[str, str]:
    """The environment that gives a worker exactly these GPUs (NVML indices).

    ``worker_cuda_env([2, 3])`` is
    ``{"CUDA_VISIBLE_DEVICES": "2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}``; the worker
    then sees them as its CUDA devices 0 and 1.
    """
    return {
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in indices),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
