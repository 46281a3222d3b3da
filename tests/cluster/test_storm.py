"""A storm of 200 vLLM workloads applied at once through the mutating webhook (issue 29,
"Bad input and faults": zero over-commit).

Four nodes of eight declared GPUs of four products (H100-80GB, A100-40GB, L40S, L4), each
node's slice published by the node agent's code, labelled and tainted for this module
alone. 200 workloads drawn from the catalog (``bench.cluster_fleet.draw_workloads``: mixed
models, lengths, fp8, TP 1/2/4; three in four Deployments, the rest bare Pods) are created
from 16 threads as fast as the apiserver takes them; ``gatekeeper webhook --mutate``
(``failurePolicy: Fail``) writes each one's memory claim, the controllers make the pods and
claims, the real scheduler allocates and binds. Then, per device, the sum of the
``consumedCapacity`` of its allocated claims, and the sum of the bytes their templates
request (gatekeeper's prediction), never exceed its published capacity; every workload is
placed, pending with the scheduler's reason, or denied with the webhook's. At the end the
module removes its workloads, pods, claims, slices and nodes from the session's cluster.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from lightkube.codecs import from_dict
from lightkube.resources.admissionregistration_v1 import MutatingWebhookConfiguration

from bench.cluster_fleet import (
    draw_workloads,
    fleet,
    manifest,
    set_up,
    start_webhook,
    tear_down,
)
from bench.cluster_fleet import webhook_configuration as configuration
from bench.cluster_storm import DeviceBooks, StormResult, audit, storm, summary
from tests.support.kube_cluster import KubeCluster

pytestmark = pytest.mark.k8s

FLEET = fleet("storm", "storm", ("H100-80GB", "A100-40GB", "L40S", "L4"))
WORKLOADS = 200
HOOK = "gatekeeper-storm"


@pytest.fixture(scope="module")
def stormed(
    kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[StormResult, dict[tuple[str, str], DeviceBooks]]]:
    """The fleet set up, the webhook configured, the storm applied and settled."""
    hook = start_webhook(kube_cluster, tmp_path_factory.mktemp("storm"))
    api = kube_cluster.client()
    try:
        set_up(api, FLEET)
        api.create(from_dict(configuration(HOOK, hook, FLEET.namespace)))
        manifests = [(w, manifest(w, FLEET)) for w in draw_workloads(WORKLOADS)]
        result = storm(kube_cluster.client, FLEET.namespace, manifests, timeout=90)
        yield result, audit(api, FLEET)
    finally:
        api.delete(MutatingWebhookConfiguration, HOOK)
        hook.stop()
        tear_down(api, FLEET)  # 160-odd pending pods would keep the scheduler busy
        api.close()


def test_no_device_is_over_committed(stormed):
    result, books = stormed
    assert len(books) == FLEET.gpus
    over = {key: b for key, b in books.items() if b.over_committed}
    assert not over, over
    used = [b for b in books.values() if b.claims]
    assert used and all(b.predicted > 0 for b in used)  # every claim asked for its bytes
    assert all(b.consumed >= b.predicted for b in used)
    assert not any(b.unreported for b in used)  # the scheduler wrote each consumedCapacity
    # The storm filled the fleet: some workload found no room left.
    assert "pending" in result.outcomes.values()
    print(summary(result, books))


def test_every_workload_is_placed_pending_or_denied_with_a_reason(stormed):
    result, _ = stormed
    counts = Counter(result.outcomes.values())
    assert set(counts) <= {"placed", "pending", "denied"}, (counts, result.reasons)
    assert counts["placed"] > 0
    for name, outcome in result.outcomes.items():
        if outcome == "pending":
            assert "cannot allocate all claims" in result.reasons[name], result.reasons[name]
        if outcome == "denied":
            assert result.reasons[name], name
    placed = [a for a in result.arrivals if result.outcomes[a.workload.name] == "placed"]
    assert all(a.need_bytes for a in placed)  # the webhook's claim, not a whole GPU
    assert len(result.bind_ms) == counts["placed"]  # each bound pod seen by the watch
