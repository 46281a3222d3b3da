"""``GET /metrics`` negotiates as Prometheus expects, on the real sidecar and the real
webhook app (both on 127.0.0.1 under uvicorn): OpenMetrics for
``Accept: application/openmetrics-text``, the text format 0.0.4 otherwise, a gzip body for
``Accept-Encoding: gzip``. The real Prometheus's side (it asks for OpenMetrics and gzip,
and stores the OpenMetrics types) is checked in test_worker_discovery.py."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, Info

from gatekeeper.k8s.server import build_webhook_app, webhook_from_settings
from gatekeeper.settings import Settings
from tests.support.fake_upstream import serve_in_thread
from tests.support.sidecar_harness import running_sidecar, settings_for

FIXTURES = Path(__file__).parents[1] / "fixtures" / "admission"
OPENMETRICS = "application/openmetrics-text"
# What Prometheus 2.42 sends (scrape/scrape.go, scrapeAcceptHeader and acceptEncodingHeader).
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


@pytest.fixture(scope="module")
def sidecar_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_sidecar(settings_for(tmp_path_factory.mktemp("sidecar"))) as sc:
        yield sc.url


@pytest.fixture(scope="module")
def webhook_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``build_webhook_app`` wired as ``gatekeeper webhook`` wires it (cli/webhook.py),
    over plain HTTP, after one denied review."""
    registry = CollectorRegistry()
    Info("gatekeeper_build", "gatekeeper's version.", registry=registry).info({"version": "t"})
    settings = Settings(state_dir=tmp_path_factory.mktemp("webhook"))
    webhook = webhook_from_settings(settings, registry=registry)
    with serve_in_thread(build_webhook_app(webhook, registry)) as url:
        review = (FIXTURES / "pod-denied.json").read_bytes()
        assert httpx.post(f"{url}/k8s/validate", content=review).status_code == 200
        yield url


def scrape(url: str, accept: str, encoding: str) -> tuple[httpx.Response, bytes]:
    """``GET url/metrics``; the response and its body as sent (not decoded)."""
    headers = {"Accept": accept, "Accept-Encoding": encoding}
    with httpx.stream("GET", f"{url}/metrics", headers=headers, timeout=30) as r:
        raw = b"".join(r.iter_raw())
    assert r.status_code == 200, raw[:300]
    return r, raw


@pytest.fixture(params=["sidecar", "webhook"])
def url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(f"{request.param}_url"))


def test_a_plain_scrape_gets_the_text_format_uncompressed(url):
    r, raw = scrape(url, "*/*", "identity")
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "content-encoding" not in r.headers
    assert b"# TYPE gatekeeper_build_info gauge\n" in raw
    assert not raw.endswith(b"# EOF\n")


def test_openmetrics_is_served_when_asked_for(url):
    r, raw = scrape(url, PROMETHEUS_ACCEPT, "identity")
    assert r.headers["content-type"].startswith(f"{OPENMETRICS}; version=1.0.0")
    assert raw.endswith(b"# EOF\n")
    assert b"# TYPE gatekeeper_build info\n" in raw  # an info family exists only in OpenMetrics


def test_gzip_is_served_when_accepted(url):
    plain = scrape(url, PROMETHEUS_ACCEPT, "identity")[1]
    r, raw = scrape(url, PROMETHEUS_ACCEPT, "gzip")
    assert r.headers["content-encoding"] == "gzip"
    assert int(r.headers["content-length"]) == len(raw) < len(plain) / 2
    assert gzip.decompress(raw).endswith(b"# EOF\n")


def test_the_webhook_s_reviews_are_in_both_formats(webhook_url):
    text = scrape(webhook_url, "*/*", "identity")[1].decode()
    assert 'gatekeeper_webhook_reviews_total{outcome="denied"} 1.0' in text
    om = scrape(webhook_url, OPENMETRICS, "gzip")[1]
    assert b'gatekeeper_webhook_reviews_total{outcome="denied"} 1.0' in gzip.decompress(om)


def test_name_filters_are_prometheus_client_s(sidecar_url):
    r = httpx.get(f"{sidecar_url}/metrics", params={"name[]": "gatekeeper_gpu_healthy"})
    names = {line.split("{")[0] for line in r.text.splitlines() if not line.startswith("#")}
    assert names == {"gatekeeper_gpu_healthy"}
