"""Package faces that load a submodule when one of its names is first used (PEP 562).

A face such as ``gatekeeper.vllm`` gathers the names of its submodules. Imported eagerly,
it loads every submodule whenever any one is needed: ``from gatekeeper.vllm.launch import
LaunchFlags`` ran ``gatekeeper/vllm/__init__.py`` first, and with it the command-line
reader, the log reader and YAML. The ``gatekeeper`` command paid for that on every start
(#39: ``gatekeeper estimate`` loaded the placement search, the log reader and YAML, none
of which it uses). A lazy face imports its names under ``if TYPE_CHECKING:`` only, which
is what type checkers and the import contracts (``lint-imports``) read; ``face`` reads
the same block from the face's source, once, when a name is first asked for, so
``from gatekeeper.vllm import LaunchFlags`` still works, and loads ``gatekeeper.vllm.launch``
only. ``tests/test_public_api.py`` holds the block to ``__all__``.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable, MutableMapping
from functools import cache
from typing import Any

__all__ = ["face"]


def face(package: MutableMapping[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of the package whose ``globals()`` is
    ``package``: each name its ``if TYPE_CHECKING:`` block imports is imported from that
    module on first use, then kept in the package's namespace, so later lookups cost
    nothing."""
    name = str(package["__name__"])

    @cache
    def homes() -> dict[str, str]:
        source = package["__loader__"].get_source(name)
        if source is None:
            raise ImportError(f"{name}: its names are read from its source, which is missing")
        found: dict[str, str] = {}
        for node in ast.parse(source).body:
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
                for imp in node.body:
                    if isinstance(imp, ast.ImportFrom) and imp.module:
                        found.update(dict.fromkeys((a.name for a in imp.names), imp.module))
        return found

    def __getattr__(attr: str) -> Any:
        module = homes().get(attr)
        if module is None:
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        value = getattr(importlib.import_module(module), attr)
        package[attr] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*package, *homes()})

    return __getattr__, __dir__
