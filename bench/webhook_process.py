"""``gatekeeper webhook`` as its own process over TLS on loopback, for tests that put it
behind a real webhook configuration (the apiserver calls it) or kill it, and for
``python -m bench.cluster``. ``tests/support/webhook_process.py`` re-exports it.

``start_webhook(directory, *flags)`` makes a CA and a serving certificate for 127.0.0.1 in
``directory``, starts ``python -m gatekeeper webhook`` on a free port with no
``GATEKEEPER_*`` variable of the caller's environment (its state in ``directory``), waits
for ``/healthz`` and returns the running process; ``url(path)`` is what a configuration's
``clientConfig.url`` names and ``ca_bundle`` its ``caBundle``.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.serve_process import free_port
from bench.tls_certs import Authority, issue, make_ca

START_SECONDS = 30.0


@dataclass
class WebhookProcess:
    """A started ``gatekeeper webhook``."""

    process: subprocess.Popen[bytes]
    port: int
    ca_pem: bytes
    log: Path
    ca: Authority
    """The CA that issued its certificate (``directory/tls.crt``): a test renews with it."""
    client: tuple[Path, Path] | None = None
    """The client certificate and key it is given (``--client-ca-file``), if any."""

    def context(self, client: tuple[Path, Path] | None = None) -> ssl.SSLContext:
        """A client's TLS context trusting its CA, presenting ``client`` (a certificate and
        its key) when given."""
        context = ssl.create_default_context(cadata=self.ca_pem.decode())
        if client is not None:
            context.load_cert_chain(*client)
        return context

    @property
    def ca_bundle(self) -> str:
        """The CA certificate as a configuration's ``clientConfig.caBundle``."""
        return base64.b64encode(self.ca_pem).decode()

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}{path}"

    def kill(self) -> None:
        """SIGKILL, as a node failure or the OOM killer ends it (no graceful close)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        self.process.wait(timeout=10)


def _ready(webhook: WebhookProcess) -> bool:
    """Polls ``/healthz`` until 200 (True) or the process exits or time runs out (False)."""
    context = webhook.context(webhook.client)
    deadline = time.monotonic() + START_SECONDS
    with httpx.Client(verify=context, timeout=2) as client:
        while time.monotonic() < deadline and webhook.process.poll() is None:
            with contextlib.suppress(httpx.TransportError):
                if client.get(webhook.url("/healthz")).status_code == 200:
                    return True
            time.sleep(0.05)
    return False


def start_webhook(
    directory: Path,
    *flags: str,
    env: Mapping[str, str] | None = None,
    client: tuple[Path, Path] | None = None,
    port: int | None = None,
) -> WebhookProcess:
    """``gatekeeper webhook`` with ``flags`` (``--mutate``, ``--kubeconfig F``) and the
    settings in ``env`` (``GATEKEEPER_*``), serving TLS on 127.0.0.1 (``port``, else a free
    one), ready (asked with the ``client`` certificate and key when flags require one);
    raises RuntimeError with its log when it does not start."""
    ca = make_ca(directory)
    cert, key = directory / "tls.crt", directory / "tls.key"
    issue(ca, cert, key)
    port = port or free_port()
    settings = dict(env or {})
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEKEEPER_")}
    env |= {"GATEKEEPER_STATE_DIR": str(directory / "state"), "PYTHONUNBUFFERED": "1"}
    env |= settings
    argv = [sys.executable, "-m", "gatekeeper", "webhook", "--cert", str(cert), "--key",
            str(key), "--host", "127.0.0.1", "--port", str(port), *flags]  # fmt: skip
    log = directory / "webhook.log"
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    webhook = WebhookProcess(process, port, ca.path.read_bytes(), log, ca, client)
    if not _ready(webhook):
        webhook.kill()
        raise RuntimeError(f"gatekeeper webhook did not start: {log.read_text()}")
    return webhook
