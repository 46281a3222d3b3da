"""The public API: what ``gatekeeper`` and its modules export."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import gatekeeper

MODULES = [
    "gatekeeper.accounting", "gatekeeper.catalog", "gatekeeper.estimate", "gatekeeper.gpu_table",
    "gatekeeper.hf_config", "gatekeeper.kv_cache", "gatekeeper.model_source", "gatekeeper.model_spec",
    "gatekeeper.overhead", "gatekeeper.quantization", "gatekeeper.safetensors_header",
    "gatekeeper.serve_options", "gatekeeper.settings", "gatekeeper.simple_method",
    "gatekeeper.units", "gatekeeper.weights", "gatekeeper.placement", "gatekeeper.placement_hints",
    "gatekeeper.vllm_flags", "gatekeeper.plan", "gatekeeper.admission", "gatekeeper.ledger",
    "gatekeeper.ledger_view", "gatekeeper.cli_options", "gatekeeper.vision", "gatekeeper.metrics",
    "gatekeeper.worker_metrics", "gatekeeper.event_metrics", "gatekeeper.calibration",
    "gatekeeper.launcher", "gatekeeper.vllm_log", "gatekeeper.deployments", "gatekeeper.routing",
    "gatekeeper.admin_api", "gatekeeper.app", "gatekeeper.proxy", "gatekeeper.model_registry",
    "gatekeeper.webhook", "gatekeeper.admission_review", "gatekeeper.webhook_fit",
    "gatekeeper.k8s_workloads", "gatekeeper.vllm_command",
    "gatekeeper.rehearsal", "gatekeeper.deployment", "gatekeeper.placement_types", "gatekeeper.upstream", "gatekeeper.relay", "gatekeeper.openai_errors",
    "gatekeeper.simulator", "gatekeeper.simulator_http", "gatekeeper.simulator_nvml",
    # GPU inventory (#3)
    "gatekeeper.attribution", "gatekeeper.commands_gpus", "gatekeeper.cuda_devices",
    "gatekeeper.declared", "gatekeeper.gpus", "gatekeeper.nvml", "gatekeeper.proctree",
]  # fmt: skip


def test_package_all_is_sorted_and_resolves():
    # isort-style, as ruff's RUF022 keeps it: classes sorted first, then other names.
    classes = [n for n in gatekeeper.__all__ if n[0].isupper()]
    others = [n for n in gatekeeper.__all__ if not n[0].isupper()]
    assert gatekeeper.__all__ == sorted(classes) + sorted(others)
    assert len(set(gatekeeper.__all__)) == len(gatekeeper.__all__)
    for name in gatekeeper.__all__:
        assert hasattr(gatekeeper, name), name


@pytest.mark.parametrize("module_name", MODULES)
def test_module_all_resolves(module_name):
    module = importlib.import_module(module_name)
    assert module.__all__, module_name
    for name in module.__all__:
        assert hasattr(module, name), f"{module_name}.{name}"


def test_pure_core_imports_no_io_libraries():
    for name in (
        "estimate",
        "weights",
        "kv_cache",
        "overhead",
        "quantization",
        "hf_config",
        "placement",
        "placement_hints",
        "vllm_flags",
    ):
        source = importlib.import_module(f"gatekeeper.{name}").__file__
        assert source is not None
        text = Path(source).read_text()
        for banned in ("import os", "import httpx", "import pynvml", "import asyncio", "open("):
            assert banned not in text, f"{name} uses {banned}"
