"""The routing signal at the pod's own address, for the llm-d router (issue 30 item 4;
``docs/cluster.md`` "Per-pod figures and routing", ``deploy/llm-d/``).

The llm-d router's endpoint picker scrapes each model-server pod at the pod's IP
(``metrics-data-source``, with an optional ``port``) and its core metrics extractor maps
a metric to an endpoint attribute by name and fixed labels, taking any sample that
matches. The node agent serves every pod of its node at the node's address, so the picker
cannot read it per pod. This relay runs as a container of the vLLM pod: on each
``GET /metrics`` it fetches vLLM's own ``/metrics`` (passed on as it is) and the node
agent's, and adds the agent's ``gatekeeper_pod_memory_headroom_bytes`` sample of this
pod with the least headroom (a tensor-parallel pod has one per GPU: the tightest GPU is
the one that runs out first), unchanged: the same name, labels and type the agent serves.

``pod_samples`` is pure; the fetching and serving are at the edge (the standard library's
HTTP server, one thread per scrape). An upstream that does not answer is left out, so the
picker sees the attribute missing (``onMissing``) instead of a stale value.

Run: ``python -m gatekeeper.cluster.pod_relay --namespace NS --pod NAME
--agent-url http://gatekeeper-agent-local.gatekeeper:8081/metrics
--vllm-url http://127.0.0.1:8000/metrics --port 9464``.
"""

from __future__ import annotations

import argparse
import logging
import urllib.error
import urllib.request
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["HEADROOM", "pod_samples", "relay_text", "serve"]

log = logging.getLogger("gatekeeper.cluster.pod_relay")
HEADROOM = "gatekeeper_pod_memory_headroom_bytes"
"""The agent's family the relay passes on (``agent_metrics.PodCollector``)."""
_HELP = "The pod's claim on the device less its processes' NVML usage there"


def pod_samples(agent_text: str, namespace: str, pod: str) -> str:
    """The exposition of the agent's ``HEADROOM`` sample of ``namespace``/``pod`` with the
    least value ("" when the agent has none for the pod)."""
    found: list[tuple[float, dict[str, str]]] = []
    for family in text_string_to_metric_families(agent_text):
        if family.name != HEADROOM:
            continue
        for sample in family.samples:
            if sample.labels.get("namespace") == namespace and sample.labels.get("pod") == pod:
                found.append((sample.value, dict(sample.labels)))
    if not found:
        return ""
    value, labels = min(found, key=lambda f: f[0])
    text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
    return (
        f"# HELP {HEADROOM} {_HELP}\n# TYPE {HEADROOM} gauge\n{HEADROOM}{{{text}}} {value:.17g}\n"
    )


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def relay_text(vllm_text: str | None, agent_text: str | None, namespace: str, pod: str) -> str:
    """vLLM's exposition as it is, then this pod's headroom (either part may be missing)."""
    vllm = vllm_text or ""
    if vllm and not vllm.endswith("\n"):
        vllm += "\n"
    return vllm + (pod_samples(agent_text, namespace, pod) if agent_text else "")


def _fetch(url: str, timeout_seconds: float) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_seconds) as answer:
            text: str = answer.read().decode()
            return text
    except (OSError, urllib.error.URLError, ValueError) as e:
        log.warning("%s did not answer: %s", url, e)
        return None


def serve(
    port: int,
    namespace: str,
    pod: str,
    agent_url: str,
    vllm_url: str | None,
    host: str = "0.0.0.0",
    timeout_seconds: float = 2.0,
) -> ThreadingHTTPServer:
    """A server (not yet serving: call ``serve_forever``) answering ``GET /metrics``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "only /metrics is served")
                return
            vllm = _fetch(vllm_url, timeout_seconds) if vllm_url else None
            agent = _fetch(agent_url, timeout_seconds)
            body = relay_text(vllm, agent, namespace, pod).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug(format, *args)

    return ThreadingHTTPServer((host, port), Handler)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gatekeeper.cluster.pod_relay")
    parser.add_argument("--namespace", required=True, help="this pod's namespace")
    parser.add_argument("--pod", required=True, help="this pod's name")
    parser.add_argument("--agent-url", required=True, help="the node agent's /metrics URL")
    parser.add_argument("--vllm-url", default="http://127.0.0.1:8000/metrics")
    parser.add_argument("--port", type=int, default=9464)
    parser.add_argument("--host", default="0.0.0.0", help="the address to listen on")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    server = serve(
        args.port, args.namespace, args.pod, args.agent_url, args.vllm_url or None, args.host
    )
    log.info("relaying %s/%s's headroom on port %d", args.namespace, args.pod, args.port)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
