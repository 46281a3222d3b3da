"""Each admission rejection of ``gatekeeper serve`` writes one decision line (issue 39 item
2): the installed command in a subprocess (``tests/support/serve_cli.py``, two declared
H100s, text logs as shipped), a deploy that does not fit (507) and one whose name is
taken (409), each line read back from its log (the 409 starts one simulated worker)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from tests.support.polling import wait_for
from tests.support.serve_cli import serve_process

MODEL = "Qwen/Qwen3-235B-A22B"


def _fields(line: str) -> dict[str, str]:
    """A logfmt line's ``key=value`` pairs (values JSON-quoted when they hold spaces)."""
    pairs = re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', line)
    return {k: json.loads(v) if v.startswith('"') else v for k, v in pairs}


def _line(log: Path, event: str, status: int) -> dict[str, str]:
    def found() -> dict[str, str] | None:
        for line in log.read_text(errors="replace").splitlines():
            if f"event={event}" in line and f"status={status}" in line:
                return _fields(line)
        return None

    return wait_for(f"a {event} line with status {status}", found, timeout_seconds=10)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    with serve_process(tmp_path_factory.mktemp("rejections"), on_demand=False) as running:
        yield running


def test_a_507_is_logged_with_the_bytes_needed_and_free(served) -> None:
    body = {"model": MODEL, "options": {"max_model_len": 8192}}
    answer = httpx.post(f"{served.url}/admin/deployments", json=body, headers=served.admin,
                        timeout=30)  # fmt: skip
    assert answer.status_code == 507, answer.text
    line = _line(served.log, "sidecar_rejection", 507)
    assert line["model"] == MODEL and line["name"] == MODEL
    need, free = int(line["need_bytes"]), int(line["free_bytes"])
    assert need > int(line["usable_bytes"]) and 0 < free <= 80 * 2**30
    assert line["gpu_name"].startswith("H100")
    assert line["reason"]


def test_a_409_is_logged_with_its_reason(served) -> None:
    body = {"model": "Qwen/Qwen3-0.6B", "name": "twice", "options": {"max_model_len": 4096}}
    first = httpx.post(f"{served.url}/admin/deployments", json=body, headers=served.admin,
                       timeout=30)  # fmt: skip
    assert first.status_code == 201, first.text
    again = httpx.post(f"{served.url}/admin/deployments", json=body, headers=served.admin,
                       timeout=30)  # fmt: skip
    assert again.status_code == 409, again.text
    line = _line(served.log, "sidecar_rejection", 409)
    assert line["name"] == "twice" and line["model"] == "Qwen/Qwen3-0.6B"
    assert "already deployed" in line["reason"]
