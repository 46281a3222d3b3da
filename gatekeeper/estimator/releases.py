"""Which vLLM releases gatekeeper models, and the warning for one it does not.

Each span of ``accounting.ACCOUNTINGS`` follows one vLLM minor release's source (and the
releases after it, until the next span); every shipped flag table
(``gatekeeper/data/vllm_flags/``) is a release up to the newest span's. A release past the
newest span is still estimated (with the newest span's rules; its flags read with the
newest table), never silently: ``release_warning`` names the release applied, and every
door prints it with the estimate (CLI text and JSON, the admin API, the webhooks'
warnings, ``gatekeeper_vllm_release_info`` on ``/metrics``).
"""

from __future__ import annotations

from gatekeeper.estimator.accounting import ACCOUNTINGS, accounting_for, parse_vllm_version

__all__ = ["newest_modelled_release", "release_modelled", "release_warning"]


def _newest() -> tuple[int, int, int]:
    return max(a.since for a in ACCOUNTINGS)


def newest_modelled_release() -> str:
    """The release whose source the newest accounting span follows (``0.34.0``)."""
    return ".".join(map(str, _newest()))


def release_modelled(release: str) -> bool:
    """Whether ``release`` is one gatekeeper's spans were checked against: its minor
    release is not past the newest span's (a patch release of it is: patch releases do
    not change the accounting, and a span says when one does)."""
    version, _ = parse_vllm_version(release)
    return version[:2] <= _newest()[:2]


def release_warning(release: str) -> str | None:
    """A warning when ``release`` is past the newest modelled release, naming what was
    applied instead; None when it is modelled."""
    if release_modelled(release):
        return None
    newest = newest_modelled_release()
    applied = accounting_for(release)
    return (
        f"vLLM {release} is newer than the newest release gatekeeper models ({newest}): "
        f"estimated with {applied.name}'s rules (vLLM {newest}'s memory accounting) and its "
        f"flags read with vLLM {newest}'s flag table; a change {release} made is not in "
        "this estimate (docs/upgrading-vllm.md: bash scripts/vllm-release.sh "
        f"{release})"
    )
