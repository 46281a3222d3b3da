"""kubelet's side of a DRA kubelet plugin's two unix sockets, for ``bench.dra_prepare`` and
the kubelet plugin's tests (``tests/support/dra_kubelet.py``).

``Kubelet`` calls the sockets with kubelet's own method names and messages
(``gatekeeper.cluster.kubelet_api``): the registration handshake
(``/pluginregistration.Registration/GetInfo``, then ``NotifyRegistrationStatus``), then
``NodePrepareResources`` and ``NodeUnprepareResources`` of
``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`` on the socket GetInfo names, as kubelet's
plugin manager and DRA manager do. ``registered`` retries the handshake until a started
``gatekeeper agent --kubelet-plugin`` answers, as kubelet's plugin watcher does.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]

from gatekeeper.cluster.kubelet_api import dra_v1_pb2 as dra
from gatekeeper.cluster.kubelet_api import pluginregistration_v1_pb2 as reg
from gatekeeper.cluster.kubelet_plugin import PluginSockets
from gatekeeper.cluster.prepared import ClaimRef

__all__ = ["DRA", "REG", "Kubelet", "claim_message", "registered"]

DRA = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/"
REG = "/pluginregistration.Registration/"
TIMEOUT_SECONDS = 30.0


def claim_message(ref: ClaimRef) -> dra.Claim:
    return dra.Claim(namespace=ref.namespace, name=ref.name, uid=ref.uid)


class Kubelet:
    """kubelet's side: the registration handshake, then prepare and unprepare."""

    def __init__(self, registration_socket: Path, timeout_seconds: float = 10.0) -> None:
        self.timeout_seconds = timeout_seconds
        self._reg = grpc.insecure_channel(f"unix://{registration_socket}")
        self._dra: Any = None

    def _call(self, channel: Any, method: str, request: Any, response: Any) -> Any:
        call = channel.unary_unary(
            method,
            request_serializer=type(request).SerializeToString,
            response_deserializer=response.FromString,
        )
        return call(request, timeout=self.timeout_seconds)

    def register(self) -> reg.PluginInfo:
        info: reg.PluginInfo = self._call(
            self._reg, REG + "GetInfo", reg.InfoRequest(), reg.PluginInfo
        )
        self._dra = grpc.insecure_channel(f"unix://{info.endpoint}")
        status = reg.RegistrationStatus(plugin_registered=True)
        self._call(
            self._reg, REG + "NotifyRegistrationStatus", status, reg.RegistrationStatusResponse
        )
        return info

    def prepare(self, *refs: ClaimRef) -> dict[str, dra.NodePrepareResourceResponse]:
        request = dra.NodePrepareResourcesRequest(claims=[claim_message(r) for r in refs])
        method = DRA + "NodePrepareResources"
        answer = self._call(self._dra, method, request, dra.NodePrepareResourcesResponse)
        return dict(answer.claims)

    def refused(self, ref: ClaimRef) -> str:
        """The error of a prepare of ``ref`` that must be refused (printed)."""
        answer = self.prepare(ref)[ref.uid]
        print(f"refused: {answer.error}")
        assert answer.error and not answer.devices, answer
        return str(answer.error)

    def unprepare(self, *refs: ClaimRef) -> dict[str, dra.NodeUnprepareResourceResponse]:
        request = dra.NodeUnprepareResourcesRequest(claims=[claim_message(r) for r in refs])
        method = DRA + "NodeUnprepareResources"
        answer = self._call(self._dra, method, request, dra.NodeUnprepareResourcesResponse)
        return dict(answer.claims)

    def close(self) -> None:
        for channel in (self._reg, self._dra):
            if channel is not None:
                channel.close()


def registered(sockets: PluginSockets, agent: subprocess.Popen[bytes], log: Path) -> Kubelet:
    """kubelet's handshake, tried until the agent answers (as kubelet retries): the killed
    agent's socket file stays behind and refuses until the new one replaces it."""
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while True:
        assert agent.poll() is None, log.read_text()
        kubelet = Kubelet(sockets.registration)
        try:
            assert kubelet.register().endpoint == str(sockets.dra)
        except grpc.RpcError:
            kubelet.close()
            assert time.monotonic() < deadline, f"no plugin answered: {log.read_text()}"
            time.sleep(0.05)
        else:
            return kubelet
