"""Each command imports what it uses and no more (#39 item 5): the installed ``gatekeeper``
runs ``estimate`` and ``check`` on catalog models and declared GPUs, and ``--help``, with
``PYTHONPROFILEIMPORTTIME=1`` (``python -X importtime``: every module the run imports,
lazily inside a function too, one line on stderr); none of them may load an HTTP server
or client, a Kubernetes client, Prometheus, NVML, SQLite or a module of the sidecar, the
webhooks, the cluster wing, the proxy or the metrics. ``asyncio`` itself is not held
out: pydantic-settings imports it with the settings every command reads.

``bench/cli_start.py`` times the same commands."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

GATEKEEPER = Path(sys.executable).parent / "gatekeeper"

SERVER_STACK = (
    "uvicorn", "starlette", "granian", "uvloop", "httptools", "h11", "httpx", "anyio",
    "http.server", "socketserver", "wsgiref", "prometheus_client", "lightkube", "kubernetes",
    "pynvml", "sqlite3", "gatekeeper.sidecar", "gatekeeper.k8s", "gatekeeper.cluster",
    "gatekeeper.proxy", "gatekeeper.metrics", "gatekeeper.simulator",
)  # fmt: skip
"""Packages (with their submodules) that no planning command loads."""

LEDGER = frozenset(
    {"sqlite3", "sqlite3.dbapi2", "gatekeeper.sidecar"}
    | {f"gatekeeper.sidecar.{m}" for m in ("ledger", "ledger_file", "ledger_view")}
)
"""What ``check`` on the node's own GPUs loads besides: the sidecar's ledger (SQLite),
without the rest of the sidecar (its face imports each name when first asked)."""

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def imported(args: list[str], tmp_path: Path, code: int = 0, **env: str) -> tuple[set[str], str]:
    """The modules the installed command imports, and its stdout; it exits with ``code``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GATEKEEPER_", "HF_"))}
    environ = {
        **clean,
        "PYTHONPROFILEIMPORTTIME": "1",
        "GATEKEEPER_STATE_DIR": str(tmp_path / "state"),
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        **env,
    }
    result = subprocess.run(
        [str(GATEKEEPER), *args], env=environ, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == code, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("import time:")]
    names = {line.rsplit("|", 1)[1].strip() for line in lines[1:]}  # [0] is the header
    assert "gatekeeper.cli.entry" in names, result.stderr[-2000:]
    return names, result.stdout


def held_out(names: set[str], allowed: frozenset[str] = frozenset()) -> list[str]:
    """The modules of ``SERVER_STACK`` (or their submodules) among ``names``, but for
    those ``allowed``."""
    stack = (n for n in names if any(n == p or n.startswith(f"{p}.") for p in SERVER_STACK))
    return sorted(n for n in stack if n not in allowed)


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["estimate", MODEL, "--gpu", "H100-80GB"], 0),
        (["check", MODEL, "--node", "2xH100-80GB"], 0),
        (["check", MODEL, "--node", "1xL4", "--max-model-len", "131072"], 1),
        (["--help"], 0),
    ],
    ids=["estimate", "check", "check-rejected", "help"],
)
def test_planning_commands_load_no_server_stack(args: list[str], code: int, tmp_path: Path):
    names, _ = imported(args, tmp_path, code)
    assert held_out(names) == []


def test_check_on_the_settings_gpus_reads_the_ledger_alone(tmp_path: Path):
    """``check`` on the settings' GPUs (no ``--node``) reads what the sidecar's ledger
    promises: SQLite and ``sidecar.ledger``, never the sidecar's app or HTTP stack."""
    names, out = imported(["check", MODEL], tmp_path, GATEKEEPER_GPUS="2xH100-80GB")
    assert out.startswith("ADMITTED")
    assert held_out(names, LEDGER) == []


def test_the_probe_sees_a_lazy_import(tmp_path: Path):
    """The probe is not blind to imports made inside a function: ``ps`` imports its HTTP
    client when it calls the sidecar (here an address where none listens: exit 3)."""
    args = ["ps", "--url", "http://127.0.0.1:1"]
    names, _ = imported(args, tmp_path, 3, GATEKEEPER_ADMIN_TOKEN="t")
    assert "httpx" in held_out(names)
    assert not [n for n in names if n.startswith("gatekeeper.sidecar")]


ESTIMATE_NEEDS_NONE_OF = (
    "yaml", "gatekeeper.placement.decision", "gatekeeper.placement.gpu_search",
    "gatekeeper.placement.plan", "gatekeeper.placement.types", "gatekeeper.vllm.log",
    "gatekeeper.vllm.command", "gatekeeper.vllm.launch",
)  # fmt: skip
"""What ``estimate`` on a catalog model never uses: placement (``check``/``plan`` load it
when they run), the worker log reader, the container command reader, YAML (read only for
a ``--config FILE.yaml``)."""


def test_estimate_loads_no_placement_and_no_yaml(tmp_path: Path):
    names, out = imported(["estimate", MODEL, "--gpu", "H100-80GB"], tmp_path)
    assert "GiB" in out
    assert sorted(names & set(ESTIMATE_NEEDS_NONE_OF)) == []


def test_a_yaml_config_still_loads_yaml(tmp_path: Path):
    """The other side of the above: ``--config FILE.yaml`` reads its flags with YAML."""
    config = tmp_path / "serve.yaml"
    config.write_text("max-model-len: 4096\n")
    names, out = imported(
        ["estimate", MODEL, "--gpu", "H100-80GB", "--config", str(config)], tmp_path
    )
    assert "yaml" in names and "4096" in out


def test_each_command_is_added_by_the_module_commands_names():
    """``gatekeeper.cli.entry.COMMANDS`` says which module adds each command, so that a
    start builds (and imports) only the one it runs; it holds them all, each where it is."""
    import argparse

    from gatekeeper.cli.entry import COMMANDS, build_parser

    def commands(parser: argparse.ArgumentParser) -> list[str]:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return list(sub.choices)

    everything = commands(build_parser())
    assert sorted(everything) == sorted(COMMANDS)
    for command, module in COMMANDS.items():
        alone = commands(build_parser(command))
        if command == "completion":
            assert alone == everything  # it completes every command
        else:
            assert command in alone
            assert sorted(alone) == sorted(c for c, m in COMMANDS.items() if m == module)
    assert commands(build_parser("no-such-command")) == everything


def test_estimate_imports_no_other_command(tmp_path: Path):
    names, _ = imported(["estimate", MODEL, "--gpu", "H100-80GB"], tmp_path)
    others = {"check", "serve", "operator", "webhook", "agent", "gpus", "completion"}
    assert sorted(n for n in names if n in {f"gatekeeper.cli.{m}" for m in others}) == []
