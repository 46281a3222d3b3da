"""The public API: the package's core API, each wing's face, and what they cost to import.

The layering and purity rules themselves are import-linter contracts in
``pyproject.toml`` (``lint-imports``, run by ``make test``)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
import subprocess
import sys
import tomllib
import types
from pathlib import Path

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
    assert flat == ["__main__", "_lazy", "_version", "errors", "settings", "units"]


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


def _lazy_faces() -> list[str]:
    faces = [f"gatekeeper.{m.name}" for m in pkgutil.iter_modules(gatekeeper.__path__) if m.ispkg]
    return sorted(
        name
        for name in ["gatekeeper", *faces]
        if "face(" in Path(importlib.util.find_spec(name).origin).read_text()  # type: ignore[union-attr, arg-type]
    )


def _checked(name: str) -> dict[str, set[str]]:
    """What a lazy face's ``if TYPE_CHECKING:`` block imports: module -> names."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None
    checked: dict[str, set[str]] = {}
    for node in ast.parse(Path(spec.origin).read_text()).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.module, ast.unparse(imp)
                checked.setdefault(imp.module, set()).update(a.name for a in imp.names)
    return checked


def test_the_lazy_faces_are_found():
    assert {"gatekeeper", "gatekeeper.cli", "gatekeeper.vllm", "gatekeeper.placement"} <= set(
        _lazy_faces()
    )


@pytest.mark.parametrize("name", _lazy_faces())
def test_a_lazy_face_gives_each_name_it_imports_for_type_checkers(name):
    """The names under ``if TYPE_CHECKING:`` (what type checkers and ``lint-imports``
    see, and what ``face`` reads) are ``__all__`` but for the names the face defines
    itself, and each resolves to its module's own object."""
    checked = _checked(name)
    lazy = set().union(*checked.values())
    face = importlib.import_module(name)
    eager = {n for n in face.__all__ if n in vars(face) and n not in lazy}
    assert set(face.__all__) - eager == lazy
    for module, names in checked.items():
        for attr in names:
            assert getattr(face, attr) is getattr(importlib.import_module(module), attr)
            assert attr in dir(face)
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        _ = face.no_such_name


@pytest.mark.parametrize(
    ("module", "not_loaded"),
    [
        ("gatekeeper.vllm.launch", ["gatekeeper.vllm.log", "gatekeeper.vllm.command", "yaml"]),
        ("gatekeeper.placement.policy", ["gatekeeper.placement.decision", "gatekeeper.vllm"]),
        ("gatekeeper.estimator.options", ["gatekeeper.placement", "gatekeeper.estimator.plan"]),
        ("gatekeeper.cli", ["gatekeeper.cli.entry", "gatekeeper.settings", "pydantic"]),
    ],
)
def test_a_submodule_loads_without_its_siblings(module, not_loaded):
    """Importing one module of a wing runs the wing's face, which no longer imports
    every sibling (#39: ``gatekeeper.vllm.launch`` loaded the log reader and YAML)."""
    code = f"import sys, {module}\nprint(sorted(m for m in {not_loaded!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_console_script_runs_main_with_the_collector_on_and_the_import_frozen():
    """``gatekeeper`` (the installed script) is ``gatekeeper.cli.console:main``: the
    command's modules load with the collector off and are frozen after, and the command
    runs with the collector on (``serve`` lives for days)."""
    pyproject = tomllib.loads((Path(gatekeeper.__file__).parents[1] / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["gatekeeper"] == "gatekeeper.cli.console:main"
    code = (
        "import gc, sys\n"
        "import gatekeeper.cli.entry as entry\n"
        "seen = []\n"
        "entry._run = lambda argv: seen.append((gc.isenabled(), gc.get_freeze_count())) or 0\n"
        "from gatekeeper.cli.console import main\n"
        "sys.argv = ['gatekeeper', 'models']\n"
        "assert main() == 0\n"
        "print(seen)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    ((enabled, frozen),) = ast.literal_eval(out.stdout.strip())
    assert enabled and frozen > 1000
