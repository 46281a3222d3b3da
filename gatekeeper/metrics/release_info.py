"""``gatekeeper_vllm_release_info``: the vLLM release the sidecar sizes workers for, and
whether gatekeeper models it.

Labels: ``release`` (the configured ``default_vllm_version``), ``accounting`` (the span of
the estimator's rules applied to it), ``flag_table`` (the release whose flag table reads its
flags), ``newest_modelled`` and ``modelled`` (``"false"`` for a release past the newest
modelled one: its estimates carry ``releases.release_warning``, and the alert
``GatekeeperVllmReleaseNotModelled`` fires).
"""

from __future__ import annotations

from prometheus_client import Info
from prometheus_client.registry import CollectorRegistry

from gatekeeper.estimator.accounting import accounting_for
from gatekeeper.estimator.releases import newest_modelled_release, release_modelled
from gatekeeper.vllm.table import flag_table

__all__ = ["register_release_info", "release_labels"]


def release_labels(release: str) -> dict[str, str]:
    """The info's labels for ``release``."""
    return {
        "release": release,
        "accounting": accounting_for(release).name,
        "flag_table": flag_table(release).vllm,
        "newest_modelled": newest_modelled_release(),
        "modelled": "true" if release_modelled(release) else "false",
    }


def register_release_info(registry: CollectorRegistry, release: str) -> None:
    """``gatekeeper_vllm_release_info`` on ``registry`` for the configured ``release``."""
    Info(
        "gatekeeper_vllm_release",
        "The vLLM release workers are sized for, the rules and flag table applied to it, "
        "and whether gatekeeper models it.",
        registry=registry,
    ).info(release_labels(release))
