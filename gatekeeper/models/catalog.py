"""The embedded catalog: popular open models' ``config.json`` shipped in the package.

One JSON file per model in ``gatekeeper/catalog/``: ``repo_id``, ``aliases``,
``provenance`` (where the values come from), ``parameters`` (published count, when
known) and ``config``. Lookup ignores case and accepts aliases such as ``llama3.1:8b``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

__all__ = ["CatalogEntry", "catalog_entries", "find_in_catalog"]


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    repo_id: str
    aliases: tuple[str, ...]
    provenance: str
    parameters: int | None
    config: dict[str, Any]


@cache
def catalog_entries() -> tuple[CatalogEntry, ...]:
    """Every catalog entry, sorted by repo id."""
    folder = resources.files("gatekeeper").joinpath("catalog")
    entries = []
    for item in folder.iterdir():
        if not item.name.endswith(".json"):
            continue
        raw = json.loads(item.read_text())
        entries.append(
            CatalogEntry(
                repo_id=raw["repo_id"],
                aliases=tuple(raw.get("aliases", ())),
                provenance=raw.get("provenance", ""),
                parameters=raw.get("parameters"),
                config=raw["config"],
            )
        )
    return tuple(sorted(entries, key=lambda e: e.repo_id.lower()))


@cache
def _index() -> dict[str, CatalogEntry]:
    index: dict[str, CatalogEntry] = {}
    for entry in catalog_entries():
        for key in (entry.repo_id, entry.repo_id.split("/")[-1], *entry.aliases):
            index.setdefault(key.lower(), entry)
    return index


def find_in_catalog(reference: str) -> CatalogEntry | None:
    """The catalog entry for a repo id, its bare name or an alias (case-insensitive)."""
    return _index().get(reference.strip().lower())
