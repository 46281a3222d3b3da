"""Only the apiserver can make the mutating webhook act (issue 38 item 2).

A control plane of its own, whose apiserver presents a client certificate to webhooks
(``--admission-control-config-file``: an AdmissionConfiguration whose kubeconfig gives the
certificate for every webhook, user ``*``), and ``gatekeeper webhook --mutate
--client-ca-file CA --health-port PORT`` behind the shipped MutatingWebhookConfiguration
(narrowed to this module's namespace ``mtls``). Then:

- reviews posted without a client certificate, or with one of another CA, are refused at
  the TLS handshake and create nothing (the probe's 120 unauthenticated reviews created
  120 templates); with the apiserver's certificate a review is answered;
- a review of a namespace the configuration's selector leaves out creates nothing, even
  with the certificate;
- a review that would need more templates than ``webhook_max_templates_per_review`` is
  denied before any is created;
- the apiserver, given its certificate, gets its answers: a Deployment created through it
  is mutated.
"""

from __future__ import annotations

import json
import re
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.resource_v1 import ResourceClaimTemplate

from bench.kube_control_plane import KubeCluster, kube_bin_dir, missing_reason, start_cluster
from bench.serve_process import free_port
from bench.tls_certs import issue, make_ca
from bench.webhook_configs import MUTATING, shipped_configuration
from gatekeeper.cluster.claim_annotation import CLAIM_ANNOTATION
from tests.support.polling import wait_for
from tests.support.vllm_workloads import MODEL, deployment
from tests.support.webhook_process import WebhookProcess, start_webhook

pytestmark = pytest.mark.k8s

NAMESPACE = "mtls"
OUTSIDE = "outside"
Pair = tuple[Path, Path]


@dataclass
class Setup:
    cluster: KubeCluster
    api: Client
    webhook: WebhookProcess
    apiserver: Pair
    """The client certificate the apiserver presents (and its key)."""
    stranger: Pair
    """A client certificate of another CA."""
    health_port: int


def _admission_config(directory: Path, cert: Pair) -> Path:
    """An AdmissionConfiguration whose kubeconfig gives ``cert`` to every webhook."""
    kubeconfig = directory / "webhook-kubeconfig.yaml"
    user = {"client-certificate": str(cert[0]), "client-key": str(cert[1])}
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "users": [{"name": "*", "user": user}],
    }))  # fmt: skip
    webhooks = {"apiVersion": "apiserver.config.k8s.io/v1",
                "kind": "WebhookAdmissionConfiguration", "kubeConfigFile": str(kubeconfig)}  # fmt: skip
    path = directory / "admission.yaml"
    path.write_text(yaml.safe_dump({
        "apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
        "plugins": [{"name": name, "configuration": webhooks}
                    for name in ("MutatingAdmissionWebhook", "ValidatingAdmissionWebhook")],
    }))  # fmt: skip
    return path


def _pair(directory: Path, name: str) -> Pair:
    """A client certificate and key from a new CA in ``directory/name``."""
    (directory / name).mkdir()
    ca = make_ca(directory / name)
    pair = (directory / name / "client.crt", directory / name / "client.key")
    issue(ca, *pair, client=True)
    return pair


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    reason = missing_reason(kube_bin_dir())
    if reason is not None:
        pytest.skip(reason)
    directory = tmp_path_factory.mktemp("mtls")
    apiserver, stranger = _pair(directory, "client-ca"), _pair(directory, "stranger-ca")
    (directory / "cluster").mkdir()
    flag = f"--admission-control-config-file={_admission_config(directory, apiserver)}"
    cluster = start_cluster(kube_bin_dir(), directory / "cluster", [flag])
    api = cluster.client()
    webhook = None
    try:
        for name in (NAMESPACE, OUTSIDE):
            api.create(from_dict({"apiVersion": "v1", "kind": "Namespace",
                                  "metadata": {"name": name}}))  # fmt: skip
        (directory / "webhook").mkdir()
        health = free_port()
        webhook = start_webhook(
            directory / "webhook", "--mutate", "--kubeconfig", str(cluster.kubeconfig),
            "--client-ca-file", str(directory / "client-ca" / "ca.crt"),
            "--health-port", str(health), client=apiserver,
        )  # fmt: skip
        config = shipped_configuration(
            MUTATING, webhook.url(""), webhook.ca_bundle, NAMESPACE, "Fail"
        )
        api.create(from_dict(config))
        yield Setup(cluster, api, webhook, apiserver, stranger, health)
    finally:
        if webhook is not None:
            webhook.stop()
        api.close()
        cluster.stop()


def _review(obj: dict[str, Any], namespace: str, uid: str = "u-1") -> dict[str, Any]:
    kind = {"group": "", "version": "v1", "kind": "Pod"}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "kind": kind, "operation": "CREATE",
                        "namespace": namespace, "object": obj}}  # fmt: skip


def _pod(namespace: str, *lengths: int) -> dict[str, Any]:
    containers = [
        {"name": f"vllm-{i}", "image": "vllm/vllm-openai:v0.32.0", "command": ["vllm", "serve"],
         "args": [MODEL, "--max-model-len", str(n)], "resources": {"limits": {"nvidia.com/gpu": 1}}}
        for i, n in enumerate(lengths)
    ]  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": namespace},
            "spec": {"containers": containers}}  # fmt: skip


def _post(setup: Setup, review: dict[str, Any], client: Pair | None) -> dict[str, Any]:
    with httpx.Client(verify=setup.webhook.context(client), timeout=10) as http:
        answer = http.post(setup.webhook.url("/k8s/mutate"), json=review)
    assert answer.status_code == 200, answer.text
    response: dict[str, Any] = answer.json()["response"]
    return response


def _refused_handshake(setup: Setup, client: Pair | None, body: bytes) -> str:
    """A review sent over a TLS connection made with ``client`` (a certificate or none):
    how the server ended the connection where the answer would be (TLS 1.3 finishes the
    client's half of the handshake before the server checks its certificate; uvicorn's
    asyncio transport then drops the connection, or OpenSSL's alert arrives first). No
    byte of HTTP comes back."""
    context = setup.webhook.context(client)
    head = f"POST /k8s/mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    raw = socket.create_connection(("127.0.0.1", setup.webhook.port), timeout=10)
    with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        try:
            tls.sendall(head.encode() + body)
            answer = tls.recv(4096)
        except (ssl.SSLError, ConnectionError) as e:
            return f"{type(e).__name__}: {e}"
    assert answer == b"", f"answered without a client certificate: {answer[:200]!r}"
    return "closed at the handshake, no answer"


def _templates(api: Client, namespace: str) -> list[str]:
    return [t.to_dict()["metadata"]["name"] for t in api.list(ResourceClaimTemplate, namespace=namespace)]  # fmt: skip


def test_a_review_without_the_apiserver_s_certificate_is_refused_at_the_tls_layer(
    setup: Setup,
) -> None:
    refused: list[str] = []
    for i in range(20):
        client = None if i % 2 == 0 else setup.stranger
        body = json.dumps(_review(_pod(NAMESPACE, 4096 + 16 * i), NAMESPACE)).encode()
        refused.append(_refused_handshake(setup, client, body))
        with pytest.raises(httpx.TransportError):  # and as an HTTP client sees it
            _post(setup, _review(_pod(NAMESPACE, 4096 + 16 * i), NAMESPACE), client)
    print(f"without a certificate: {refused[0]}; another CA's: {refused[1]}")
    with httpx.Client(timeout=10) as plain:
        metrics = plain.get(f"http://127.0.0.1:{setup.health_port}/metrics").text
    assert "gatekeeper_webhook_mutations_total" in metrics
    assert not re.search(r"^gatekeeper_webhook_mutations_total\{.*\} [1-9]", metrics, re.M)
    made = _templates(setup.api, NAMESPACE)
    print(f"templates created by 20 unauthenticated reviews: {len(made)}")
    assert made == []
    response = _post(setup, _review(_pod(NAMESPACE, 4096), NAMESPACE), setup.apiserver)
    assert response["allowed"] and response["patch"]
    assert len(_templates(setup.api, NAMESPACE)) == 1
    with httpx.Client(timeout=10) as plain:  # probes and Prometheus: no certificate
        base = f"http://127.0.0.1:{setup.health_port}"
        assert plain.get(f"{base}/healthz").json()["status"] == "ok"
        assert (
            'gatekeeper_webhook_mutations_total{outcome="mutated"} 1.0'
            in plain.get(f"{base}/metrics").text
        )
        assert plain.post(f"{base}/k8s/mutate", json={}).status_code in (404, 405)


def test_a_review_of_a_namespace_the_selector_leaves_out_creates_nothing(setup: Setup) -> None:
    for namespace in (OUTSIDE, "kube-system", "no-such-namespace"):
        response = _post(setup, _review(_pod(namespace, 4096), namespace), setup.apiserver)
        assert response["allowed"] is True and "patch" not in response, response
        (warning,) = response["warnings"]
        print(f"{namespace}: {warning}")
        assert ("is not selected by the namespaceSelector" in warning) or (
            "does not exist" in warning
        )
        if namespace != "no-such-namespace":
            assert _templates(setup.api, namespace) == []


def test_more_templates_than_one_review_may_create_are_denied_before_any(setup: Setup) -> None:
    """The probe's Pod of 2,000 containers made 128 templates; nine vLLM containers of nine
    sizes are one more than ``webhook_max_templates_per_review`` allows."""
    before = _templates(setup.api, NAMESPACE)
    lengths = [2048 * (k + 1) for k in range(9)]
    response = _post(setup, _review(_pod(NAMESPACE, *lengths), NAMESPACE), setup.apiserver)
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert (
        "need at least 9 distinct ResourceClaimTemplates, over the webhook's limit of 8" in message
    )
    assert "templates per review (setting webhook_max_templates_per_review)" in message
    assert _templates(setup.api, NAMESPACE) == before


def test_the_apiserver_with_its_client_certificate_gets_answers(setup: Setup) -> None:
    manifest = deployment("served", NAMESPACE, [MODEL, "--max-model-len", "8192"])
    manifest["spec"]["replicas"] = 0

    def mutated() -> dict[str, Any] | None:
        made: Any = setup.api.create(from_dict(manifest), dry_run=True)
        annotations = made.to_dict()["spec"]["template"]["metadata"].get("annotations") or {}
        return made if CLAIM_ANNOTATION in annotations else None

    wait_for("a dry run mutated through the apiserver", mutated)
    setup.api.create(from_dict(manifest))
    stored = setup.api.get(Deployment, "served", namespace=NAMESPACE).to_dict()
    template = stored["spec"]["template"]
    record = json.loads(template["metadata"]["annotations"][CLAIM_ANNOTATION])
    assert record["vllm"]["template"] in _templates(setup.api, NAMESPACE)
    assert template["spec"]["resourceClaims"][0]["name"] == "vllm-gpus"
