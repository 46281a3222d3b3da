"""``gatekeeper gpus`` in this process: declared nodes, NVML through the stand-in."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from gatekeeper.cli import gpus as commands_gpus
from gatekeeper.gpus.declared import DeclaredNodeError
from gatekeeper.gpus.inventory import GpuInfo, GpuProcess, InventorySnapshot
from gatekeeper.gpus.stand_in import FakeFailure, FakeNvml, h100
from gatekeeper.settings import Settings

FIXTURES = Path(__file__).parents[1] / "fixtures" / "gpus"


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gatekeeper")
    commands_gpus.add_parser(parser.add_subparsers())
    return parser.parse_args(["gpus", *argv])


def test_parser_defaults() -> None:
    args = _args()
    assert (args.json, args.node, args.func) == (False, None, commands_gpus.run)


def test_declared_node_table(capsys: pytest.CaptureFixture[str]) -> None:
    code = commands_gpus.run(_args("--node", "2xH100-80GB"), Settings())
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[0] == "source: declared, 2 GPUs"
    assert out[2].split() == [
        "0", "H100-80GB", "79.19", "GiB", "n/a", "0.00", "GiB", "79.19", "GiB", "0.00", "GiB", "ok", "-"
    ]  # fmt: skip


def test_setting_names_the_source(capsys: pytest.CaptureFixture[str]) -> None:
    code = commands_gpus.run(_args("--json"), Settings(gpus="1xL4"))
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and [g["name"] for g in data["gpus"]] == ["L4"]


def test_bad_declared_node_raises_for_the_cli_to_report() -> None:
    with pytest.raises(DeclaredNodeError, match="'2xWHAT' is not in the GPU table"):
        commands_gpus.run(_args("--node", "2xWHAT"), Settings())


def test_nvml_through_the_stand_in(
    fake_nvml: FakeNvml, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_nvml.set(gpus=[h100(0), h100(1)], failures=[FakeFailure(15, gpu=1)])
    code = commands_gpus.run(_args(), Settings(gpus="nvml"))
    out = capsys.readouterr().out
    assert code == 0
    assert "UNHEALTHY" in out
    assert (
        "gpu 1: unhealthy: NVML_ERROR_GPU_IS_LOST (GPU is lost) from "
        "nvmlDeviceGetHandleByIndex_v2; not offered for placement (check `nvidia-smi -q -i 1`"
    ) in out


def test_nvml_failure_exits_2_like_check(
    fake_nvml: FakeNvml, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_nvml.set(gpus=[h100(0)], failures=[FakeFailure(9, symbol="nvmlInitWithFlags")])
    code = commands_gpus.run(_args(), Settings(gpus="nvml"))
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""  # the gpus setting does not fit this machine
    assert captured.err.startswith("gatekeeper: error: NVML is unavailable")


def test_recorded_snapshot_table(capsys: pytest.CaptureFixture[str]) -> None:
    code = commands_gpus.run(_args("--node", str(FIXTURES / "h100_mig_lost_x4.json")), Settings())
    out = capsys.readouterr().out
    assert code == 0
    assert "gpu 1: fenced: MIG mode is enabled" in out
    assert "gpu 2: unhealthy: NVML_ERROR_GPU_IS_LOST" in out


def test_format_table_of_an_empty_and_a_failed_snapshot() -> None:
    assert commands_gpus.format_table(InventorySnapshot(gpus=(), ok=True)).endswith("no GPUs")
    failed = commands_gpus.format_table(InventorySnapshot(gpus=(), ok=False, error="boom"))
    assert failed.splitlines()[-1] == "error: boom"


def test_format_table_shows_unreported_usage() -> None:
    gpu = GpuInfo(0, "u", "L4", "", 10, 5, 5, processes=(GpuProcess(9, None),))
    table = commands_gpus.format_table(InventorySnapshot(gpus=(gpu,), ok=True))
    assert "9 (n/a)" in table


def test_gatekeepers_reservations_show_in_the_table(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gatekeeper.sidecar.ledger import Ledger, Promise, ledger_path

    with Ledger(ledger_path(tmp_path)) as ledger:
        ledger.admit(
            "d1",
            "m",
            lambda outstanding: (None, (Promise("DECLARED-1", 3 * 2**30),)),
            ttl_seconds=600,
        )
    settings = Settings(gpus="2xH100-80GB", state_dir=tmp_path)
    assert commands_gpus.run(_args(), settings) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[3].split()[9:11] == ["3.00", "GiB"]
