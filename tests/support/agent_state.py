"""The node agent's metrics over a fixed state, for the metrics doc, dashboard and alert
tests: the pass that republished one GPU after the other vanished (generation 2), and the
one pod whose claim was on the vanished GPU."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from gatekeeper.cluster.accounting import Allocation, Orphans, orphan_key
from gatekeeper.cluster.agent import PassResult
from gatekeeper.cluster.agent_metrics import AgentCollector

ORPHAN = Allocation("team-a", "qwen-0-vllm-gpus-x7k2p", "gpu-1", 16 * 2**30, ("qwen-0",))
"""The pod on a vanished GPU."""
VANISHED_UUID = "GPU-00000001-aaaa-bbbb-cccc-000000000001"
LAST = PassResult("updated", 2, ("gpu-0",), (), (ORPHAN,))


@dataclass
class AgentState:
    """An agent's state as the collector reads it (``agent_metrics.AgentState``)."""

    last: PassResult | None = LAST
    passes: Counter[str] = field(default_factory=lambda: Counter(created=1, updated=1))
    orphans: Orphans = field(default_factory=lambda: {orphan_key(ORPHAN): (ORPHAN, VANISHED_UUID)})


def agent_registry() -> CollectorRegistry:
    """A registry with the agent's collector over ``AgentState()``."""
    registry = CollectorRegistry()
    registry.register(AgentCollector(AgentState()))
    return registry
