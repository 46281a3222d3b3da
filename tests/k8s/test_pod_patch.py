"""The mutating webhook's edits to a pod template (``gatekeeper.k8s.pod_patch``), each read
back with the same reader the webhooks use (``parse_vllm_command``)."""

from __future__ import annotations

from typing import Any

import pytest

from gatekeeper.k8s.pod_patch import (
    pointer,
    reads_back,
    template_ops,
    unread_script,
    with_budget_flags,
    with_claim,
)
from gatekeeper.vllm.command import parse_vllm_command

IMAGE = "vllm/vllm-openai:v0.32.0"
KV, U = 3759013888, 0.1172


def _read(container: dict[str, Any]) -> Any:
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    command = parse_vllm_command(
        container.get("command", []), container.get("args", []), IMAGE, env
    )
    assert command is not None
    return command


@pytest.mark.parametrize(
    "container",
    [
        {"command": ["vllm", "serve"], "args": ["m", "--gpu_memory_utilization=0.9"]},
        {"command": ["vllm", "serve", "m", "--kv-cache-memory-bytes", "7", "--max-model-len", "4096"]},
        {"args": ["--model", "m", "--gpu-memory-utilization", "0.95"]},
        {"command": ["python3", "-m", "vllm.entrypoints.openai.api_server"], "args": ["--model", "m"]},
        {"command": ["sh", "-c"], "args": ["pip list && exec vllm serve m --max-model-len 4096"]},
        {"command": ["/bin/bash", "-ec", "python3 -m vllm.entrypoints.openai.api_server --model m"]},
        {"command": ["sh", "-c", "vllm serve $(MODEL) --max-model-len 4096"],
         "env": [{"name": "MODEL", "value": "m"}]},
        # NVIDIA Dynamo's worker takes vLLM's engine arguments (the reader reads it so)
        {"command": ["/bin/sh", "-c"], "args": ["exec python3 -m dynamo.vllm --model m"]},
        # a long option before -c: the shell still runs the script
        {"command": ["bash", "--login", "-c", "vllm serve m --max-model-len 4096"]},
        # an option with its argument before -c (bash -o pipefail, -eo pipefail)
        {"command": ["bash", "-eo", "pipefail", "-c"], "args": ["vllm serve m | tee /log"]},
    ],
    ids=["args", "command", "entrypoint", "api-server", "sh-c", "bash-ec", "k8s-var",
         "dynamo-script", "bash-login", "bash-pipefail"],
)  # fmt: skip
def test_the_flags_are_written_once_and_read_back(container: dict[str, Any]) -> None:
    container = {"image": IMAGE, **container}
    edited = with_budget_flags(container, KV, U)
    assert isinstance(edited, dict)
    read = _read(edited)
    assert read.model == "m"
    assert read.options.kv_cache_memory_bytes == KV and read.options.gpu_memory_utilization == U
    assert not read.problems and not read.unknown
    assert reads_back(edited, _read(container), KV, U)
    assert not reads_back(edited, _read(container), KV + 1, U)
    text = " ".join([*edited.get("command", []), *edited.get("args", [])])
    assert text.count("kv-cache-memory-bytes") == 1 and text.count("utilization") == 1
    again = with_budget_flags(edited, KV, U)  # a list is rewritten the same; a script refused
    assert again == edited if isinstance(again, dict) else "remove them" in again
    assert container != edited  # the input is not edited in place


@pytest.mark.parametrize(
    "script",
    [
        "echo 'starting vllm serve now'; exec vllm serve m --max-model-len 4096",
        "# runs vllm serve below\nexec vllm serve m --max-model-len 4096",
    ],
    ids=["echoed", "commented"],
)
def test_the_flags_go_after_the_launcher_the_shell_runs_not_one_in_a_string(script: str) -> None:
    """The first ``vllm serve`` in the text is an echoed string or a comment: written
    there, the flags never reached vLLM and the pod was denied as not reading back."""
    container = {"image": IMAGE, "command": ["sh", "-c", script]}
    before = _read(container)
    edited = with_budget_flags(container, KV, U, lambda e: reads_back(e, before, KV, U))
    assert isinstance(edited, dict) and reads_back(edited, before, KV, U)
    assert edited["command"][2].endswith(
        f"exec vllm serve --kv-cache-memory-bytes {KV} --gpu-memory-utilization {U:.4f} m "
        "--max-model-len 4096"
    )
    first = with_budget_flags(container, KV, U)  # without the check: the first in the text
    assert isinstance(first, dict) and not reads_back(first, before, KV, U)


def test_a_script_that_sets_the_budget_itself_is_refused() -> None:
    why = with_budget_flags(
        {"command": ["sh", "-c", "vllm serve m --gpu-memory-utilization 0.9"]}, KV, U
    )
    assert isinstance(why, str) and "remove them from the script" in why


def test_the_claim_replaces_whole_gpus() -> None:
    container = {"name": "v", "resources": {"limits": {"nvidia.com/gpu": 2, "memory": "8Gi"},
                                            "requests": {"nvidia.com/gpu": 2}}}  # fmt: skip
    edited = with_claim(container, "vllm-gpus")
    assert edited["resources"] == {
        "limits": {"memory": "8Gi"},
        "requests": {},
        "claims": [{"name": "vllm-gpus"}],
    }
    assert with_claim(edited, "vllm-gpus") == edited


def test_the_patch_adds_what_is_missing() -> None:
    claims = [{"name": "vllm-gpus", "resourceClaimTemplateName": "t"}]
    note = ("vllm-gatekeeper.io/claim", "{}")
    bare = template_ops(pointer("spec.template"), {"spec": {}}, {0: {"name": "v"}}, claims, note)
    assert bare == [
        {"op": "replace", "path": "/spec/template/spec/containers/0", "value": {"name": "v"}},
        {"op": "add", "path": "/spec/template/spec/resourceClaims", "value": claims},
        {"op": "add", "path": "/spec/template/metadata",
         "value": {"annotations": {"vllm-gatekeeper.io/claim": "{}"}}},
    ]  # fmt: skip
    annotated = {"metadata": {"annotations": {"a": "b"}}, "spec": {}}
    pod = template_ops(pointer(""), annotated, {}, claims, note)
    assert pod[-1] == {
        "op": "add",
        "path": "/metadata/annotations/vllm-gatekeeper.io~1claim",
        "value": "{}",
    }


def test_a_script_naming_vllm_is_found_even_when_it_cannot_be_split() -> None:
    quoted = {"command": ["sh", "-c", "exec vllm serve 'm --max-model-len 4096"]}
    assert unread_script(quoted) == "exec vllm serve 'm --max-model-len 4096"
    assert unread_script({"command": ["sh", "-c", "ray start --block"]}) is None
    assert unread_script({"command": ["vllm", "serve", "m"]}) is None
