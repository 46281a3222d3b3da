"""Package faces that load a submodule when one of its names is first used (PEP 562).

A face such as ``gatekeeper.vllm`` gathers the names of its submodules. Imported eagerly,
it loads every submodule whenever any one is needed: ``from gatekeeper.vllm.launch import
LaunchFlags`` ran ``gatekeeper/vllm/__init__.py`` first, and with it the command-line
reader, the log reader and YAML. The ``gatekeeper`` command pays for that on every start
(#39: ``gatekeeper estimate`` loaded the placement search, the log reader and YAML, none
of which it uses). A lazy face lists where each name lives; ``from gatekeeper.vllm import
LaunchFlags`` still works, and loads ``gatekeeper.vllm.launch`` only.

Each face keeps the same names under ``if TYPE_CHECKING:`` as plain imports, for type
checkers and for the import contracts (``lint-imports`` reads them);
``tests/test_public_api.py`` holds the two lists and ``__all__`` to the same names.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

__all__ = ["face"]


def face(
    package: MutableMapping[str, Any], exports: Mapping[str, Sequence[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of a package whose ``globals()`` is
    ``package``: ``exports`` maps each module (its full name) to the names it gives the
    face. A name is imported from its submodule on first use and then kept in the
    package's namespace, so later lookups cost nothing."""
    name = str(package["__name__"])
    home = {attr: module for module, attrs in exports.items() for attr in attrs}

    def __getattr__(attr: str) -> Any:
        module = home.get(attr)
        if module is None:
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        value = getattr(importlib.import_module(module), attr)
        package[attr] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*package, *home})

    return __getattr__, __dir__
