"""The public API: the package's core API, each wing's face, and what they cost to import.

The layering and purity rules themselves are import-linter contracts in
``pyproject.toml`` (``lint-imports``, run by ``make test``)."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
import types

import pytest

import gatekeeper

WINGS = [
    "models", "estimator", "placement", "gpus", "vllm", "sidecar", "proxy", "metrics", "k8s",
    "simulator", "cli",
]  # fmt: skip
CORE_API = {
    "estimate", "simple_estimate", "decide", "ModelSpec", "ServeOptions", "Estimate",
    "GpuTarget", "Decision", "PlacementRequest", "PlacementPolicy", "GpuInfo", "GpuInventory",
    "InventorySnapshot", "StaticInventory", "resolve_model", "GatekeeperError", "__version__",
}  # fmt: skip


def _sorted_like_ruff(names: list[str]) -> bool:
    # isort-style, as ruff's RUF022 keeps it: constants, classes, then other names.
    consts = [n for n in names if n.isupper() or (n[0].isupper() and n.replace("_", "").isupper())]
    classes = [n for n in names if n[0].isupper() and n not in consts]
    others = [n for n in names if not n[0].isupper()]
    return names == sorted(consts) + sorted(classes) + sorted(others)


def test_package_all_is_the_core_api_sorted_and_resolving():
    assert set(gatekeeper.__all__) >= CORE_API
    assert _sorted_like_ruff(gatekeeper.__all__)
    for name in gatekeeper.__all__:
        assert hasattr(gatekeeper, name), name
    assert callable(gatekeeper.estimate) and callable(gatekeeper.decide)


def test_package_docstring_example_runs():
    import doctest

    result = doctest.testmod(gatekeeper)
    assert result.attempted >= 5 and result.failed == 0


@pytest.mark.parametrize("wing", WINGS)
def test_each_wing_has_a_face_that_says_what_it_may_import(wing):
    face = importlib.import_module(f"gatekeeper.{wing}")
    doc = face.__doc__ or ""
    assert len(doc.splitlines()) >= 5, f"gatekeeper.{wing} has no docstring worth the name"
    assert "import" in doc, f"gatekeeper.{wing}'s docstring does not say what it may import"
    assert face.__all__ and _sorted_like_ruff(list(face.__all__)), wing
    for name in face.__all__:
        assert hasattr(face, name), f"gatekeeper.{wing}.{name}"


def _modules() -> list[str]:
    return sorted(
        m.name
        for m in pkgutil.walk_packages(gatekeeper.__path__, "gatekeeper.")
        if not m.name.endswith("__main__")
    )


@pytest.mark.parametrize("module_name", _modules())
def test_every_module_all_is_defined_there(module_name):
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None)
    assert names is not None, f"{module_name} has no __all__"
    is_face = module.__file__ is not None and module.__file__.endswith("__init__.py")
    for name in names:
        assert hasattr(module, name), f"{module_name}.{name}"
        value = getattr(module, name)
        if not is_face and isinstance(value, type | types.FunctionType):
            # a module exports what it defines, so that every name has one home
            assert value.__module__ == module_name, f"{module_name} re-exports {name}"


@pytest.mark.parametrize("module_name", _modules())
def test_a_package_attribute_named_like_a_submodule_is_that_submodule(module_name):
    """``import gatekeeper.a.b as m`` binds the module ``gatekeeper.a.b``: no name of a
    package's face hides a submodule (``gatekeeper.estimate``, the function, once hid the
    estimator's subpackage of the same name; so did ``placement.decide``,
    ``placement.search`` and ``cli.main``)."""
    parent, _, leaf = module_name.rpartition(".")
    module = importlib.import_module(module_name)
    found = getattr(importlib.import_module(parent), leaf)
    assert found is module, f"{parent}.{leaf} is {type(found).__name__}, not the module"


def test_the_layout_keeps_at_most_a_handful_of_flat_modules():
    flat = sorted(m.name for m in pkgutil.iter_modules(gatekeeper.__path__) if not m.ispkg)
    assert flat == ["__main__", "_version", "errors", "settings", "units"]


def test_importing_the_core_loads_no_http_nvml_or_prometheus_library():
    code = (
        "import sys, gatekeeper\n"
        "heavy = ('httpx', 'httpx2', 'starlette', 'uvicorn', 'pynvml', 'prometheus_client',"
        " 'huggingface_hub', 'sqlite3', 'lightkube')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_console_entry_points_keep_their_names():
    from gatekeeper.cli import main

    assert callable(main)
    for module in ("gatekeeper", "gatekeeper.simulator"):
        out = subprocess.run(
            [sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        assert "usage:" in out.stdout
