"""deploy/llm-d against what gatekeeper serves (issue 30 item 4): every metric the endpoint
picker's configuration names (the core metrics extractor's specs: name and fixed labels)
is served by the relay (``gatekeeper.cluster.pod_relay``, run here on 127.0.0.1 in front
of a node agent's collectors and vLLM's recorded /metrics, each on its own port) with that
name, those labels and the type the node agent serves; the filter and the scorer read the
attribute the extractor writes; the ports agree; the relay passes on the tightest GPU's
sample of its own pod only. The llm-d router itself is not run here (docs/cluster.md)."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gatekeeper.cluster import DRIVER_NAME
from gatekeeper.cluster.agent import quantity_bytes
from gatekeeper.cluster.agent_metrics import PodCollector
from gatekeeper.cluster.pod_relay import HEADROOM, pod_samples, relay_text, serve
from gatekeeper.cluster.slices import device_name
from gatekeeper.gpus.inventory import InventorySnapshot
from tests.metrics.text_exporter import VLLM_WORKER, serve_registry, serve_text
from tests.support.agent_state import CLAIM, NODE, POD_UID, agent_registry
from tests.support.polling import wait_for
from tests.support.prometheus_server import free_port
from tests.support.snapshots import busy_gpu

ROOT = Path(__file__).resolve().parents[2]
LLM_D = ROOT / "deploy" / "llm-d"
CONFIG = yaml.safe_load((LLM_D / "epp" / "endpoint-picker-config.yaml").read_text())
SPEC = re.compile(r"^\s*(\S+?)\s*(?:\{([^}]*)\})?\s*$")
"""The extractor's spec grammar (llm-d-router extractor/metrics/spec.go, metricSpecRE)."""
NAMESPACE, POD = CLAIM["metadata"]["namespace"], CLAIM["status"]["reservedFor"][0]["name"]


def plugin(kind: str) -> dict[str, Any]:
    (found,) = [p for p in CONFIG["plugins"] if p["type"] == kind]
    return dict(found)


def engine() -> dict[str, Any]:
    (vllm,) = plugin("core-metrics-extractor")["parameters"]["engineConfigs"]
    return dict(vllm)


def specs() -> dict[str, tuple[str, dict[str, str]]]:
    """Each spec the extractor's vLLM engine names: key -> (metric name, fixed labels)."""
    vllm = engine()
    named = {k: v for k, v in vllm.items() if k.endswith("Spec")}
    named |= {c["attributeKey"]: c["metricSpec"] for c in vllm.get("customMetrics", [])}
    out = {}
    for key, text in named.items():
        match = SPEC.match(text)
        assert match, f"{key}: {text!r} is not a metric spec"
        labels = dict(
            pair.split("=", 1) for pair in (match.group(2) or "").split(",") if pair.strip()
        )
        out[key] = (match.group(1), {k.strip(): v.strip().strip('"') for k, v in labels.items()})
    return out


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


@pytest.fixture(scope="module")
def relay() -> Iterator[str]:
    """The relay of pod ``POD`` on 127.0.0.1, in front of the agent and vLLM; its URL."""
    with serve_registry(agent_registry()) as agent, serve_text(VLLM_WORKER.read_text()) as vllm:
        server = serve(0, NAMESPACE, POD, f"http://{agent}/metrics", f"http://{vllm}/metrics")
        server_address = server.server_address
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield f"http://127.0.0.1:{server_address[1]}/metrics"
        server.shutdown()
        server.server_close()


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        text: str = answer.read().decode()
        return text


def test_every_named_metric_is_served_with_its_labels_and_the_agent_s_type(relay: str) -> None:
    served = families(scrape(relay))
    agent = families(generate_latest(agent_registry()).decode())
    optional = {"loraSpec"}  # vLLM serves vllm:lora_requests_info only with LoRA enabled
    for key, (name, labels) in specs().items():
        if key in optional and name not in served:
            continue
        assert name in served, f"{key}: {name} is not served by the relay"
        samples = served[name].samples
        assert any(labels.items() <= s.labels.items() for s in samples), (key, labels)
        if name.startswith("gatekeeper_"):
            assert served[name].type == agent[name].type == "gauge"
            (sample,) = samples
            (from_agent,) = [s for s in agent[name].samples if s.labels["pod"] == POD]
            assert sample.labels == from_agent.labels and sample.value == from_agent.value
            assert set(sample.labels) == {"namespace", "pod", "claim", "device"}


def test_the_filter_and_the_scorer_read_the_attribute_the_extractor_writes() -> None:
    written = {c["attributeKey"] for c in engine()["customMetrics"]}
    filter_ = plugin("endpoint-attribute-filter")["parameters"]
    scorer = plugin("endpoint-attribute-scorer")["parameters"]
    assert {filter_["attribute"], scorer["attributeKey"]} <= written
    # No producer: the core metrics extractor's attribute; a "/" would need one.
    assert "producer" not in filter_ and "producer" not in scorer
    assert all("/" not in key for key in written)
    assert filter_["algorithm"]["threshold"] == {"operator": "GreaterThanOrEqual", "value": 0}
    assert scorer["algorithm"]["type"] == "linear_higher_is_better"


def test_every_reference_names_a_plugin_and_the_ports_agree() -> None:
    names = {p.get("name", p["type"]) for p in CONFIG["plugins"]}
    refs = [r["pluginRef"] for prof in CONFIG["schedulingProfiles"] for r in prof["plugins"]]
    for source in CONFIG["dataLayer"]["sources"]:
        refs += [source["pluginRef"], *(e["pluginRef"] for e in source["extractors"])]
    assert set(refs) <= names, sorted(set(refs) - names)
    patch = yaml.safe_load((LLM_D / "patches" / "vllm-headroom-relay.yaml").read_text())
    (container,) = patch["spec"]["template"]["spec"]["containers"]
    (port,) = container["ports"]
    assert plugin("metrics-data-source")["parameters"]["port"] == port["containerPort"]
    assert f"--port={port['containerPort']}" in container["command"]
    service = yaml.safe_load((LLM_D / "agent-local-service.yaml").read_text())
    agent_url = next(a for a in container["command"] if a.startswith("--agent-url="))
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    (service_port,) = service["spec"]["ports"]
    assert agent_url.endswith(f"//{name}.{namespace}.svc:{service_port['port']}/metrics")
    assert service["spec"]["internalTrafficPolicy"] == "Local"


def test_the_manifests_validate_strictly() -> None:
    version = kubernetes_validate.latest_version()
    service = yaml.safe_load((LLM_D / "agent-local-service.yaml").read_text())
    kubernetes_validate.validate(service, version, strict=True)
    patch = yaml.safe_load((LLM_D / "patches" / "vllm-headroom-relay.yaml").read_text())
    template = {"spec": patch["spec"]["template"]["spec"]}
    doc = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}}
    kubernetes_validate.validate(doc | {"template": template}, version, strict=True)


def two_gpu_agent_text() -> str:
    """An agent's exposition with ``POD`` on two GPUs (a TP 2 claim), 4 and 1 GiB free of
    their claims, and another pod."""
    gib = 2**30
    gpus = (busy_gpu(0, 20 * gib, (10, 20 * gib)), busy_gpu(1, 23 * gib, (11, 23 * gib)))
    booked = {"memory": "24Gi"}
    results = [
        {"driver": DRIVER_NAME, "pool": NODE, "device": device_name(g), "consumedCapacity": booked}
        for g in gpus
    ]
    tp = {
        "metadata": {"name": "tp-claim", "namespace": NAMESPACE},
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": POD, "uid": POD_UID}],
        },
    }
    other = {**CLAIM, "status": {**CLAIM["status"], "reservedFor": [
        {"resource": "pods", "name": "other", "uid": "u-other"}]}}  # fmt: skip
    snapshot = InventorySnapshot(gpus=gpus, ok=True)
    registry = CollectorRegistry()
    registry.register(
        PodCollector(
            NODE,
            DRIVER_NAME,
            lambda: snapshot,
            lambda: [tp, other],
            {10: POD_UID, 11: POD_UID}.get,
            quantity_bytes,
        )
    )
    return generate_latest(registry).decode()


def test_the_relay_passes_on_its_pod_s_tightest_gpu_only() -> None:
    text = pod_samples(two_gpu_agent_text(), NAMESPACE, POD)
    (family,) = text_string_to_metric_families(text)
    (sample,) = family.samples
    assert (family.name, family.type) == (HEADROOM, "gauge")
    assert sample.labels["device"] == device_name(busy_gpu(1, 0)) and sample.value == 2**30
    assert pod_samples(two_gpu_agent_text(), NAMESPACE, "absent") == ""


def test_without_an_agent_answer_the_relay_serves_vllm_alone() -> None:
    vllm = VLLM_WORKER.read_text()
    assert relay_text(vllm, None, NAMESPACE, POD).rstrip("\n") == vllm.rstrip("\n")
    assert HEADROOM not in relay_text(None, "", NAMESPACE, POD)


def test_the_relay_runs_as_the_manifest_starts_it() -> None:
    """``python -m gatekeeper.cluster.pod_relay`` with the manifest's arguments (the agent
    and vLLM URLs pointed at loopback, a free port), as its own process."""
    patch = yaml.safe_load((LLM_D / "patches" / "vllm-headroom-relay.yaml").read_text())
    (container,) = patch["spec"]["template"]["spec"]["containers"]
    port = free_port()
    with serve_registry(agent_registry()) as agent, serve_text(VLLM_WORKER.read_text()) as vllm:
        given = {
            "--namespace": NAMESPACE,
            "--pod": POD,
            "--agent-url": f"http://{agent}/metrics",
            "--vllm-url": f"http://{vllm}/metrics",
            "--port": str(port),
        }
        args = [a.split("=", 1)[0] for a in container["command"][3:]]
        assert sorted(args) == sorted(given), args
        argv = [f"{a}={given[a]}" for a in args]
        module = container["command"][1:3]
        with subprocess.Popen([sys.executable, *module, *argv]) as relay:
            try:
                url = f"http://127.0.0.1:{port}/metrics"
                text = wait_for("the relay", lambda: _scraped(url))
            finally:
                relay.terminate()
                relay.wait(timeout=10)
    served = families(text)
    assert served[HEADROOM].samples[0].labels["pod"] == POD
    assert "vllm:kv_cache_usage_perc" in served


def _scraped(url: str) -> str | None:
    try:
        return scrape(url)
    except OSError:
        return None
