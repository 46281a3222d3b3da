"""The standalone webhook over real HTTPS: ``gatekeeper webhook --cert --key`` in a
subprocess on 127.0.0.1 (``tests/support/webhook_process.py``, which makes the certificate),
a renewal picked up without a restart, and a fuzz test of random bodies that never yields a
5xx."""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.tls_certs import Authority, issue
from tests.support.webhook_process import start_webhook

FIXTURES = Path(__file__).parents[1] / "fixtures" / "admission"


@dataclass
class Server:
    port: int
    ca: Authority
    cert: Path
    key: Path
    client: httpx.Client
    context: ssl.SSLContext


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("webhook-tls")
    webhook = start_webhook(directory, "--reload-seconds", "0.1")
    context = ssl.create_default_context(cafile=str(webhook.ca.path))
    client = httpx.Client(base_url=webhook.url(""), verify=context, timeout=10)
    try:
        yield Server(webhook.port, webhook.ca, directory / "tls.crt", directory / "tls.key",
                     client, context)  # fmt: skip
    finally:
        client.close()
        webhook.stop()


def test_https_round_trip(server):
    review = json.loads((FIXTURES / "deployment-denied.json").read_text())
    response = server.client.post("/k8s/validate", json=review)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert (body["apiVersion"], body["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    assert body["response"]["uid"] == review["request"]["uid"]
    assert body["response"]["allowed"] is False
    assert "Would fit: --tensor-parallel-size 2" in body["response"]["status"]["message"]
    allowed = server.client.post(
        "/k8s/validate", content=(FIXTURES / "job-allowed.json").read_bytes()
    )
    assert allowed.json()["response"]["allowed"] is True


def test_malformed_over_https_is_a_400(server):
    response = server.client.post("/k8s/validate", content=b"not json")
    assert response.status_code == 400
    assert response.json()["message"].startswith("malformed AdmissionReview: the body is not JSON")


def test_metrics_count_the_reviews(server):
    server.client.post("/k8s/validate", content=(FIXTURES / "pod-denied.json").read_bytes())
    text = server.client.get("/metrics").text
    assert 'gatekeeper_build_info{version="' in text
    denied = next(
        line for line in text.splitlines()
        if line.startswith('gatekeeper_webhook_reviews_total{outcome="denied"}')
    )  # fmt: skip
    assert float(denied.split()[-1]) >= 1


def test_plain_http_is_refused(server):
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{server.port}/healthz", timeout=5)


def _served_serial(server: Server) -> int:
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw,
        server.context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_a_renewed_certificate_is_served_without_a_restart(server):
    before = _served_serial(server)
    renewed = issue(server.ca, server.cert, server.key)
    assert renewed != before
    deadline = time.monotonic() + 10
    while _served_serial(server) != renewed:
        assert time.monotonic() < deadline, "the renewed certificate was not picked up in 10 s"
        time.sleep(0.05)
    assert server.client.get("/healthz").status_code == 200


# -- fuzz ----------------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``good`` nine times in ten, else ``bad``: keeps most examples deep in the webhook."""
    return st.integers(0, 9).flatmap(lambda i: bad if i == 5 else good)


TOKENS = st.sampled_from(
    ["vllm", "serve", "-tp", "--tensor-parallel-size", "-pp", "-dp", "--max-model-len",
     "--max-model-len=32k", "32k", "1.5K", "0", "-1", "auto", "8", "3", "9" * 40, "1e999",
     "--gpu-memory-utilization", "nan", "0.9", "--quantization", "fp8", "awq", "bogus",
     "--kv-cache-dtype", "--dtype", "--enforce-eager", "--no-enforce-eager", "--model",
     "--kv-cache-memory-bytes", "Qwen/Qwen3-8B", "meta-llama/Llama-3.3-70B-Instruct",
     "deepseek-ai/DeepSeek-V3", "sh", "/bin/bash", "-c", "-lc", "&&", ";", "|", "\n",
     "$(MODEL)", "${LEN:-16k}", "-m", "vllm.entrypoints.openai.api_server", "'", '"']
) | st.text(max_size=8)  # fmt: skip
COMMAND = st.lists(TOKENS, max_size=10).map(lambda t: ["vllm", "serve", *t])
SIZES = st.sampled_from(["true", "80GiB", "H100", "NVIDIA-L4", "0", "-1GiB", "1" * 400 + "TiB"])
CONTAINER = st.fixed_dictionaries(
    {"name": st.text(max_size=5), "command": mostly(COMMAND, st.lists(TOKENS, max_size=8) | JSON)},
    optional={
        "args": mostly(st.lists(TOKENS, max_size=8), JSON),
        "image": st.sampled_from(["vllm/vllm-openai:latest", "nginx"]) | JSON,
        "resources": mostly(
            st.fixed_dictionaries({"limits": st.dictionaries(
                st.sampled_from(["nvidia.com/gpu", "cpu"]),
                st.integers(-2, 16) | st.integers(-2, 10**20) | st.text(max_size=4))}),
            JSON,
        ),
        "env": mostly(
            st.lists(st.fixed_dictionaries({"name": st.sampled_from(["MODEL", "VLLM_MODEL", "LEN"]),
                                            "value": TOKENS})),
            JSON,
        ),
    },
)  # fmt: skip
POD_SPEC = st.fixed_dictionaries(
    {"containers": mostly(st.lists(CONTAINER, min_size=1, max_size=3), JSON)},
    optional={
        "nodeSelector": st.dictionaries(st.just("nvidia.com/gpu.product"),
                                        st.sampled_from(["NVIDIA-L4", "Tesla-T4", "bogus"]) | JSON),
        "affinity": JSON,
    },
)  # fmt: skip
TEMPLATE = st.fixed_dictionaries(
    {"spec": mostly(POD_SPEC, JSON)},
    optional={"metadata": st.fixed_dictionaries({"annotations": st.dictionaries(
        st.sampled_from(["vllm-gatekeeper.io/gpu-memory", "vllm-gatekeeper.io/skip",
                         "gatekeeper.io/gpu-memory", "gatekeeper.io/skip"]), SIZES | JSON)})},
)  # fmt: skip
KINDS = st.sampled_from(
    [
        "Pod",
        "Deployment",
        "StatefulSet",
        "ReplicaSet",
        "Job",
        "CronJob",
        "LeaderWorkerSet",
        "Secret",
    ]
)


def _wrap(kind: str, template: dict[str, Any]) -> dict[str, Any]:
    if kind == "Pod":
        return template
    if kind == "CronJob":
        return {"spec": {"jobTemplate": {"spec": {"template": template}}}}
    if kind == "LeaderWorkerSet":
        return {"spec": {"leaderWorkerTemplate": {"leaderTemplate": template, "workerTemplate": template}}}  # fmt: skip
    return {"spec": {"template": template}}


@st.composite
def reviews(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(mostly(KINDS, st.text(max_size=6)))
    obj = draw(mostly(st.builds(_wrap, st.just(kind), TEMPLATE), JSON))
    request = draw(
        st.fixed_dictionaries(
            {"uid": st.text(min_size=1, max_size=10), "kind": st.fixed_dictionaries({"kind": st.just(kind)}),
             "operation": mostly(st.sampled_from(["CREATE", "UPDATE"]), st.sampled_from(["DELETE", "CONNECT", "PATCH"])),
             "object": st.just(obj)},
            optional={"oldObject": mostly(st.builds(_wrap, st.just(kind), TEMPLATE), JSON),
                      "subResource": st.sampled_from(["scale", ""]),
                      "namespace": mostly(st.text(max_size=5), JSON)},
        )
    )  # fmt: skip
    return {
        "apiVersion": draw(mostly(st.just("admission.k8s.io/v1"), st.text(max_size=30))),
        "kind": draw(mostly(st.just("AdmissionReview"), st.text(max_size=4))),
        "request": draw(mostly(st.just(request), JSON)),
    }


def _check(response: httpx.Response, review: object) -> None:
    assert response.status_code < 500, response.text
    body = response.json()
    if response.status_code == 200:
        assert isinstance(review, dict)
        assert body["response"]["uid"] == review["request"]["uid"]
        assert not any("internal error" in w for w in body["response"].get("warnings", []))
    else:
        assert response.status_code == 400 and body["kind"] == "Status", body


FUZZ = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ
@given(review=reviews())
def test_fuzz_admission_reviews_never_yield_a_5xx(server, review):
    _check(server.client.post("/k8s/validate", content=json.dumps(review).encode()), review)


@FUZZ
@given(body=st.binary(max_size=200) | JSON.map(lambda v: json.dumps(v).encode()))
def test_fuzz_random_bodies_never_yield_a_5xx(server, body):
    response = server.client.post("/k8s/validate", content=body)
    assert response.status_code == 400, response.text
    assert response.json()["message"].startswith("malformed AdmissionReview")
