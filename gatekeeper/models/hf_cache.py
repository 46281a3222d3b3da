"""Models in the Hugging Face cache, found offline as vLLM finds them.

The cache is ``huggingface_hub``'s layout: ``CACHE/models--ORG--NAME/`` holds
``refs/BRANCH`` (a file with the commit hash), ``snapshots/COMMIT/`` (the files, links
into ``blobs/``) and ``.no_exist/COMMIT/FILE`` (files known to be missing). ``CACHE`` is
vLLM's ``--download-dir`` when given, else ``huggingface_hub``'s ``HF_HUB_CACHE``
(``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``).

The look-up is ``huggingface_hub.try_to_load_from_cache(repo, "config.json",
revision=...)``: the call vLLM's ``file_or_path_exists`` and ``try_get_local_file``
(``vllm/transformers_utils/repo_utils.py``) and transformers' offline loading make for
the config. It resolves a branch or tag through ``refs/`` and takes a commit hash as
is, touches no network, and reads no file but the ref. ``snapshot_download(
local_files_only=True)`` would answer the same folder but refuses a snapshot whose
cached tree listing names files not downloaded (the weights, when only the config was
fetched), and ``scan_cache_dir`` walks every repo of the cache; neither is needed to
read one config. The snapshot folder is then read as a local checkpoint directory.

Before importing ``huggingface_hub``'s download module (about 0.2 s), the repo's folder
is looked for with ``os.path``: a model that is not cached costs one ``stat``, which
keeps the catalog's fast path fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gatekeeper.errors import ModelSpecError

__all__ = [
    "DEFAULT_REVISION",
    "CachedSnapshot",
    "cache_dirs",
    "find_cached",
    "hf_download_hint",
    "is_offline",
    "looks_like_repo_id",
    "repo_folder",
    "snapshot_repo_id",
]

DEFAULT_REVISION = "main"


@dataclass(frozen=True, slots=True)
class CachedSnapshot:
    """One revision of a repo found in a cache."""

    repo_id: str
    revision: str
    """What was asked for (a branch, a tag or a commit; ``main`` by default)."""
    commit: str
    directory: Path
    """``CACHE/models--ORG--NAME/snapshots/COMMIT``."""


def cache_dirs(download_dir: str | None = None) -> tuple[Path, ...]:
    """Where vLLM looks: ``--download-dir`` (weights and the JSON files vLLM fetches
    there), then the default cache (where vLLM reads ``config.json`` from)."""
    from huggingface_hub import constants  # a light module; read at call time

    default = Path(constants.HF_HUB_CACHE).expanduser()
    if download_dir:
        own = Path(download_dir).expanduser()
        return (own,) if own == default else (own, default)
    return (default,)


def hf_download_hint(repo_id: str, revision: str | None) -> str:
    """The ``hf download`` command that fetches ``repo_id``'s config.json (huggingface_hub's
    CLI; ``huggingface-cli`` no longer installs with it), naming a revision other than
    the default branch."""
    at = f" --revision {revision}" if revision and revision != DEFAULT_REVISION else ""
    return f"hf download {repo_id} config.json{at}"


def repo_folder(cache: Path, repo_id: str) -> Path:
    """``CACHE/models--ORG--NAME`` (``huggingface_hub``'s ``repo_folder_name``)."""
    from huggingface_hub import constants

    sep = constants.REPO_ID_SEPARATOR
    return cache / sep.join(("models", *repo_id.split("/")))


def looks_like_repo_id(reference: str) -> bool:
    """``ORG/NAME`` with no path parts: what the hub and the cache can hold."""
    parts = reference.split("/")
    return len(parts) == 2 and all(p and p not in (".", "..") for p in parts)


def find_cached(
    repo_id: str, *, revision: str | None = None, download_dir: str | None = None
) -> CachedSnapshot | None:
    """The cached snapshot of ``repo_id`` at ``revision`` that holds ``config.json``;
    None when the repo is in no cache. Raises ``ModelSpecError`` when the repo is cached
    but not at that revision, or its snapshot has no ``config.json``."""
    if not looks_like_repo_id(repo_id):
        return None
    caches = [c for c in cache_dirs(download_dir) if repo_folder(c, repo_id).is_dir()]
    if not caches:
        return None
    from huggingface_hub import try_to_load_from_cache

    wanted = revision or DEFAULT_REVISION
    for cache in caches:
        found = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache, revision=wanted)
        if isinstance(found, str):
            directory = Path(found).parent
            return CachedSnapshot(repo_id, wanted, directory.name, directory)
    raise _not_at_revision(repo_id, wanted, caches)


def _not_at_revision(repo_id: str, revision: str, caches: list[Path]) -> ModelSpecError:
    """Why a cached repo gave no config: the revision is not cached, or its snapshot
    lacks ``config.json``."""
    cached: list[str] = []
    for cache in caches:
        folder = repo_folder(cache, repo_id)
        commit = _commit_of(folder, revision)
        if commit is not None and (folder / "snapshots" / commit).is_dir():
            return ModelSpecError(
                f"model: {repo_id} at revision {revision!r} is in the Hugging Face cache "
                f"({folder / 'snapshots' / commit}) without config.json; vLLM cannot load it "
                "from there. Download its config "
                f"({hf_download_hint(repo_id, revision)}), or give a checkpoint directory",
                field="config.json",
                value=repo_id,
            )
        cached += _revisions(folder)
    listed = ", ".join(sorted(set(cached))) or "none"
    return ModelSpecError(
        f"model: {repo_id} is in the Hugging Face cache ({', '.join(map(str, caches))}) but "
        f"not at revision {revision!r} (cached: {listed}). Pass one of those with "
        f"--revision, or download that revision while online",
        field="revision",
        value=revision,
    )


def _commit_of(folder: Path, revision: str) -> str | None:
    ref = folder / "refs" / revision
    if ref.is_file():
        return ref.read_text().strip()
    return revision if (folder / "snapshots" / revision).is_dir() else None


def _revisions(folder: Path) -> list[str]:
    """``branch -> commit`` for each ref, and each snapshot's commit."""
    out: list[str] = []
    refs = folder / "refs"
    named: set[str] = set()
    if refs.is_dir():
        for ref in sorted(p for p in refs.rglob("*") if p.is_file()):
            commit = ref.read_text().strip()
            named.add(commit)
            out.append(f"{ref.relative_to(refs).as_posix()} -> {commit[:12]}")
    snapshots = folder / "snapshots"
    if snapshots.is_dir():
        out += [p.name for p in sorted(snapshots.iterdir()) if p.name not in named]
    return out


def is_offline() -> bool:
    """``HF_HUB_OFFLINE`` as ``huggingface_hub`` read it (vLLM reads the same constant)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def snapshot_repo_id(directory: Path) -> str | None:
    """``ORG/NAME`` when ``directory`` is a cache snapshot (``models--ORG--NAME/snapshots/
    COMMIT``), so that a snapshot given as a path is named as its repo, not its hash."""
    parts = directory.resolve().parts if directory.exists() else directory.parts
    if len(parts) < 3 or parts[-2] != "snapshots" or not parts[-3].startswith("models--"):
        return None
    repo = parts[-3].removeprefix("models--").replace("--", "/", 1)
    return repo if looks_like_repo_id(repo) else None
