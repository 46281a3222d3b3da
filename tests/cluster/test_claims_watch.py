"""``ClaimsWatch`` against the real apiserver (``kube_cluster``): claims created, modified
and deleted show in the watched set within a second; a watch whose version has expired
(the apiserver's 410 Gone) re-lists and follows again; before the first list a read lists
directly, and raises where the apiserver cannot be reached."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx2
import pytest
from lightkube import Client, KubeConfig
from lightkube.codecs import from_dict
from lightkube.resources.resource_v1 import ResourceClaim

from gatekeeper.cluster import DRIVER_NAME
from gatekeeper.cluster.claims_watch import ClaimsWatch
from tests.support.kube_cluster import KubeCluster, namespace_client

NAMESPACE = "claims-watch"
WITHIN_SECONDS = 1.0


@pytest.fixture(scope="module")
def client(kube_cluster: KubeCluster) -> Iterator[Client]:
    with namespace_client(kube_cluster, NAMESPACE) as client:
        yield client


def make_claim(client: Client, name: str) -> None:
    request = {"name": "rank0", "exactly": {"deviceClassName": DRIVER_NAME}}
    manifest = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [request]}},
    }
    client.create(from_dict(manifest))


def labels_of(watch: ClaimsWatch) -> dict[str, dict[str, str]]:
    """The watched claims of ``NAMESPACE``: their labels by name."""
    return {
        c["metadata"]["name"]: c["metadata"].get("labels") or {}
        for c in watch()
        if c["metadata"]["namespace"] == NAMESPACE
    }


def seen_within(what: str, check: Callable[[], bool], seconds: float) -> float:
    """How long ``check`` took to hold; fails after ``seconds``."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < seconds, f"{what}: not seen within {seconds} s"
        time.sleep(0.005)
    return time.monotonic() - start


def synced(watch: ClaimsWatch) -> ClaimsWatch:
    seen_within("the first list", lambda: watch.synced, 10.0)
    return watch


def test_created_modified_and_deleted_claims_show_within_a_second(client: Client) -> None:
    watch = synced(ClaimsWatch(client).start())
    try:
        make_claim(client, "a")
        seen_within("a created", lambda: "a" in labels_of(watch), WITHIN_SECONDS)
        patch = {"metadata": {"labels": {"step": "2"}}}
        client.patch(ResourceClaim, "a", patch, namespace=NAMESPACE)
        seen_within(
            "a modified", lambda: labels_of(watch).get("a") == {"step": "2"}, WITHIN_SECONDS
        )
        client.delete(ResourceClaim, "a", namespace=NAMESPACE)
        seen_within("a deleted", lambda: "a" not in labels_of(watch), WITHIN_SECONDS)
        assert watch.lists == 1  # every change came by the watch, none by a list
    finally:
        watch.stop()


class Relay:
    """A TCP relay on loopback to ``upstream`` (host, port) whose connections ``cut``
    closes, as a restarted apiserver or a dropped connection would; it keeps accepting."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self._listener.accept()
            except OSError:
                return
            far = socket.create_connection(self._upstream)
            self._open += [near, far]
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        for end in (source, sink):
            end.close()

    def cut(self) -> None:
        for end in self._open:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
        self._open.clear()

    def close(self) -> None:
        self.cut()
        self._listener.close()


def client_at(cluster: KubeCluster, server: str, work: Path) -> Client:
    """A client of ``cluster``'s administrator that reaches ``server`` instead."""
    config = work / "kubeconfig"
    config.write_text(cluster.kubeconfig.read_text().replace(cluster.server, server))
    return Client(KubeConfig.from_file(config), trust_env=False)


def test_a_broken_stream_re_lists_and_the_watch_follows_again(
    kube_cluster: KubeCluster, client: Client, tmp_path: Path
) -> None:
    address = urllib.parse.urlsplit(kube_cluster.server)
    relay = Relay((address.hostname or "127.0.0.1", address.port or 443))
    watch = synced(
        ClaimsWatch(client_at(kube_cluster, f"https://127.0.0.1:{relay.port}", tmp_path)).start()
    )
    try:
        relay.cut()
        make_claim(client, "b")  # made in the backoff (0.5 s) with no stream: the re-list's
        seen_within("the re-list", lambda: watch.lists == 2, 10.0)
        assert "b" in labels_of(watch)
        client.delete(ResourceClaim, "b", namespace=NAMESPACE)
        seen_within("b deleted", lambda: "b" not in labels_of(watch), WITHIN_SECONDS)
        assert watch.lists == 2
    finally:
        watch.stop()
        relay.close()


def test_before_the_first_list_a_read_lists_and_raises_where_unreachable(
    kube_cluster: KubeCluster, client: Client, tmp_path: Path
) -> None:
    make_claim(client, "c")
    try:
        # never started: each read lists the claims itself
        assert "c" in labels_of(ClaimsWatch(client))
        unreachable = client_at(kube_cluster, "https://127.0.0.1:9", tmp_path)
        watch = ClaimsWatch(unreachable).start()
        with pytest.raises(httpx2.HTTPError):
            watch()
        assert not watch.synced
        watch.stop()
    finally:
        client.delete(ResourceClaim, "c", namespace=NAMESPACE)
