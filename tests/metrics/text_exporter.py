"""Static Prometheus expositions served on 127.0.0.1, standing in for exporters the
tests do not run: a vLLM worker's ``/metrics`` (``data/vllm_worker.prom``, vLLM 0.32's
names and labels), DCGM exporter's (``data/dcgm_node.prom``), kube-state-metrics'
(``data/kube_state_metrics.prom``) and the API server's admission webhook counters
(``data/apiserver_admission.prom``)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server

DATA = Path(__file__).parent / "data"
VLLM_WORKER = DATA / "vllm_worker.prom"
DCGM_NODE = DATA / "dcgm_node.prom"
KUBE_STATE_METRICS = DATA / "kube_state_metrics.prom"
APISERVER = DATA / "apiserver_admission.prom"


@contextlib.contextmanager
def serve_text(text: str) -> Iterator[str]:
    """``text`` as ``GET /metrics`` (text format 0.0.4) on 127.0.0.1; yields host:port."""
    body = text.encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    with serving(server, thread) as address:
        yield address


@contextlib.contextmanager
def serve_registry(registry: CollectorRegistry) -> Iterator[str]:
    """``registry`` on 127.0.0.1 with prometheus_client's own server; yields host:port."""
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    with serving(server, thread) as address:
        yield address


@contextlib.contextmanager
def serving(server: HTTPServer, thread: threading.Thread) -> Iterator[str]:
    """Yields the started ``server``'s host:port; shuts it down after."""
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
