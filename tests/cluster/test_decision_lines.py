"""Both webhooks say each decision on a vLLM workload (issue 39 item 2): one JSON line on
``gatekeeper.decisions`` (the workload, the container, the model, the sizing, the verdict,
the reason) and the estimate as the response's ``auditAnnotations``. One ``gatekeeper
webhook --mutate --log-format json`` process over TLS on loopback, with the session's
apiserver for its claim templates; the reviews are posted to it as the apiserver posts
them, and its lines read back from its log. About 2 s beside the session's control plane.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from lightkube.codecs import from_dict

from tests.support.kube_cluster import KubeCluster, mutating_route
from tests.support.polling import wait_for
from tests.support.vllm_workloads import APPS, MODEL, deployment
from tests.support.webhook_process import WebhookProcess, start_webhook

pytestmark = pytest.mark.k8s

NAMESPACE = "decision-lines"
CONFIGURATION = "decision-lines"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "admission"


@pytest.fixture(scope="module")
def webhook(
    kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WebhookProcess]:
    """The webhook, with the namespace and the shipped MutatingWebhookConfiguration sending
    the namespace's workloads to it (removed at the end)."""
    directory = tmp_path_factory.mktemp("decision-lines")
    running = start_webhook(directory, "--mutate", "--kubeconfig", str(kube_cluster.kubeconfig),
                            "--log-format", "json")  # fmt: skip
    api = kube_cluster.client()
    try:
        with mutating_route(api, CONFIGURATION, running, NAMESPACE):
            yield running
    finally:
        api.close()
        running.stop()


def _post(webhook: WebhookProcess, path: str, review: dict[str, Any]) -> dict[str, Any]:
    with httpx.Client(verify=webhook.context(), timeout=30) as client:
        answer = client.post(webhook.url(path), json=review)
    assert answer.status_code == 200, answer.text
    response: dict[str, Any] = answer.json()["response"]
    return response


def _line(webhook: WebhookProcess, which: str, name: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        for text in webhook.log.read_text(errors="replace").splitlines():
            if not text.startswith("{"):
                continue
            line: dict[str, Any] = json.loads(text)
            if line.get("webhook") == which and line.get("name") == name:
                return line
        return None

    return wait_for(f"the {which} webhook's line on {name}", found, timeout_seconds=10)


def test_a_denial_is_logged_and_audited(webhook: WebhookProcess) -> None:
    review = json.loads((FIXTURES / "deployment-denied.json").read_text())
    response = _post(webhook, "/k8s/validate", review)
    assert response["allowed"] is False
    audit = response["auditAnnotations"]
    line = _line(webhook, "validating", "llama")
    assert line["logger"] == "gatekeeper.decisions" and line["level"] == "WARNING"
    assert (line["event"], line["verdict"], line["kind"], line["namespace"]) == (
        "webhook_decision", "denied", "Deployment", "ml-serving"
    )  # fmt: skip
    assert (line["container"], line["model"]) == ("vllm", "meta-llama/Llama-3.3-70B-Instruct")
    assert (line["ranks"], line["max_model_len"], line["sequences"]) == (1, 32768, 1)
    assert line["bytes_per_rank"] > 79 * 2**30  # more than an H100 holds
    assert line["reason"] == response["status"]["message"]
    assert audit == {
        "verdict": "denied",
        "model": "meta-llama/Llama-3.3-70B-Instruct",
        "estimate-bytes-per-rank": str(line["bytes_per_rank"]),
        "ranks": "1",
        "sized-for": "1 sequence of 32768 tokens",
        "gpu": line["gpu"],
    }


def test_an_allowed_workload_is_audited_with_its_estimate(webhook: WebhookProcess) -> None:
    review = json.loads((FIXTURES / "job-allowed.json").read_text())
    response = _post(webhook, "/k8s/validate", review)
    assert response["allowed"] is True
    line = _line(webhook, "validating", review["request"]["object"]["metadata"]["name"])
    assert line["verdict"] == "allowed" and line["level"] == "INFO"
    audit = response["auditAnnotations"]
    assert audit["verdict"] == "allowed"
    assert audit["estimate-bytes-per-rank"] == str(line["bytes_per_rank"])
    assert audit["sized-for"] == f"1 sequence of {line['max_model_len']} tokens"


def test_a_mutation_through_the_apiserver_is_logged_and_audited(
    webhook: WebhookProcess, kube_cluster: KubeCluster
) -> None:
    """The apiserver sends the Deployment's review (no replicas: no pod to schedule); the
    same review posted again shows the response's annotations."""
    manifest = deployment("logged", NAMESPACE, [MODEL, "--max-model-len", "8192", "-tp", "2"])
    manifest["spec"]["replicas"] = 0
    api = kube_cluster.client()
    try:
        api.create(from_dict(manifest))
    finally:
        api.close()
    line = _line(webhook, "mutating", "logged")
    assert line["logger"] == "gatekeeper.decisions" and line["level"] == "INFO"
    assert (line["verdict"], line["kind"], line["namespace"]) == (
        "mutated",
        "Deployment",
        NAMESPACE,
    )
    assert (line["container"], line["model"]) == ("vllm", MODEL)
    assert (line["ranks"], line["max_model_len"]) == (2, 8192)
    assert line["sequences"] >= 1 and line["bytes_per_rank"] > 0
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "decision-lines-1", "kind": {**APPS, "kind": "Deployment"},
                    "operation": "CREATE", "namespace": NAMESPACE, "object": manifest,
                    "dryRun": True},
    }  # fmt: skip
    response = _post(webhook, "/k8s/mutate", review)
    assert response["allowed"] is True and response.get("patchType") == "JSONPatch", response
    sequences = line["sequences"]
    assert response["auditAnnotations"] == {
        "verdict": "mutated",
        "model": MODEL,
        "estimate-bytes-per-rank": str(line["bytes_per_rank"]),
        "ranks": "2",
        "sized-for": f"{sequences} sequence{'s' if sequences != 1 else ''} of 8192 tokens",
        "gpu": line["gpu"],
    }
