"""``gatekeeper models``: the embedded catalog, and the models the Hugging Face cache
holds, as ``hf cache ls`` lists them (huggingface_hub's ``scan_cache_dir``), each with
whether gatekeeper can size it and, when not, why (the first line of the error a look-up
gives: no ``config.json``, an unknown architecture, an unsupported quantization).

A cached repo is sized as ``gatekeeper estimate ORG/NAME`` would read it, offline, at
its ``main`` snapshot (else its newest one), never from the catalog: a cached model the
catalog also knows is judged on what the cache holds. ``--json`` is a list, as before:
the catalog's entries (``source: "catalog"``) then the cache's (``source: "hf_cache"``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from gatekeeper.errors import GatekeeperError
from gatekeeper.models.catalog import catalog_entries
from gatekeeper.settings import Settings, model_resolver
from gatekeeper.units import format_gib

__all__ = ["add_parser", "cached_models"]


def add_parser(subparsers: Any) -> None:
    m = subparsers.add_parser(
        "models",
        help="list the embedded catalog and the Hugging Face cache",
        description="List the embedded catalog, then the models in the Hugging Face cache "
        "(as `hf cache ls` does) with whether gatekeeper can size each, and why not.",
    )
    m.add_argument(
        "--download-dir",
        default=None,
        help="the cache to list, as vllm serve's --download-dir (default: HF_HUB_CACHE)",
    )
    m.add_argument("--json", action="store_true", help="print one JSON list")
    m.set_defaults(func=run_models)


def run_models(args: argparse.Namespace, settings: Settings) -> int:
    catalog = [
        {"source": "catalog", "repo_id": e.repo_id, "aliases": list(e.aliases)}
        for e in catalog_entries()
    ]
    cached = cached_models(settings, args.download_dir)
    if args.json:
        print(json.dumps([*catalog, *cached], indent=2))
        return 0
    print("embedded catalog:")
    for e in catalog:
        print(f"  {e['repo_id']:<55} {', '.join(e['aliases'])}")
    print(f"Hugging Face cache ({cached_dir(args.download_dir)}):")
    if not cached:
        print("  (no models)")
    for c in cached:
        verdict = "sizable" if c["sizable"] else f"not sizable: {c['reason']}"
        print(f"  {c['repo_id']:<55} {format_gib(c['size_on_disk_bytes']):>11}  {verdict}")
    return 0


def cached_dir(download_dir: str | None) -> Path:
    """The cache ``download_dir`` names, else huggingface_hub's (``HF_HUB_CACHE``)."""
    from huggingface_hub import constants

    return Path(download_dir or constants.HF_HUB_CACHE).expanduser()


def cached_models(settings: Settings, download_dir: str | None) -> list[dict[str, Any]]:
    """The model repos of the cache, each with the revision sized and the verdict."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    cache = cached_dir(download_dir)
    try:
        info = scan_cache_dir(cache)
    except CacheNotFound:
        return []
    offline = settings.model_copy(update={"allow_network": False})
    out = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        revision = max(repo.revisions, key=lambda r: ("main" in r.refs, r.last_modified))
        # the commit, not a branch: a miss is the cache's, never the catalog's entry
        resolve = model_resolver(offline, revision=revision.commit_hash, download_dir=str(cache))
        reason = None
        try:
            resolve(repo.repo_id)
        except GatekeeperError as e:
            reason = str(e).splitlines()[0]
        out.append(
            {
                "source": "hf_cache",
                "repo_id": repo.repo_id,
                "revision": revision.commit_hash,
                "refs": sorted(revision.refs),
                "size_on_disk_bytes": repo.size_on_disk,
                "path": str(repo.repo_path),
                "sizable": reason is None,
                "reason": reason,
            }
        )
    return out
