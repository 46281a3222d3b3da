"""Kubernetes' own control plane on loopback, for the cluster tests and ``bench.cluster``
(issue 29).

etcd, kube-apiserver, kube-scheduler and kube-controller-manager, built by
``scripts/k8s-components.sh`` into ``build/k8s/`` (or ``$GATEKEEPER_KUBE_BIN``), each
started on ``127.0.0.1`` with free ports and its state in a directory the caller gives.
There is no kubelet: callers register Node objects with a Ready status themselves.

The apiserver serves TLS with a certificate from ``bench/tls_certs.py`` and accepts one
static bearer token in ``system:masters``; the scheduler and the controller manager use the
same token through a kubeconfig. The controller manager runs only the resource-claim
controller (pods' ResourceClaimTemplates become ResourceClaims, the claims'
``reservedFor`` is kept), which is all that DRA needs without kubelets, and the deployment
and replica-set controllers (a Deployment's pods).

Two admission plugins are off: ``ServiceAccount`` (no token controller runs, so a pod would
wait for a default ServiceAccount that never comes) and ``TaintNodesByCondition`` (it taints
every new Node ``not-ready`` and only the node-lifecycle controller, driven by kubelets,
would lift the taint).

``tests/support/kube_cluster.py`` wraps ``start_cluster`` in the session fixture.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from lightkube import Client, KubeConfig

from bench.serve_process import free_port
from bench.tls_certs import issue, make_ca

KUBE_BIN_ENV = "GATEKEEPER_KUBE_BIN"
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")
ROOT = Path(__file__).resolve().parents[1]
# DRAConsumableCapacity is beta and on by default from 1.36; naming it keeps the
# fixture right on 1.34-1.35 binaries too (kube_features.go, defaultVersionedKubernetesFeatureGates).
FEATURE_GATES = "DRAConsumableCapacity=true"
START_TIMEOUT_SECONDS = 90.0
CONTROLLERS = "resourceclaim-controller,deployment-controller,replicaset-controller"
"""The resource-claim controller (templates to claims), and the two that turn a Deployment
into pods, so that a Deployment applied gets pods the scheduler binds."""


def kube_bin_dir() -> Path:
    """``$GATEKEEPER_KUBE_BIN`` if set, else ``build/k8s/`` in the checkout."""
    configured = os.environ.get(KUBE_BIN_ENV)
    return Path(configured) if configured else ROOT / "build" / "k8s"


def missing_reason(bin_dir: Path) -> str | None:
    """Why the components cannot run from ``bin_dir``, or None when all are there."""
    missing = [name for name in BINARIES if not os.access(bin_dir / name, os.X_OK)]
    if not missing:
        return None
    return (
        f"Kubernetes components missing from {bin_dir}: {', '.join(missing)}; "
        "run scripts/k8s-components.sh (8 to 12 minutes the first time on 2 cores, then "
        f"cached) or set {KUBE_BIN_ENV} to a folder holding etcd, kube-apiserver, "
        "kube-scheduler and kube-controller-manager"
    )


@dataclass
class Component:
    """One running binary, its output in ``log``."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    port: int | None = None
    """The scheduler's or controller manager's local secure port."""

    def tail(self, lines: int = 25) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self, grace_seconds: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after the grace period."""
        if self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=grace_seconds)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


@dataclass
class KubeCluster:
    """A started control plane: where it listens and how to reach it."""

    server: str
    token: str
    ca_path: Path
    kubeconfig: Path
    work_dir: Path
    components: list[Component] = field(default_factory=list)

    def client(self) -> Client:
        """A lightkube client authenticated as the test administrator."""
        return Client(KubeConfig.from_file(self.kubeconfig), trust_env=False)

    def get(self, path: str) -> bytes:
        """A raw GET on the apiserver (``/version``, ``/readyz``, ``/metrics``)."""
        request = urllib.request.Request(
            self.server + path, headers={"Authorization": f"Bearer {self.token}"}
        )
        context = ssl.create_default_context(cafile=str(self.ca_path))
        with urllib.request.urlopen(request, context=context, timeout=5) as answer:
            body: bytes = answer.read()
            return body

    def component_metrics(self, name: str) -> str:
        """``/metrics`` of the scheduler or the controller manager (``name``), on its
        local secure port with the administrator's token (its serving certificate is
        self-signed, so not verified: the bench reads figures, it sends nothing secret
        beyond the test cluster's token)."""
        (component,) = [c for c in self.components if c.name == name]
        request = urllib.request.Request(
            f"https://127.0.0.1:{component.port}/metrics",
            headers={"Authorization": f"Bearer {self.token}"},
        )
        context = ssl._create_unverified_context()
        with urllib.request.urlopen(request, context=context, timeout=5) as answer:
            text: str = answer.read().decode()
            return text

    def stop(self) -> None:
        """Stops the components in reverse order of start."""
        for component in reversed(self.components):
            component.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {c.name} ---\n{c.tail()}" for c in self.components)


def _write_credentials(work_dir: Path, server: str) -> tuple[str, Path, Path]:
    """TLS material, the service-account signing key, a token file and a kubeconfig."""
    ca = make_ca(work_dir)
    issue(ca, work_dir / "apiserver.crt", work_dir / "apiserver.key")
    signing_key = ec.generate_private_key(ec.SECP256R1())
    (work_dir / "sa.key").write_bytes(
        signing_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    (work_dir / "sa.pub").write_bytes(
        signing_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    token = secrets.token_hex(16)
    (work_dir / "tokens.csv").write_text(f'{token},admin,admin-uid,"system:masters"\n')
    kubeconfig = work_dir / "kubeconfig"
    kubeconfig.write_text(_kubeconfig_text(server, ca.path, token))
    return token, ca.path, kubeconfig


def _kubeconfig_text(server: str, ca_path: Path, token: str) -> str:
    return (
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: test\n  cluster:\n    server: {server}\n"
        f"    certificate-authority: {ca_path}\n"
        f"users:\n- name: admin\n  user:\n    token: {token}\n"
        "contexts:\n- name: test\n  context:\n    cluster: test\n    user: admin\n"
        "    namespace: default\n"
        "current-context: test\n"
    )


def _spawn(bin_dir: Path, work_dir: Path, name: str, args: list[str]) -> Component:
    log = work_dir / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(bin_dir / name), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=work_dir,
        )
    return Component(name, proc, log)


def _etcd_args(work_dir: Path, client_port: int) -> list[str]:
    peer = f"http://127.0.0.1:{free_port()}"
    client = f"http://127.0.0.1:{client_port}"
    return [
        "--name=gatekeeper-test",
        f"--data-dir={work_dir / 'etcd'}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=gatekeeper-test={peer}",
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


def _apiserver_args(work_dir: Path, port: int, etcd_port: int) -> list[str]:
    return [
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        # The kubernetes Service's endpoints may not name a loopback address; no pod here
        # reaches the apiserver through that Service anyway.
        "--endpoint-reconciler-type=none",
        f"--secure-port={port}",
        f"--tls-cert-file={work_dir / 'apiserver.crt'}",
        f"--tls-private-key-file={work_dir / 'apiserver.key'}",
        f"--token-auth-file={work_dir / 'tokens.csv'}",
        "--authorization-mode=RBAC",
        "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-account-key-file={work_dir / 'sa.pub'}",
        f"--service-account-signing-key-file={work_dir / 'sa.key'}",
        "--service-cluster-ip-range=10.96.0.0/24",
        "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
        f"--feature-gates={FEATURE_GATES}",
        f"--cert-dir={work_dir / 'apiserver-certs'}",
    ]


def _controller_args(work_dir: Path, kubeconfig: Path, port: int, extra: list[str]) -> list[str]:
    """Flags the scheduler and the controller manager share."""
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={work_dir / 'certs'}",
        "--leader-elect=false",
        f"--feature-gates={FEATURE_GATES}",
        *extra,
    ]


def _wait(
    cluster: KubeCluster,
    component: Component,
    probe: Callable[[], object],
    what: str,
    deadline: float,
) -> None:
    """Calls ``probe`` until it raises no URL or OS error, or fails with the logs when
    ``component`` exits or ``deadline`` passes."""
    while time.monotonic() < deadline:
        if component.proc.poll() is not None:
            raise RuntimeError(
                f"{component.name} exited with {component.proc.returncode} while starting:\n"
                f"{cluster.logs()}"
            )
        with contextlib.suppress(urllib.error.URLError, OSError):
            probe()
            return
        time.sleep(0.2)
    raise RuntimeError(f"{component.name} was not ready in time ({what}):\n{cluster.logs()}")


def _wait_ready(cluster: KubeCluster, component: Component, path: str, deadline: float) -> None:
    """Polls ``path`` on the apiserver until it answers 200, or fails with the logs."""
    _wait(cluster, component, lambda: cluster.get(path), path, deadline)


def _wait_local(cluster: KubeCluster, component: Component, port: int, deadline: float) -> None:
    """Polls a component's own ``/healthz`` (self-signed, so unverified) until 200."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    url = f"https://127.0.0.1:{port}/healthz"

    def probe() -> None:
        urllib.request.urlopen(url, context=context, timeout=2).close()

    _wait(cluster, component, probe, url, deadline)


def start_cluster(
    bin_dir: Path, work_dir: Path, apiserver_flags: Sequence[str] = ()
) -> KubeCluster:
    """Starts etcd, the apiserver (with ``apiserver_flags`` besides its own, e.g.
    ``--admission-control-config-file``), the scheduler and the controller manager, each
    ready."""
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    port, etcd_port = free_port(), free_port()
    server = f"https://127.0.0.1:{port}"
    token, ca_path, kubeconfig = _write_credentials(work_dir, server)
    cluster = KubeCluster(server, token, ca_path, kubeconfig, work_dir)
    try:
        start = [("etcd", _etcd_args(work_dir, etcd_port))]
        apiserver = [*_apiserver_args(work_dir, port, etcd_port), *apiserver_flags]
        start.append(("kube-apiserver", apiserver))
        for name, args in start:
            cluster.components.append(_spawn(bin_dir, work_dir, name, args))
        _wait_ready(cluster, cluster.components[-1], "/readyz", deadline)
        controllers = [
            ("kube-scheduler", []),
            ("kube-controller-manager", [f"--controllers={CONTROLLERS}"]),
        ]
        for name, extra in controllers:
            local = free_port()
            args = _controller_args(work_dir / name, kubeconfig, local, extra)
            component = _spawn(bin_dir, work_dir, name, args)
            component.port = local
            cluster.components.append(component)
            _wait_local(cluster, component, local, deadline)
    except BaseException:
        cluster.stop()
        raise
    return cluster
