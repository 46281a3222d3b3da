"""Each limit of a review, plus one, through the real apiserver: a denial, never a
fail-open (issue 38 item 1).

``gatekeeper webhook --mutate`` runs as its own process behind the shipped configurations
(their rules and timeouts as shipped, ``failurePolicy: Ignore`` for both, the namespace
selector narrowed to this module's namespace), so that a webhook that timed out or failed
would admit the pod as written and the apiserver's
``apiserver_admission_webhook_fail_open_count`` would move. The limits are the defaults
but the review bytes, set to 256 KiB (``GATEKEEPER_WEBHOOK_MAX_REVIEW_BYTES``) so that a
review one byte over is one the apiserver takes (its own request limit is 3 MiB). First
the mutating webhook answers (it is called first), then, its configuration deleted, the
validating one: each denies a pod one over each limit, naming the limit.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import ApiError, Client
from lightkube.codecs import from_dict
from lightkube.resources.admissionregistration_v1 import (
    MutatingWebhookConfiguration,
    ValidatingWebhookConfiguration,
)
from lightkube.resources.core_v1 import Namespace, Pod

from bench.webhook_configs import MUTATING, VALIDATING, shipped_configuration
from gatekeeper.k8s.limits import ReviewLimits
from tests.support.kube_cluster import KubeCluster
from tests.support.polling import wait_for
from tests.support.vllm_workloads import IMAGE, MODEL
from tests.support.webhook_process import WebhookProcess, start_webhook

pytestmark = pytest.mark.k8s

NAMESPACE = "limits"
REVIEW_BYTES = 256 * 2**10
LIMITS = ReviewLimits(review_bytes=REVIEW_BYTES)
HOOKS = {"admit": "claims.vllm-gatekeeper.io", "validating": "memory.vllm-gatekeeper.io"}


def vllm(args: list[str], name: str = "vllm") -> dict[str, Any]:
    return {"name": name, "image": IMAGE, "command": ["vllm", "serve"], "args": args,
            "resources": {"limits": {"nvidia.com/gpu": 1}}}  # fmt: skip


def pod(name: str, *containers: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"containers": list(containers)}}  # fmt: skip


def line_of(size: int) -> list[str]:
    """Args whose vLLM line (``vllm``, ``serve`` and these) is ``size`` bytes."""
    base = [MODEL, "--max-model-len", "8192", "--served-model-name"]
    return [*base, "m" * (size - sum(len(w) for w in ["vllm", "serve", *base]))]


def over_each_limit() -> dict[str, tuple[dict[str, Any], str]]:
    """A pod one over each limit but the review's bytes, and the limit's name."""
    flags = ["--max-num-seqs", "4"] * LIMITS.flags_per_line
    plain = [{"name": f"c{i}", "image": "busybox"} for i in range(LIMITS.containers_per_pod)]
    return {
        "line": (pod("line", vllm(line_of(LIMITS.line_bytes + 1))), "command-line bytes"),
        "flags": (pod("flags", vllm([MODEL, *flags, "--enforce-eager"])), "flags per line"),
        "containers": (pod("containers", vllm([MODEL]), *plain), "containers per pod"),
    }


def padded(size: int) -> dict[str, Any]:
    """A vLLM pod whose review is about ``size`` bytes larger, padded in a container that
    runs no vLLM (the mutating configuration sends only objects that name vLLM)."""
    env = [{"name": "PAD", "value": "p" * size}]
    return pod("padded", vllm([MODEL]), {"name": "c", "image": "busybox", "env": env})


def fail_opens(cluster: KubeCluster) -> dict[str, float]:
    text = cluster.get("/metrics").decode()
    out = {}
    for kind, name in HOOKS.items():
        pattern = rf'^apiserver_admission_webhook_fail_open_count\{{name="{re.escape(name)}",type="{kind}"\}} (\S+)$'  # fmt: skip
        found = re.search(pattern, text, re.MULTILINE)
        out[name] = float(found.group(1)) if found else 0.0
    return out


def refusal(api: Client, manifest: dict[str, Any], dry_run: bool = False) -> ApiError | None:
    try:
        api.create(from_dict(manifest), dry_run=dry_run)
    except ApiError as e:
        return e
    return None


@pytest.fixture(scope="module")
def api(kube_cluster: KubeCluster) -> Iterator[Client]:
    client = kube_cluster.client()
    client.create(from_dict({"apiVersion": "v1", "kind": "Namespace",
                             "metadata": {"name": NAMESPACE}}))  # fmt: skip
    yield client
    for kind, path in ((MutatingWebhookConfiguration, MUTATING),
                       (ValidatingWebhookConfiguration, VALIDATING)):  # fmt: skip
        name = shipped_configuration(path, "", "", NAMESPACE, "Ignore")["metadata"]["name"]
        try:
            client.delete(kind, name)
        except ApiError as e:
            if e.status.code != 404:
                raise
    for found in client.list(Pod, namespace=NAMESPACE):
        client.delete(Pod, found.to_dict()["metadata"]["name"], namespace=NAMESPACE)
    client.delete(Namespace, NAMESPACE)
    client.close()


@pytest.fixture(scope="module")
def webhook(
    kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WebhookProcess]:
    started = start_webhook(
        tmp_path_factory.mktemp("webhook-limits"),
        "--mutate",
        "--kubeconfig",
        str(kube_cluster.kubeconfig),
        env={"GATEKEEPER_WEBHOOK_MAX_REVIEW_BYTES": str(REVIEW_BYTES)},
    )
    yield started
    started.stop()


def _denied_by(api: Client, manifest: dict[str, Any], hook: str, text: str) -> tuple[str, float]:
    """Creates ``manifest``: refused by ``hook`` with ``text``; the message and seconds."""
    start = time.monotonic()
    refused = refusal(api, manifest)
    seconds = time.monotonic() - start
    assert refused is not None, f"{manifest['metadata']['name']} was admitted"
    message = str(refused.status.message)
    assert refused.status.code in (403, 413), message  # 413: the review bytes
    assert f'admission webhook "{hook}" denied the request' in message and text in message
    return message, seconds


def _review_bytes_exactly(api: Client, hook: str) -> None:
    """A pod whose review is the limit plus one is denied, naming its size; at the limit
    it is admitted. The review's size is read from a first denial, then matched."""
    first, _ = _denied_by(api, padded(REVIEW_BYTES), hook, "review bytes")
    size = int(re.search(r"the review is (\d+) bytes", first).group(1))  # type: ignore[union-attr]
    over = padded(REVIEW_BYTES + (REVIEW_BYTES + 1 - size))
    message, seconds = _denied_by(api, over, hook, f"the review is {REVIEW_BYTES + 1} bytes")
    print(f"{hook}: review bytes + 1 denied in {seconds * 1000:.0f} ms: {message}")
    at = refusal(api, padded(REVIEW_BYTES + (REVIEW_BYTES - size)))
    if at is None:
        api.delete(Pod, "padded", namespace=NAMESPACE, grace_period=0)
    else:  # the validating webhook, called after, reads a review of a few more bytes
        assert hook not in str(at.status.message) and "review bytes" in str(at.status.message)


def _each_limit(cluster: KubeCluster, api: Client, hook: str) -> None:
    before = fail_opens(cluster)
    for name, (manifest, limit) in over_each_limit().items():
        message, seconds = _denied_by(api, manifest, hook, limit)
        print(f"{hook}: {name} + 1 denied in {seconds * 1000:.0f} ms: {message[:300]}")
    _review_bytes_exactly(api, hook)
    assert fail_opens(cluster) == before


def test_the_mutating_webhook_denies_each_limit_plus_one(
    kube_cluster: KubeCluster, api: Client, webhook: WebhookProcess
) -> None:
    for path in (MUTATING, VALIDATING):
        config = shipped_configuration(
            path, webhook.url(""), webhook.ca_bundle, NAMESPACE, "Ignore"
        )
        api.create(from_dict(config))
    line, _ = over_each_limit()["line"]
    wait_for(
        "the mutating webhook's denial",
        lambda: (e := refusal(api, line, dry_run=True)) and HOOKS["admit"] in str(e.status.message),
    )
    _each_limit(kube_cluster, api, HOOKS["admit"])
    # at the byte limit, read and mutated
    assert refusal(api, pod("at-limit", vllm(line_of(LIMITS.line_bytes)))) is None
    made = api.get(Pod, "at-limit", namespace=NAMESPACE).to_dict()
    assert made["spec"]["resourceClaims"][0]["name"] == "vllm-gpus"


def test_the_validating_webhook_denies_each_limit_plus_one(
    kube_cluster: KubeCluster, api: Client, webhook: WebhookProcess
) -> None:
    name = shipped_configuration(MUTATING, "", "", NAMESPACE, "Ignore")["metadata"]["name"]
    api.delete(MutatingWebhookConfiguration, name)
    line, _ = over_each_limit()["line"]
    wait_for(
        "the validating webhook's denial",
        lambda: (
            (e := refusal(api, line, dry_run=True)) and HOOKS["validating"] in str(e.status.message)
        ),
    )
    _each_limit(kube_cluster, api, HOOKS["validating"])
