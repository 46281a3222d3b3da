"""The kubelet plugin: gatekeeper's DRA driver as kubelet reaches it, over two unix sockets.

As ``k8s.io/dynamic-resource-allocation/kubeletplugin`` does for Go drivers:

- the **registration** socket, ``<registry dir>/<driver>-reg.sock`` (kubelet watches
  ``/var/lib/kubelet/plugins_registry``), serves ``pluginregistration.Registration``:
  ``GetInfo`` answers type ``DRAPlugin``, the driver's name, the DRA socket's path and the
  services this plugin serves (``v1.DRAPlugin``, the one kubelet 1.34+ calls);
  ``NotifyRegistrationStatus`` records kubelet's answer (a refusal is logged);
- the **DRA** socket, ``<plugin dir>/dra.sock``, serves
  ``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``: ``NodePrepareResources`` and
  ``NodeUnprepareResources``, each claim of the request answered on its own
  (``DraDriver``): devices with their CDI device IDs, or the reason in ``error``, which
  kubelet reports on the pod and retries. A claim whose bytes are not free waits for them
  within the call: until the call's deadline (kubelet's 45 s,
  ``dra_driver.KUBELET_CALL_TIMEOUT_SECONDS``; grpc's ``context.time_remaining()``) less
  ``dra_driver.DEADLINE_MARGIN_SECONDS``, one deadline for all the request's claims. The
  DRA socket's pool has a thread for each waiter the driver allows
  (``DraDriver.max_waiters``) beyond ``workers``, so unprepares and the prepares that fit
  are never stuck behind waiters.

The messages are ``gatekeeper.cluster.kubelet_api``'s; the method handlers are written
out here with grpc's generic handlers (what a ``_pb2_grpc`` module would generate).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
from lightkube import ApiError, Client
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from gatekeeper.cluster.dra_driver import DEADLINE_MARGIN_SECONDS, DraDriver
from gatekeeper.cluster.kubelet_api import dra_v1_pb2 as dra
from gatekeeper.cluster.kubelet_api import pluginregistration_v1_pb2 as reg
from gatekeeper.cluster.prepared import ClaimRef, PrepareError
from gatekeeper.cluster.slices import DRIVER_NAME, slice_name
from gatekeeper.errors import GatekeeperError

__all__ = [
    "DRA_SERVICE",
    "REGISTRATION_SERVICE",
    "SUPPORTED_VERSIONS",
    "KubeletPlugin",
    "PluginSockets",
    "claim_reader",
    "pod_reader",
    "slice_reader",
]

log = logging.getLogger("gatekeeper.cluster.kubelet_plugin")
DRA_SERVICE = "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
REGISTRATION_SERVICE = "pluginregistration.Registration"
SUPPORTED_VERSIONS = ("v1.DRAPlugin",)
"""kubelet's names of the DRA services served (k8s.io/kubelet/pkg/apis/dra/v1 DRAPluginService)."""
PLUGIN_TYPE = "DRAPlugin"


@dataclass(frozen=True, slots=True)
class PluginSockets:
    """The two sockets, from the plugin directory and kubelet's registry directory."""

    plugin_dir: Path
    registry_dir: Path
    driver: str

    @property
    def dra(self) -> Path:
        return self.plugin_dir / "dra.sock"

    @property
    def registration(self) -> Path:
        return self.registry_dir / f"{self.driver}-reg.sock"


def _unary(fn: Callable[[Any, Any], Any], request: Any, response: Any) -> Any:
    return grpc.unary_unary_rpc_method_handler(
        fn,
        request_deserializer=request.FromString,
        response_serializer=response.SerializeToString,
    )


class KubeletPlugin:
    """Serves ``driver`` (a ``DraDriver``) on ``sockets`` until ``stop``."""

    def __init__(self, driver: DraDriver, sockets: PluginSockets, workers: int = 4) -> None:
        self.driver = driver
        self.sockets = sockets
        self.registration_status: reg.RegistrationStatus | None = None
        """kubelet's last word on the registration."""
        self._workers = workers
        self._servers: list[Any] = []

    def start(self) -> None:
        """Bind both sockets (stale socket files removed first) and serve."""
        dra_handlers = {
            "NodePrepareResources": _unary(
                self._prepare, dra.NodePrepareResourcesRequest, dra.NodePrepareResourcesResponse
            ),
            "NodeUnprepareResources": _unary(
                self._unprepare,
                dra.NodeUnprepareResourcesRequest,
                dra.NodeUnprepareResourcesResponse,
            ),
        }
        reg_handlers = {
            "GetInfo": _unary(self._get_info, reg.InfoRequest, reg.PluginInfo),
            "NotifyRegistrationStatus": _unary(
                self._notify, reg.RegistrationStatus, reg.RegistrationStatusResponse
            ),
        }
        # The DRA socket first: kubelet calls it as soon as it sees the registration socket.
        dra_workers = self._workers + self.driver.max_waiters
        for path, service, handlers, workers in (
            (self.sockets.dra, DRA_SERVICE, dra_handlers, dra_workers),
            (self.sockets.registration, REGISTRATION_SERVICE, reg_handlers, self._workers),
        ):
            self._servers.append(self._serve(path, service, handlers, workers))
        log.info(
            "kubelet plugin of %s: DRA socket %s, registration socket %s",
            self.driver.driver,
            self.sockets.dra,
            self.sockets.registration,
        )

    def _serve(self, path: Path, service: str, handlers: dict[str, Any], workers: int) -> Any:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
        if server.add_insecure_port(f"unix://{path}") == 0:
            raise GatekeeperError(
                f"cannot listen on unix socket {path}; check that its directory is writable "
                "(the DaemonSet mounts it from the host)",
                field="socket",
                value=str(path),
            )
        server.start()
        return server

    def stop(self, grace_seconds: float = 1.0) -> None:
        """Stop serving (registration first, so kubelet stops calling) and remove the
        sockets. The prepares waiting for bytes are refused first (``DraDriver.close``):
        grpc cannot end a handler, and a waiter left alone would keep the process up to
        its bound (30 s by default) after the servers stop."""
        self.driver.close()
        for server in reversed(self._servers):
            server.stop(grace_seconds).wait()
        self._servers.clear()
        self.sockets.registration.unlink(missing_ok=True)
        self.sockets.dra.unlink(missing_ok=True)

    def _get_info(self, request: reg.InfoRequest, context: Any) -> reg.PluginInfo:
        return reg.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.driver.driver,
            endpoint=str(self.sockets.dra),
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    def _notify(
        self, status: reg.RegistrationStatus, context: Any
    ) -> reg.RegistrationStatusResponse:
        self.registration_status = status
        if status.plugin_registered:
            log.info("kubelet registered the plugin of %s", self.driver.driver)
        else:
            log.error("kubelet refused the plugin of %s: %s", self.driver.driver, status.error)
        return reg.RegistrationStatusResponse()

    def _prepare(
        self, request: dra.NodePrepareResourcesRequest, context: Any
    ) -> dra.NodePrepareResourcesResponse:
        response = dra.NodePrepareResourcesResponse()
        remaining = context.time_remaining()
        deadline = None
        if remaining is not None:
            deadline = time.monotonic() + remaining - DEADLINE_MARGIN_SECONDS
        for claim in request.claims:
            ref = ClaimRef(claim.namespace, claim.name, claim.uid)
            answer = response.claims[claim.uid]
            try:
                prepared = self.driver.prepare(ref, deadline, context.is_active)
            except Exception as e:  # each claim's failure is its own answer
                log.warning("prepare of claim %s refused: %s", ref, e)
                answer.error = _reason(e)
                continue
            for device in prepared.devices:
                answer.devices.append(
                    dra.Device(
                        request_names=[device.claimed.request],
                        pool_name=device.claimed.pool,
                        device_name=device.claimed.device,
                        cdi_device_ids=[device.cdi_device_id],
                        share_id=device.claimed.share_id,
                    )
                )
        return response

    def _unprepare(
        self, request: dra.NodeUnprepareResourcesRequest, context: Any
    ) -> dra.NodeUnprepareResourcesResponse:
        response = dra.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            ref = ClaimRef(claim.namespace, claim.name, claim.uid)
            answer = response.claims[claim.uid]
            try:
                self.driver.unprepare(ref)
            except Exception as e:  # each claim's failure is its own answer, as in prepare
                log.warning("unprepare of claim %s failed: %s", ref, e)
                answer.error = (
                    f"claim {ref}: unprepare failed ({type(e).__name__}: {e}); kubelet retries it"
                )
        return response


def _reason(e: Exception) -> str:
    if isinstance(e, GatekeeperError):
        return str(e)
    return f"{type(e).__name__}: {e}; kubelet retries the prepare"


def _reader(client: Client, resource: Any, what: str) -> Callable[[str, str], dict[str, Any]]:
    def read(namespace: str, name: str) -> dict[str, Any]:
        try:
            found: dict[str, Any] = client.get(resource, name, namespace=namespace).to_dict()
        except ApiError as e:
            raise PrepareError(
                f"{what} {namespace}/{name}: the apiserver answered {e.status.code} "
                f"({e.status.message}); kubelet retries the prepare",
                field=what,
                value=f"{namespace}/{name}",
            ) from e
        return found

    return read


def claim_reader(client: Client) -> Callable[[str, str], dict[str, Any]]:
    """Reads a ResourceClaim from the apiserver as a plain dict; a missing claim is a
    ``PrepareError`` (kubelet retries; the claim may not be visible yet)."""
    return _reader(client, ResourceClaim, "claim")


def pod_reader(client: Client) -> Callable[[str, str], dict[str, Any]]:
    """Reads a Pod (one a claim is reserved for) as a plain dict; ``PrepareError`` when
    the apiserver does not answer it."""
    return _reader(client, Pod, "pod")


def slice_reader(
    client: Client, node_name: str, driver: str = DRIVER_NAME
) -> Callable[[], dict[str, Any] | None]:
    """Reads the node's ResourceSlice of ``driver`` (the one the node agent publishes) as
    a plain dict, None when there is none; ``PrepareError`` when the apiserver refuses."""
    name = slice_name(node_name, driver)

    def read() -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = client.get(ResourceSlice, name).to_dict()
        except ApiError as e:
            if e.status.code == 404:
                return None
            raise PrepareError(
                f"ResourceSlice {name}: the apiserver answered {e.status.code} "
                f"({e.status.message}); kubelet retries the prepare",
                field="resourceslice",
                value=name,
            ) from e
        return found

    return read
