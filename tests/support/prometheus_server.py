"""A real Prometheus on 127.0.0.1 for tests: ``run_prometheus(targets, work_dir)``.

Debian's ``prometheus`` package (2.42) brings ``prometheus`` and ``promtool`` and starts
no daemon. ``/-/ready`` answers within 0.2 s, but the first sample arrives 5-6 s after
start even with a 1 s scrape interval, so ``run_prometheus`` polls the query API until
``min_scrapes`` scrapes of ``up`` are stored (bounded by ``timeout_seconds``).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

MISSING = [tool for tool in ("prometheus", "promtool") if shutil.which(tool) is None]
SKIP_REASON = (
    f"{' and '.join(MISSING)} not installed: apt-get install --no-install-recommends prometheus"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def run_prometheus(
    targets: Sequence[str],
    work_dir: Path,
    *,
    rule_files: Sequence[Path] = (),
    min_scrapes: int = 3,
    timeout_seconds: float = 45.0,
    scrape_configs: Sequence[dict[str, Any]] = (),
) -> Iterator[httpx.Client]:
    """Prometheus scraping ``targets`` (``host:port``) every second, as the job
    ``gatekeeper``, and the further jobs of ``scrape_configs``; yields a client on its
    HTTP API once ``min_scrapes`` scrapes are stored (rate() needs two)."""
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {"job_name": "gatekeeper", "static_configs": [{"targets": list(targets)}]},
            *scrape_configs,
        ],
    }
    (work_dir / "prometheus.yml").write_text(yaml.safe_dump(config))
    log_path = work_dir / "prometheus.log"
    port = free_port()
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={work_dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={work_dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10.0)
        try:
            _wait_for_scrapes(client, process, log_path, min_scrapes, timeout_seconds)
            yield client
        finally:
            client.close()
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_for_scrapes(
    client: httpx.Client,
    process: subprocess.Popen[bytes],
    log: Path,
    min_scrapes: int,
    timeout_seconds: float,
) -> None:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(
                f"prometheus exited with code {process.returncode}:\n{log.read_text()[-3000:]}"
            )
        if stored_scrapes(client) >= min_scrapes:
            return
        time.sleep(0.25)
    pytest.fail(f"prometheus stored no samples in {timeout_seconds} s:\n{log.read_text()[-3000:]}")


def stored_scrapes(client: httpx.Client) -> int:
    """Successful scrapes stored in the last minute (the fewest over the targets); 0
    while Prometheus is starting (connection refused, or 503 until storage is ready)."""
    try:
        response = client.get("/api/v1/query", params={"query": "min(sum_over_time(up[1m]))"})
    except httpx.TransportError:
        return 0
    if response.status_code != 200:
        return 0
    result = response.json()["data"]["result"]
    return int(float(result[0]["value"][1])) if result else 0


def query(client: httpx.Client, expr: str) -> list[dict[str, Any]]:
    """An instant query that must succeed (HTTP 200, status success); its series."""
    response = client.get("/api/v1/query", params={"query": expr})
    assert response.status_code == 200, f"{expr}: HTTP {response.status_code} {response.text}"
    body = response.json()
    assert body["status"] == "success", f"{expr}: {body}"
    result: list[dict[str, Any]] = body["data"]["result"]
    return result
