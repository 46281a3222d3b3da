"""Ask an installed vLLM how much weight a model takes: ``--weights-from vllm[=PYTHON]``.

Where a vLLM environment is at hand (the one the sidecar's ``worker_command`` runs, or a
Python named outright), gatekeeper runs ``meta_build.py`` beside this file under that
environment's Python: vLLM builds the model on the meta device as ``vllm serve`` would
(its model class, quantization config and ``create_weights`` per module, at the
deployment's TP size) and lists every tensor one rank holds. Nothing is allocated, on the
GPU or anywhere: the child runs with ``CUDA_VISIBLE_DEVICES`` empty, and meta tensors
have no storage. A family newer than gatekeeper's own tables is still sized exactly.

The answer is cached on disk (``cache_dir``) per config file contents (so per model and
revision), quantization, dtype, TP size, ``--hf-overrides``, vLLM release and builder; a
cached look-up reads one JSON file. A first look-up costs one vLLM import and build
(about 10-20 s on 2 CPU cores for the CPU build; ``docs/estimator.md`` has the figures),
bounded by ``timeout``. Any failure (no such Python, no vLLM there, vLLM refusing the
config, the bound) raises ``MetaBuildError`` with the reason; callers fall back to the
pure estimate and say so.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gatekeeper.errors import GatekeeperError
from gatekeeper.models.built_weights import BuiltTensor, BuiltWeights

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "META_BUILD",
    "MetaBuildError",
    "MetaBuildRequest",
    "build_weights",
    "default_cache_dir",
    "vllm_python",
]

META_BUILD = Path(__file__).with_name("meta_build.py")
DEFAULT_TIMEOUT_S = 300.0
_VERSION_PROBE = "from importlib.metadata import version; print(version('vllm'))"


class MetaBuildError(GatekeeperError):
    """An installed vLLM could not build the model on the meta device."""


@dataclass(frozen=True, slots=True)
class MetaBuildRequest:
    """What vLLM is asked to build: the model's ``config.json`` (a file, or its contents
    for a model read from the catalog) and the flags that change its weights."""

    config_path: Path | None
    config: Mapping[str, Any] | None = None
    quantization: str | None = None
    dtype: str = "auto"
    tensor_parallel_size: int = 1
    hf_overrides: Mapping[str, Any] | None = None
    trust_remote_code: bool = False


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/gatekeeper/vllm-weights`` (``~/.cache`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "gatekeeper" / "vllm-weights"


def vllm_python(given: str | None, worker_command: list[str]) -> str:
    """The Python of the vLLM environment: ``given`` (``--weights-from vllm=PYTHON``), else
    the interpreter of the sidecar's worker command (``vllm`` on PATH by default: its
    script's ``#!`` line names it; a command that starts with a Python is that Python)."""
    if given:
        return given
    program = worker_command[0] if worker_command else "vllm"
    found = shutil.which(program)
    if found is None:
        raise MetaBuildError(
            f"--weights-from vllm: the worker command's program {program!r} is not on PATH, "
            "so there is no vLLM environment to ask; name its Python with "
            "--weights-from vllm=/path/to/venv/bin/python",
            field="weights_from",
            value=program,
        )
    if Path(found).name.startswith("python"):
        return found
    try:
        with open(found, "rb") as f:
            first, second = (f.readline(4096).decode(errors="replace").strip() for _ in "12")
    except OSError as e:
        raise MetaBuildError(
            f"--weights-from vllm: cannot read {found} ({e}); name the vLLM environment's "
            "Python with --weights-from vllm=PYTHON",
            field="weights_from",
            value=found,
        ) from e
    if not first.startswith("#!"):
        raise MetaBuildError(
            f"--weights-from vllm: {found} is not a Python script (no #! line), so its "
            "Python is unknown; name it with --weights-from vllm=PYTHON",
            field="weights_from",
            value=found,
        )
    return _interpreter(first, second)


def _interpreter(first: str, second: str) -> str:
    """The Python a script's ``#!`` line runs: the path itself, ``env``'s program found on
    PATH, or, behind pip's ``#!/bin/sh`` header for paths too long for ``#!``, the one its
    second line execs."""
    words = first[2:].split()
    program = words[0] if words else ""
    exec_line = "'''exec'"
    if Path(program).name == "sh" and second.startswith(exec_line):
        return shlex.split(second.removeprefix(exec_line))[0]
    if Path(program).name == "env":
        name = next((w for w in words[1:] if not w.startswith("-")), "python3")
        return shutil.which(name) or name
    return program


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ""  # nothing on a GPU, ever
    env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    return env


def _run(args: list[str], timeout: float, what: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            args, capture_output=True, text=True, timeout=timeout, env=_child_env(), check=False
        )
    except FileNotFoundError as e:
        raise MetaBuildError(
            f"--weights-from vllm: {args[0]} does not exist; name the vLLM environment's "
            "Python with --weights-from vllm=PYTHON",
            field="weights_from",
            value=args[0],
        ) from e
    except subprocess.TimeoutExpired as e:
        raise MetaBuildError(
            f"--weights-from vllm: {what} took longer than {timeout:.0f} s and was stopped",
            field="weights_from",
            value=args[0],
        ) from e


def _version(python: str, timeout: float) -> str:
    done = _run([python, "-c", _VERSION_PROBE], timeout, "asking for vLLM's version")
    if done.returncode != 0 or not done.stdout.strip():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise MetaBuildError(
            f"--weights-from vllm: {python} has no vLLM installed ({last[:200]}); name the "
            "Python of the environment that runs `vllm serve`",
            field="weights_from",
            value=python,
        )
    return done.stdout.strip()


def _key(request: MetaBuildRequest, config_text: str, extra: str, version: str) -> str:
    builder = hashlib.sha256(META_BUILD.read_bytes()).hexdigest()
    material = json.dumps(
        {
            "config": config_text,
            "beside": extra,
            "quantization": request.quantization,
            "dtype": request.dtype,
            "tp": request.tensor_parallel_size,
            "hf_overrides": request.hf_overrides or {},
            "trust_remote_code": request.trust_remote_code,
            "vllm": version,
            "builder": builder,
        },
        sort_keys=True,
    )
    return hashlib.sha256(material.encode()).hexdigest()[:32]


def _config_text(request: MetaBuildRequest) -> tuple[str, str]:
    """(config.json's text, ``hf_quant_config.json``'s text beside it or "")."""
    if request.config_path is not None:
        beside = request.config_path.with_name("hf_quant_config.json")
        extra = beside.read_text() if beside.is_file() else ""
        return request.config_path.read_text(), extra
    if request.config is None:
        raise MetaBuildError(
            "--weights-from vllm: the model was not read from a config.json gatekeeper can "
            "hand to vLLM (a GGUF file?); size it from its config instead",
            field="weights_from",
        )
    return json.dumps(request.config, sort_keys=True), ""


def _weights(row: Mapping[str, Any], cached: bool) -> BuiltWeights:
    buffers = set(row.get("buffers") or ())
    tensors = [
        BuiltTensor(name, str(dtype), tuple(int(d) for d in shape), int(size), name in buffers)
        for name, (shape, dtype, size) in row["tensors"].items()
    ]
    tensors += [
        BuiltTensor(f"{name}.W_UK_T+W_UV", row["dtype"], (), int(size), after_loading=True)
        for name, size in (row.get("mla_copies") or {}).items()
    ]
    tensors += [
        BuiltTensor(name, "freed", (), -int(size), after_loading=True)
        for name, size in (row.get("freed_after_loading") or {}).items()
    ]
    return BuiltWeights(
        vllm_version=str(row["vllm_version"]),
        tensor_parallel_size=int(row["tensor_parallel_size"]),
        dtype=str(row["dtype"]),
        quantization=row.get("quantization"),
        architecture=str(row["architecture"]),
        tensors=tuple(tensors),
        seconds=0.0 if cached else float(row.get("seconds") or 0.0),
        cached=cached,
    )


def build_weights(
    request: MetaBuildRequest,
    *,
    python: str,
    cache_dir: Path | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> BuiltWeights:
    """What ``python``'s vLLM builds for ``request`` (from the cache when it was asked
    before)."""
    config_text, extra = _config_text(request)
    version = _version(python, timeout)
    cache = cache_dir or default_cache_dir()
    entry = cache / f"{_key(request, config_text, extra, version)}.json"
    if entry.is_file():
        try:
            return _weights(json.loads(entry.read_text()), cached=True)
        except (OSError, ValueError, KeyError, TypeError):
            entry.unlink(missing_ok=True)  # a torn or old entry: build again
    row = _build(request, python, config_text, timeout)
    built = _weights(row, cached=False)
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=cache, delete=False, suffix=".tmp") as f:
        json.dump(row, f)
    os.replace(f.name, entry)
    return built


def _build(
    request: MetaBuildRequest, python: str, config_text: str, timeout: float
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gatekeeper-meta-build-") as tmp:
        work = Path(tmp)
        # the checkpoint directory itself where there is one (vLLM also reads the
        # safetensors headers beside the config: an lm_head, GPTQ's unquantized layers)
        model = request.config_path.parent if request.config_path is not None else work / "model"
        if request.config_path is None:
            model.mkdir()
            (model / "config.json").write_text(config_text)
        job = {
            "id": "model",
            "model": str(model),
            "quantization": request.quantization,
            "dtype": request.dtype,
            "tensor_parallel_size": request.tensor_parallel_size,
            "hf_overrides": dict(request.hf_overrides or {}),
            "trust_remote_code": request.trust_remote_code,
        }
        (work / "jobs.json").write_text(json.dumps([job]))
        out = work / "out.jsonl"
        started = time.monotonic()
        done = _run(
            [python, str(META_BUILD), str(work / "jobs.json"), str(out)],
            timeout,
            "vLLM's build of the model on the meta device",
        )
        rows = [json.loads(line) for line in out.read_text().splitlines()] if out.is_file() else []
    final = [r for r in rows if "ok" in r]
    if final and final[-1]["ok"]:
        return {**final[-1], "seconds": round(time.monotonic() - started, 3)}
    reason = final[-1]["error"] if final else _last_line(done.stderr)
    raise MetaBuildError(
        f"--weights-from vllm: vLLM could not build the model on the meta device: {reason}",
        field="weights_from",
        value=python,
    )


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:400] if lines else "it exited without a word"
