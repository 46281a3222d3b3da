"""Declared nodes: GPUs described by hand, for planning on a machine without them.

Three forms, all giving an ``InventorySnapshot`` (``source="declared"``):

- a product list, ``2xH100-80GB`` or ``1xA100-40GB,1xL4`` (``L4`` alone means one);
  each GPU's total is the GPU table's figure, the memory vLLM sees (79.19 GiB for an
  H100 80GB), and it is empty;
- a JSON file of GPUs, which can describe a busy node::

      {"gpus": [
        {"name": "H100-80GB", "count": 2},
        {"name": "L4", "used": "6GiB", "processes": [{"pid": 4242, "used": "6GiB"}]},
        {"name": "my-card", "total": "47.5GiB"}
      ]}

  Keys per entry: ``name`` (required), ``count``, ``total`` and ``used`` (bytes or a
  size such as ``12GiB``), ``processes`` (``pid`` and ``used``), ``uuid``, ``healthy``,
  ``error``. ``used`` defaults to the sum of the processes' ``used``;
- a snapshot recorded with ``gatekeeper gpus --json`` (it has a ``schema`` key).

A value is read as a file when it ends in ``.json`` or contains a ``/``.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from gatekeeper.errors import GatekeeperError, UnknownGpuError
from gatekeeper.gpus.inventory import (
    GpuInfo,
    GpuProcess,
    InventorySnapshot,
    read_json_object,
)
from gatekeeper.gpus.products import GpuProduct, gpu_products, lookup_gpu
from gatekeeper.units import parse_size

__all__ = ["MAX_DECLARED_GPUS", "DeclaredNodeError", "load_node_file", "parse_declared_node"]

MAX_DECLARED_GPUS = 64
"""More GPUs than any single node has; a larger count is a typo."""

_ITEM_RE = re.compile(r"^(?:(\d+)\s*[xX]\s*)?(\S.*)$")
_ENTRY_KEYS = frozenset({"name", "count", "total", "used", "processes", "uuid", "healthy", "error"})
_EXAMPLE = "for example 2xH100-80GB, 1xA100-40GB,1xL4, or the path of a JSON file of GPUs"


class DeclaredNodeError(GatekeeperError):
    """A declared node (product list or JSON file) cannot be read."""


def parse_declared_node(value: str) -> InventorySnapshot:
    """Read a declared node: a product list, a JSON file of GPUs or a recorded snapshot.

    ``parse_declared_node("2xH100-80GB")`` gives two empty GPUs with 79.19 GiB each.
    Raises ``DeclaredNodeError`` naming the value and what is accepted.
    """
    text = value.strip()
    if not text:
        raise DeclaredNodeError(
            f"declared node: {value!r} is empty; give the GPUs, {_EXAMPLE}",
            field="node",
            value=value,
        )
    if text.endswith(".json") or "/" in text:
        return load_node_file(Path(text))
    gpus: list[GpuInfo] = []
    for item in text.split(","):
        count, name = _parse_item(item.strip(), text)
        product = _product(name, text)
        first = len(gpus)
        gpus.extend(
            _declared_gpu(first + i, product.name, product.total_bytes) for i in range(count)
        )
    _check_count(len(gpus), text)
    return _declared_snapshot(gpus)


def load_node_file(path: Path) -> InventorySnapshot:
    """Read a JSON file of GPUs (declared form) or a recorded snapshot."""
    data = read_json_object(path)
    if "schema" in data or "ok" in data:
        return InventorySnapshot.from_dict(data, where=str(path))
    entries = data.get("gpus")
    if not isinstance(entries, list) or not entries:
        raise DeclaredNodeError(
            f"{path}: needs a non-empty 'gpus' list, e.g. "
            '{"gpus": [{"name": "H100-80GB", "count": 2}]}',
            field="gpus",
            value=str(path),
        )
    gpus: list[GpuInfo] = []
    for i, entry in enumerate(entries):
        gpus.extend(_entry_gpus(entry, len(gpus), f"{path}: gpus[{i}]"))
    _check_count(len(gpus), str(path))
    return _declared_snapshot(gpus)


def _parse_item(item: str, whole: str) -> tuple[int, str]:
    match = _ITEM_RE.match(item)
    if match is None:
        raise DeclaredNodeError(
            f"declared node: {whole!r} has an empty item; give COUNTxPRODUCT items separated "
            f"by commas, {_EXAMPLE}",
            field="node",
            value=whole,
        )
    count = int(match.group(1) or 1)
    if count < 1:
        raise DeclaredNodeError(
            f"declared node: {item!r} in {whole!r} declares {count} GPUs; the count must be "
            f"at least 1, {_EXAMPLE}",
            field="node",
            value=whole,
        )
    return count, match.group(2).strip()


def _product(name: str, where: str) -> GpuProduct:
    try:
        return lookup_gpu(name)
    except UnknownGpuError as e:
        known = ", ".join(p.name for p in gpu_products())
        raise DeclaredNodeError(
            f"declared node: {name!r} in {where!r} is not in the GPU table; use one of "
            f"{known}, or describe the GPU with its total in a JSON file "
            '({"gpus": [{"name": "my-gpu", "total": "47.5GiB"}]})',
            field="node",
            value=where,
        ) from e


def _check_count(count: int, where: str) -> None:
    if count > MAX_DECLARED_GPUS:
        raise DeclaredNodeError(
            f"declared node: {where!r} declares {count} GPUs, more than "
            f"{MAX_DECLARED_GPUS} on one node; check the count",
            field="node",
            value=where,
        )


def _declared_gpu(
    index: int,
    name: str,
    total: int,
    used: int = 0,
    processes: tuple[GpuProcess, ...] = (),
    uuid: str | None = None,
) -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=uuid or f"DECLARED-{index}",
        name=name,
        pci_bus_id="",
        total_bytes=total,
        free_bytes=total - used,
        used_bytes=used,
        driver_reserved_bytes=None,
        processes=processes,
    )


def _declared_snapshot(gpus: list[GpuInfo]) -> InventorySnapshot:
    return InventorySnapshot(gpus=tuple(gpus), ok=True, source="declared")


def _entry_gpus(entry: object, first_index: int, where: str) -> list[GpuInfo]:
    if not isinstance(entry, dict):
        raise DeclaredNodeError(
            f'{where}: {entry!r} is not an object; give one such as {{"name": "L4"}}',
            field=where,
            value=entry,
        )
    unknown = sorted(set(entry) - _ENTRY_KEYS)
    if unknown:
        raise DeclaredNodeError(
            f"{where}: unknown key(s) {', '.join(unknown)}; "
            f"the keys are {', '.join(sorted(_ENTRY_KEYS))}",
            field=unknown[0],
            value=entry[unknown[0]],
        )
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise DeclaredNodeError(
            f'{where}: name = {name!r}; a name is required, e.g. "H100-80GB"',
            field="name",
            value=name,
        )
    total = _size(entry, "total", where) if "total" in entry else _product(name, where).total_bytes
    processes = _processes(entry.get("processes", []), where)
    count = _count(entry, where, has_processes=bool(processes) or "uuid" in entry)
    listed = sum(p.used_bytes or 0 for p in processes)
    used = _size(entry, "used", where, allow_zero=True) if "used" in entry else listed
    if used > total or listed > used:
        raise DeclaredNodeError(
            f"{where}: used {used} bytes (processes {listed}) does not fit total {total} "
            "bytes; used must be at most total and at least the processes' sum",
            field="used",
            value=used,
        )
    gpus = [
        _declared_gpu(first_index + i, name, total, used, processes, entry.get("uuid"))
        for i in range(count)
    ]
    if entry.get("healthy") is False:
        error = str(entry.get("error") or "declared unhealthy")
        gpus = [replace(g, healthy=False, error=error) for g in gpus]
    return gpus


def _count(entry: dict[str, Any], where: str, *, has_processes: bool) -> int:
    count = entry.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise DeclaredNodeError(
            f"{where}: count = {count!r} must be a whole number of at least 1",
            field="count",
            value=count,
        )
    if count > 1 and has_processes:
        raise DeclaredNodeError(
            f"{where}: count = {count} with processes or a uuid is ambiguous; "
            "list each busy GPU as its own entry",
            field="count",
            value=count,
        )
    return count


def _processes(raw: object, where: str) -> tuple[GpuProcess, ...]:
    if not isinstance(raw, list):
        raise DeclaredNodeError(
            f"{where}: processes = {raw!r} must be a list of {{pid, used}} objects",
            field="processes",
            value=raw,
        )
    processes = []
    for i, item in enumerate(raw):
        place = f"{where}.processes[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("pid"), int):
            raise DeclaredNodeError(
                f"{place}: {item!r} needs an integer 'pid' and a 'used' size",
                field="pid",
                value=item,
            )
        used = _size(item, "used", place, allow_zero=True) if "used" in item else None
        processes.append(GpuProcess(pid=item["pid"], used_bytes=used))
    return tuple(processes)


def _size(entry: dict[str, Any], key: str, where: str, *, allow_zero: bool = False) -> int:
    value = entry[key]
    if isinstance(value, int) and not isinstance(value, bool):
        if value > 0 or (allow_zero and value == 0):
            return value
    elif isinstance(value, str):
        if allow_zero and value.strip() in {"0", "0B", "0GiB"}:
            return 0
        try:
            return parse_size(value, field=f"{where}.{key}")
        except ValueError as e:
            raise DeclaredNodeError(str(e), field=key, value=value) from e
    raise DeclaredNodeError(
        f"{where}: {key} = {value!r} is not a size; give bytes or a size such as 12GiB",
        field=key,
        value=value,
    )
