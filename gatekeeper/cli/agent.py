"""``gatekeeper agent``: the node agent the cluster mode's DaemonSet runs on each GPU node.

It publishes the node's GPUs as one DRA ResourceSlice, taints a device while memory no
claim books is in use, and republishes when GPUs appear or vanish
(``gatekeeper.cluster.agent``; docs/cluster.md). The GPUs come from ``--gpus`` (else the
``gpus`` setting): ``nvml``, or a declared node, read again at each pass so that a JSON
file of GPUs can change under a running agent. The apiserver is reached through
``--kubeconfig``, else the pod's service account (in-cluster). Needs the ``cluster``
extra (``pip install 'gatekeeper[cluster]'``).
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gatekeeper.cli.log_options import add_log_format, announce, start_logging
from gatekeeper.errors import GatekeeperError
from gatekeeper.settings import Settings, gpu_source, model_resolver, placement_policy
from gatekeeper.units import MIB

if TYPE_CHECKING:
    from gatekeeper.cluster.agent_metrics import PodCollector
    from gatekeeper.gpus.inventory import InventorySnapshot

__all__ = ["add_parser", "pod_collector", "run"]


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "agent",
        help="publish this node's GPUs to Kubernetes as a DRA ResourceSlice (cluster mode)",
        description="Publish this node's GPUs as a ResourceSlice (pool = node name), taint "
        "a GPU while memory no claim books is used on it, and republish when GPUs change.",
    )
    p.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME"),
        help="the Node this agent runs on (default: $NODE_NAME, set by the DaemonSet)",
    )
    p.add_argument(
        "--gpus",
        default=None,
        help="nvml, or a declared node (2xH100-80GB or a JSON file of GPUs) "
        "(default: the gpus setting)",
    )
    p.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster)")
    p.add_argument(
        "--interval", type=float, default=10.0, help="seconds between passes (default 10)"
    )
    p.add_argument(
        "--tolerance-mib",
        type=int,
        default=512,
        help="memory used beyond the claims' bookings, in MiB, tolerated before a GPU is "
        "tainted NoSchedule (default 512)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics on this port (default: none)",
    )
    p.add_argument("--once", action="store_true", help="publish once and exit")
    _add_plugin_options(p)
    add_log_format(p)
    p.set_defaults(func=run)


def _add_plugin_options(p: Any) -> None:
    p.add_argument(
        "--kubelet-plugin",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also serve the DRA driver's kubelet plugin (default: the kubelet_plugin setting)",
    )
    p.add_argument(
        "--plugin-dir",
        type=Path,
        default=None,
        help="the plugin's DRA socket and checkpoint directory (default: the "
        "kubelet_plugin_dir setting, else /var/lib/kubelet/plugins/<driver>)",
    )
    p.add_argument(
        "--registry-dir",
        type=Path,
        default=None,
        help="kubelet's plugin registry directory (default: the kubelet_registry_dir setting)",
    )
    p.add_argument(
        "--cdi-dir",
        type=Path,
        default=None,
        help="where the CDI specs of prepared claims go (default: the cdi_dir setting)",
    )
    p.add_argument(
        "--prepare-wait-seconds",
        type=float,
        default=None,
        help="how long a prepare whose bytes are not free waits for them, at most 43 "
        "(default: the prepare_wait_seconds setting, 30)",
    )


def _start_plugin(
    args: argparse.Namespace, settings: Settings, client: Any, read: Any, prepares: Any
) -> Any | None:
    """The kubelet plugin, serving, when configured; None otherwise."""
    enabled = settings.kubelet_plugin if args.kubelet_plugin is None else args.kubelet_plugin
    if not enabled:
        return None
    from gatekeeper.cluster.agent import quantity_bytes
    from gatekeeper.cluster.dra_driver import DraDriver, DriverPaths
    from gatekeeper.cluster.kubelet_plugin import (
        KubeletPlugin,
        PluginSockets,
        claim_reader,
        pod_reader,
        slice_reader,
    )
    from gatekeeper.cluster.reserves import rank_sizer
    from gatekeeper.cluster.slices import DRIVER_NAME

    plugin_dir = args.plugin_dir or settings.kubelet_plugin_dir
    plugin_dir = plugin_dir or Path("/var/lib/kubelet/plugins") / DRIVER_NAME
    paths = DriverPaths(plugin_dir=plugin_dir, cdi_dir=args.cdi_dir or settings.cdi_dir)
    driver = DraDriver(
        args.node_name,
        paths,
        claim_reader(client),
        read,
        quantity_bytes,
        read_pod=pod_reader(client),
        size_rank=rank_sizer(model_resolver(settings), placement_policy(settings)),
        read_published=slice_reader(client, args.node_name, DRIVER_NAME),
        default_release=settings.default_vllm_version,
        count_prepare=prepares.count,
        wait_seconds=(
            settings.prepare_wait_seconds
            if args.prepare_wait_seconds is None
            else args.prepare_wait_seconds
        ),
    )
    registry = args.registry_dir or settings.kubelet_registry_dir
    plugin = KubeletPlugin(driver, PluginSockets(plugin_dir, registry, DRIVER_NAME))
    plugin.start()
    return plugin


def _reader(settings: Settings, gpus: str | None) -> Callable[[], InventorySnapshot]:
    """A fresh snapshot per call: NVML read again, a declared node parsed again."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")

    def read() -> InventorySnapshot:
        return gpu_source(settings, gpus).snapshot(visible_devices=visible)

    return read


def _client(kubeconfig: str | None) -> Any:
    from lightkube import Client, KubeConfig

    config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
    return Client(config, field_manager="gatekeeper-agent", trust_env=False)


def pod_collector(
    client: Any,
    node_name: str,
    driver: str,
    read: Callable[[], InventorySnapshot],
    pod_of: Callable[[int], str | None],
    list_claims: Callable[[], Any] | None = None,
) -> PodCollector:
    """The per-pod figures' collector on ``client``: the claims from ``list_claims`` (the
    agent's ``ClaimsWatch``; where none is given, a watch never started, which lists at
    each scrape), each pod read once per UID for its recorded components."""
    from lightkube.resources.core_v1 import Pod

    from gatekeeper.cluster.agent import quantity_bytes
    from gatekeeper.cluster.agent_metrics import PodCollector
    from gatekeeper.cluster.claims_watch import ClaimsWatch

    def pod(namespace: str, name: str) -> dict[str, Any]:
        found: dict[str, Any] = client.get(Pod, name, namespace=namespace).to_dict()
        return found

    claims = list_claims or ClaimsWatch(client)
    return PodCollector(node_name, driver, read, claims, pod_of, quantity_bytes, read_pod=pod)


def _serve_metrics(
    agent: Any, config: Any, port: int, client: Any, read: Any, prepares: Any, claims: Any
) -> None:
    """The agent's collector, and the per-pod figures (``pod_collector``; NVML and the
    cgroups read at each scrape)."""
    from prometheus_client import CollectorRegistry, start_http_server

    from gatekeeper.cluster.agent_metrics import AgentCollector
    from gatekeeper.cluster.pod_cgroup import pod_uid

    registry = CollectorRegistry()
    registry.register(AgentCollector(agent, prepares))
    per_pod = pod_collector(client, config.node_name, config.driver, read, pod_uid, claims)
    registry.register(per_pod)
    start_http_server(port, registry=registry)


def run(args: argparse.Namespace, settings: Settings) -> int:
    if not args.node_name:
        raise GatekeeperError(
            "--node-name is empty and $NODE_NAME is not set; pass --node-name or set "
            "NODE_NAME from the pod's spec.nodeName (deploy/kubernetes/components/cluster)",
            field="--node-name",
            value=args.node_name,
        )
    from gatekeeper.cluster.agent import AgentConfig, NodeAgent
    from gatekeeper.cluster.agent_metrics import PrepareCounter
    from gatekeeper.cluster.claims_watch import ClaimsWatch

    log_format = start_logging(args, settings)
    config = AgentConfig(
        node_name=args.node_name,
        policy=placement_policy(settings),
        interval_seconds=args.interval,
        tolerance_bytes=args.tolerance_mib * MIB,
    )
    client = _client(args.kubeconfig)
    read = _reader(settings, args.gpus)
    if args.once:
        once = NodeAgent(client, config, read)
        result = once.publish()
        print(f"slice {once.slice_name} {result.action}: generation {result.generation}")
        return 0
    claims = ClaimsWatch(client).start()
    agent = NodeAgent(client, config, read, claims)
    prepares = PrepareCounter()
    announce(
        [f"gatekeeper agent: node {config.node_name}, slice {agent.slice_name}"],
        log_format,
        "gatekeeper.cluster.agent",
    )
    if args.metrics_port is not None:
        _serve_metrics(agent, config, args.metrics_port, client, read, prepares, claims)
    plugin = _start_plugin(args, settings, client, read, prepares)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        agent.run(stop)
    finally:
        if plugin is not None:
            plugin.stop()
        claims.stop()
    return 0
