"""``gatekeeper gpus``: the GPUs gatekeeper would manage, as a table or JSON.

The source is ``--node`` when given, else the ``gpus`` setting (``GATEKEEPER_GPUS``):
``nvml`` reads the driver, honouring ``CUDA_VISIBLE_DEVICES``; anything else is a
declared node (``2xH100-80GB``, ``1xA100-40GB,1xL4``, or a JSON file of GPUs or a
recorded snapshot). Exit status: 0 when the reading succeeded; 2 when it failed (no
driver, or ``CUDA_VISIBLE_DEVICES`` naming a GPU that is not there: the message says how
to use a declared node) or for a bad declared node, as for ``check`` and ``plan``. With
``--json`` a failed reading is the error object of every command, with the snapshot
(``ok: false``) beside it.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gatekeeper.cli.output import GpusUnreadable, print_json, report
from gatekeeper.settings import Settings, gpu_source
from gatekeeper.units import format_gib

if TYPE_CHECKING:
    from gatekeeper.gpus.inventory import GpuInfo, InventorySnapshot

__all__ = ["add_parser", "format_table", "run"]


def add_parser(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "gpus",
        help="show the GPUs gatekeeper manages (NVML or a declared node)",
        description=(
            "Show each GPU's memory (GiB = 2^30 bytes), health and compute processes, read "
            "from the NVIDIA driver (NVML) or from a declared node."
        ),
    )
    parser.add_argument(
        "--json", action="store_true", help="print the snapshot as JSON (sizes in bytes)"
    )
    parser.add_argument(
        "--node",
        metavar="DECLARED",
        default=None,
        help="use a declared node instead of the driver: 2xH100-80GB, 1xA100-40GB,1xL4, "
        "or a JSON file of GPUs",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    source = gpu_source(settings, args.node)
    snapshot = source.snapshot(visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
    from gatekeeper.sidecar.ledger import ledger_usage  # the CLI loads the sidecar only here

    reserved = ledger_usage(settings.state_dir.expanduser())[0] if args.node is None else {}
    data = snapshot.to_dict()
    if not snapshot.ok:
        error = GpusUnreadable(str(snapshot.error), field="gpus", value=snapshot.source)
        return report(error, as_json=args.json, extra={"snapshot": data})
    if args.json:
        for gpu in data.get("gpus", []):
            gpu["reserved_by_gatekeeper_bytes"] = reserved.get(gpu.get("uuid", ""), 0)
        print_json(data)
    else:
        print(format_table(snapshot, reserved))
    return 0


def format_table(snapshot: InventorySnapshot, reserved: Mapping[str, int] | None = None) -> str:
    """The snapshot for people: a header line, one row per GPU, then details and notes.

    Sizes are GiB (2^30 bytes); DRIVER RSVD is memory the driver keeps for itself, so
    TOTAL less DRIVER RSVD is the total vLLM sees; GK RSVD is what gatekeeper has promised
    to workers still starting (the reservations ledger).
    """
    lines = [_header(snapshot)]
    if snapshot.gpus:
        header = (
            "GPU",
            "NAME",
            "TOTAL",
            "DRIVER RSVD",
            "USED",
            "FREE",
            "GK RSVD",
            "HEALTH",
            "PROCESSES",
        )
        promised = reserved or {}
        rows = [header, *(_row(g, promised.get(g.uuid, 0)) for g in snapshot.gpus)]
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        for row in rows:
            cells = [
                cell.rjust(width) if 2 <= i <= 6 else cell.ljust(width)
                for i, (cell, width) in enumerate(zip(row, widths, strict=True))
            ]
            lines.append("  ".join(cells).rstrip())
    elif snapshot.ok:
        lines.append("no GPUs")
    for gpu in snapshot.gpus:
        if not gpu.healthy:
            lines.append(
                f"gpu {gpu.index}: unhealthy: {gpu.error}; not offered for placement "
                f"(check `nvidia-smi -q -i {gpu.index}` and the kernel log for Xid errors)"
            )
        elif gpu.fence_reason:
            lines.append(f"gpu {gpu.index}: fenced: {gpu.fence_reason}")
    lines.extend(f"note: {n}" for n in snapshot.notes)
    if not snapshot.ok:
        lines.append(f"error: {snapshot.error}")
    return "\n".join(lines)


def _header(snapshot: InventorySnapshot) -> str:
    parts = [f"source: {snapshot.source}"]
    if snapshot.driver_version:
        parts.append(f"driver {snapshot.driver_version}")
    if snapshot.nvml_version:
        parts.append(f"NVML {snapshot.nvml_version}")
    parts.append(f"{len(snapshot.gpus)} GPU{'s' if len(snapshot.gpus) != 1 else ''}")
    if snapshot.source == "nvml":
        parts.append(f"read in {snapshot.duration_seconds * 1000:.1f} ms")
    return ", ".join(parts)


def _row(gpu: GpuInfo, promised: int = 0) -> tuple[str, ...]:
    if gpu.healthy:
        health = "fenced" if gpu.fence_reason else "ok"
        reserved = gpu.driver_reserved_bytes
        sizes = (
            format_gib(gpu.total_bytes),
            "n/a" if reserved is None else format_gib(reserved),
            format_gib(gpu.used_bytes),
            format_gib(gpu.free_bytes),
            format_gib(promised),
        )
    else:
        health = "UNHEALTHY"
        sizes = ("-", "-", "-", "-", "-")
    processes = ", ".join(
        f"{p.pid} ({'n/a' if p.used_bytes is None else format_gib(p.used_bytes)})"
        for p in gpu.processes
    )
    return (str(gpu.index), gpu.name or "?", *sizes, health, processes or "-")
