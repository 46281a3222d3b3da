"""The decision lines' logger: one name for every door that decides (the webhooks'
decisions, ``gatekeeper.k8s.decisions``; the sidecar's rejections,
``gatekeeper.sidecar.rejection``; the claims kube-scheduler cannot allocate,
``gatekeeper.cluster.allocation_events``). Their fields ride as logging's
``extra={"fields": {...}}``; ``gatekeeper.sidecar.logs`` writes them as JSON keys or
``logfmt`` pairs. Imports nothing of gatekeeper's.
"""

from __future__ import annotations

import logging

__all__ = ["DECISIONS_LOGGER", "decisions"]

DECISIONS_LOGGER = "gatekeeper.decisions"
"""The logger's name, which operators filter on."""
decisions = logging.getLogger(DECISIONS_LOGGER)
