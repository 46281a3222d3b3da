"""The mutating webhook's template store and its sweep against the real apiserver
(``kube_cluster``), counted by the apiserver's own ``apiserver_request_total``: a template
the watch holds is ensured and read with no request; 16 reviews ensuring the same new
template at once make one create; a template made elsewhere (409) is taken when it holds
the spec and refused, naming it, when it does not; the sweep deletes what no object names
once the grace period has passed, keeps what a Deployment, a Pod or a recent use names, and
a review after a deletion creates the template again."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from lightkube import ApiError, Client
from lightkube.codecs import from_dict
from lightkube.resources.resource_v1 import ResourceClaimTemplate
from prometheus_client.parser import text_string_to_metric_families

from gatekeeper.cluster import DRIVER_NAME
from gatekeeper.cluster.claims import claim_template
from gatekeeper.errors import GatekeeperError
from gatekeeper.k8s.template_stamps import USED_ANNOTATION
from gatekeeper.k8s.template_store import ApiTemplateStore, template_key
from gatekeeper.k8s.template_sweep import TemplateSweep
from tests.support.kube_cluster import KubeCluster, namespace_client

NAMESPACE = "template-store"
HOUR = 3600.0
NOW = [time.time()]
"""The store's and the sweeps' clock (seconds since the epoch), moved on by the tests."""


def spec(memory: str) -> dict[str, Any]:
    request = {"deviceClassName": DRIVER_NAME, "capacity": {"requests": {"memory": memory}}}
    return {"spec": {"devices": {"requests": [{"name": "rank0", "exactly": request}]}}}


def template(memory: str) -> dict[str, Any]:
    return claim_template(NAMESPACE, spec(memory))


@pytest.fixture(scope="module")
def api(kube_cluster: KubeCluster) -> Iterator[Client]:
    with namespace_client(kube_cluster, NAMESPACE) as client:
        yield client


@pytest.fixture(scope="module")
def store(kube_cluster: KubeCluster, api: Client) -> Iterator[ApiTemplateStore]:
    client = kube_cluster.client()
    started = ApiTemplateStore(client, clock=lambda: NOW[0]).start()
    waited(lambda: started.watch is not None and started.watch.synced, "the first list")
    yield started
    started.stop()
    client.close()


def waited(check: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.01)


def requests_made(cluster: KubeCluster) -> dict[str, int]:
    """The apiserver's count of requests on resourceclaimtemplates, by verb (its
    ``apiserver_request_total`` lines alone parsed: the whole text takes seconds)."""
    lines = [
        line
        for line in cluster.get("/metrics").decode().splitlines()
        if line.startswith("apiserver_request_total{") and '"resourceclaimtemplates"' in line
    ]
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            if sample.labels.get("resource") == "resourceclaimtemplates":
                verb = sample.labels["verb"]
                counts[verb] = counts.get(verb, 0) + int(sample.value)
    return counts


def difference(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    verbs = set(before) | set(after)
    return {
        v: after.get(v, 0) - before.get(v, 0) for v in verbs if after.get(v, 0) != before.get(v, 0)
    }


def held(store: ApiTemplateStore, made: dict[str, Any]) -> None:
    assert store.watch is not None
    watch = store.watch
    waited(lambda: watch.get(template_key(made)) is not None, "the template in the watch")


def test_a_watched_template_is_ensured_and_read_without_a_request(
    kube_cluster: KubeCluster, api: Client, store: ApiTemplateStore
) -> None:
    made = template("10Gi")
    api.create(from_dict(made))  # by another replica, say
    held(store, made)
    before = requests_made(kube_cluster)
    for _ in range(20):
        store.ensure(made)
        assert store.read(NAMESPACE, made["metadata"]["name"]) is not None
    assert difference(before, requests_made(kube_cluster)) == {}


def test_concurrent_reviews_of_one_new_template_create_it_once(
    kube_cluster: KubeCluster, store: ApiTemplateStore
) -> None:
    made = template("11Gi")
    before = requests_made(kube_cluster)
    gate = threading.Barrier(16)
    errors: list[BaseException] = []

    def review() -> None:
        gate.wait()
        try:
            store.ensure(made)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=review) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert difference(before, requests_made(kube_cluster)) == {"POST": 1}


def test_a_template_made_elsewhere_is_taken_when_it_holds_the_spec(
    kube_cluster: KubeCluster, api: Client, store: ApiTemplateStore
) -> None:
    elsewhere = ApiTemplateStore(api)  # not watching: it meets the 409
    made = template("12Gi")
    api.create(from_dict(made))
    before = requests_made(kube_cluster)
    elsewhere.ensure(made)
    assert difference(before, requests_made(kube_cluster)) == {"POST": 1, "GET": 1}


def test_another_spec_under_the_name_is_refused_naming_it(api: Client) -> None:
    made = template("13Gi")
    squatted = {**made, "spec": spec("1Gi")}  # the name of one spec, another spec
    api.create(from_dict(squatted))
    with pytest.raises(GatekeeperError) as raised:
        ApiTemplateStore(api).ensure(made)
    assert raised.value.field == "resourceclaimtemplates"
    assert f"ResourceClaimTemplate {NAMESPACE}/{made['metadata']['name']} exists with " in str(
        raised.value
    )


def workload(kind: str, name: str, template_name: str) -> dict[str, Any]:
    container = {"name": "c", "image": "i", "resources": {"claims": [{"name": "gpus"}]}}
    pod_spec = {
        "containers": [container],
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template_name}],
    }
    metadata = {"name": name, "namespace": NAMESPACE}
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}
    labels = {"app": name}
    body = {
        "replicas": 0,  # no pods: the Deployment alone names the template
        "selector": {"matchLabels": labels},
        "template": {"metadata": {"labels": labels}, "spec": pod_spec},
    }
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata, "spec": body}


def present(api: Client, made: dict[str, Any]) -> bool:
    try:
        api.get(ResourceClaimTemplate, made["metadata"]["name"], namespace=NAMESPACE)
    except ApiError as e:
        assert e.status.code == 404
        return False
    return True


def test_the_sweep_deletes_only_what_nothing_names_after_the_grace_period(
    api: Client, store: ApiTemplateStore
) -> None:
    by_deployment, by_pod, unnamed, used = (template(f"{n}Gi") for n in (20, 21, 22, 23))
    for made in (by_deployment, by_pod, unnamed, used):
        api.create(from_dict(made))
        held(store, made)
    api.create(from_dict(workload("Deployment", "keeps", by_deployment["metadata"]["name"])))
    api.create(from_dict(workload("Pod", "keeps", by_pod["metadata"]["name"])))
    sweep = TemplateSweep(api, store, grace_seconds=HOUR, clock=lambda: NOW[0])
    assert sweep.sweep() == []  # all created within the grace period

    NOW[0] += 2 * HOUR
    store.ensure(used)  # a review names it: its stale stamp is written again
    stamped = api.get(ResourceClaimTemplate, used["metadata"]["name"], namespace=NAMESPACE)
    assert stamped.metadata is not None
    assert USED_ANNOTATION in (stamped.metadata.annotations or {})
    deleted = sweep.sweep()
    assert template_key(unnamed) in deleted and not present(api, unnamed)
    for kept in (by_deployment, by_pod, used):
        assert template_key(kept) not in deleted and present(api, kept)
    assert sweep.deleted == len(deleted)


def test_a_review_after_the_sweep_creates_the_template_again(
    kube_cluster: KubeCluster, api: Client, store: ApiTemplateStore
) -> None:
    made = template("30Gi")
    api.create(from_dict(made))
    held(store, made)
    NOW[0] += 2 * HOUR
    assert template_key(made) in TemplateSweep(api, store, clock=lambda: NOW[0]).sweep()
    before = requests_made(kube_cluster)
    store.ensure(made)  # at once: the watch may still hold it
    assert present(api, made)
    assert difference(before, requests_made(kube_cluster)).get("POST") == 1
