"""gatekeeper's meta builder (``gatekeeper/vllm/meta_build.py``) as a module, for the
harnesses that run in the vLLM environment (where ``gatekeeper`` itself is not
installed): loaded from its file once per process, under one name, so that every
harness shares its stand-ins and its one-process distributed world."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

__all__ = ["PATH", "load"]

PATH = Path(__file__).resolve().parents[2] / "gatekeeper" / "vllm" / "meta_build.py"
_NAME = "gatekeeper_meta_build"


def load() -> Any:
    if _NAME in sys.modules:
        return sys.modules[_NAME]
    spec = importlib.util.spec_from_file_location(_NAME, PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module
    spec.loader.exec_module(module)
    return module
