"""Fuzz ``gatekeeper serve`` from its own ``/openapi.json`` (hypothesis).

Every operation of the schema is drawn with hostile inputs: bodies built from the
operation's schema (its properties with values of any JSON type: NaN and infinities
as the non-standard literals, huge and negative numbers, traversal strings for model
references), bodies of arbitrary JSON, bytes that are not JSON, and path parameters
that try to escape (``../..``, ``%2e%2e``, absolute paths). Checked for every case: no
5xx, no traceback text in the body, a JSON error body with ``error.message`` on every
4xx (the webhook's: a Kubernetes ``Status`` with its ``message``). After the run: the ledger holds no outstanding reservation once every deployment is
removed, and the sidecar is still healthy.

    python -m bench.fuzz --cases 3000

The suite runs a short version of the same cases (tests/sidecar/test_fuzz.py).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import re
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.serve_process import TOKEN, free_port, sidecar

WORKER_ENV = '{ GATEKEEPER_SIM_STARTUP_SECONDS = "0.2" }'

HOSTILE_STRINGS = [
    "Qwen/../..", "Qwen/../../etc", "../../etc/passwd", "/etc", "~", "~root/.ssh",
    "..%2f..%2fetc", "%2e%2e/%2e%2e", "Qwen/Qwen3-0.6B/../../..", "\u0000", "Qwen/*",
    "a" * 5000, "tiny", "Qwen/Qwen3-0.6B", "NaN", "1e308", "-1",
]  # fmt: skip
HOSTILE_NUMBERS = [math.nan, math.inf, -math.inf, 1e308, -1, 0, 2**64, -(2**63), 0.5, 1.5]
TRACEBACK = re.compile(r"Traceback \(most recent call last\)|File \"/")


@dataclass(frozen=True)
class Case:
    method: str
    path: str
    body: bytes | None


@dataclass
class Outcome:
    cases: int = 0
    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    failures: collections.Counter[str] = field(default_factory=collections.Counter)
    examples: dict[str, str] = field(default_factory=dict)

    def fail(self, check: str, case: Case, detail: str) -> None:
        self.failures[check] += 1
        self.examples.setdefault(
            check, f"{case.method} {case.path} {case.body!r:.300} -> {detail:.300}"
        )


def json_values() -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from(HOSTILE_NUMBERS),
        st.text(max_size=40),
        st.sampled_from(HOSTILE_STRINGS),
    )
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
        ),
        max_leaves=12,
    )


def _properties(schema: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str):
        schema = spec["components"]["schemas"][ref.rsplit("/", 1)[1]]
    props = schema.get("properties", {})
    return props if isinstance(props, dict) else {}


# Fields the proxy routes on, for operations whose schema gives no body.
_OPENAI_FIELDS = [
    "model",
    "messages",
    "prompt",
    "input",
    "max_tokens",
    "stream",
    "n",
    "temperature",
]


def body_strategy(op: dict[str, Any], path: str, spec: dict[str, Any]) -> st.SearchStrategy[bytes]:
    content = op.get("requestBody", {}).get("content", {}).get("application/json", {})
    names = list(_properties(content.get("schema", {}), spec))
    if path.startswith("/v1/"):
        names += _OPENAI_FIELDS
    if path.startswith("/admin/"):
        names += ["model", "name", "options", "max_model_len", "gpus"]
    names = sorted(set(names)) or ["x"]
    guided = st.dictionaries(st.sampled_from(names), json_values(), max_size=len(names))
    options = st.fixed_dictionaries(
        {"model": st.sampled_from(HOSTILE_STRINGS)},
        optional={"options": st.dictionaries(st.sampled_from(
            ["max_model_len", "tensor_parallel_size", "gpu_memory_utilization", "max_num_seqs",
             "kv_cache_dtype", "hf_overrides", "speculative_config", "quantization"]),
            json_values(), max_size=3)},
    )  # fmt: skip
    as_json = st.one_of(guided, options, json_values()).map(
        lambda v: json.dumps(v, allow_nan=True).encode()
    )
    return st.one_of(as_json, as_json, st.binary(max_size=64))


def case_strategy(spec: dict[str, Any]) -> st.SearchStrategy[Case]:
    options: list[st.SearchStrategy[Case]] = []
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            if method == "delete" or not isinstance(op, dict):
                continue  # deleting is exercised by the cleanup
            ids = st.sampled_from(["x", *HOSTILE_STRINGS[:10]]) if "{" in path else st.just("")
            bodies = body_strategy(op, path, spec) if method == "post" else st.none()

            def build(i: str, b: bytes | None, p: str = path, m: str = method) -> Case:
                quoted = urllib.parse.quote(i, safe="%")  # the client refuses raw control bytes
                return Case(m.upper(), re.sub(r"\{[^}]+\}", quoted, p), b)

            options.append(st.builds(build, ids, bodies))
    return st.one_of(options)


def check_case(client: httpx.Client, case: Case, out: Outcome) -> None:
    out.cases += 1
    headers = {"Content-Type": "application/json"} if case.body is not None else {}
    try:
        r = client.request(case.method, case.path, content=case.body, headers=headers)
    except httpx.HTTPError as e:
        out.fail("transport", case, type(e).__name__)
        return
    out.statuses[r.status_code] += 1
    if r.status_code >= 500 and r.status_code not in (503, 507):
        out.fail("server_error", case, f"{r.status_code} {r.text}")
    if TRACEBACK.search(r.text):
        out.fail("traceback", case, r.text)
    if r.status_code >= 400 and r.headers.get("content-type", "").startswith("application/json"):
        try:
            body = r.json()
            # the webhook answers as the Kubernetes API does: a Status object
            message = body["message"] if case.path.startswith("/k8s/") else body["error"]["message"]
            if not isinstance(message, str) or not message:
                out.fail("error_shape", case, r.text)
        except (ValueError, KeyError, TypeError):
            out.fail("error_shape", case, r.text)
    elif r.status_code >= 400:
        out.fail("error_shape", case, f"{r.headers.get('content-type')}: {r.text}")


def run_cases(client: httpx.Client, spec: dict[str, Any], cases: int, seed: int) -> Outcome:
    out = Outcome()

    @settings(
        max_examples=cases,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
    )
    @given(case_strategy(spec))
    def run(case: Case) -> None:
        check_case(client, case, out)

    run._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]
    run()
    return out


def cleanup_and_audit(client: httpx.Client, outstanding: Callable[[], int], out: Outcome) -> None:
    """Remove every deployment the fuzz made; then nothing may stay reserved."""
    for d in client.get("/admin/deployments").json().get("deployments", []):
        client.delete(f"/admin/deployments/{d['id']}")
    deadline = time.monotonic() + 30
    while outstanding() and time.monotonic() < deadline:
        time.sleep(0.2)
    if outstanding():
        out.failures["leaked_reservation"] += outstanding()
    if client.get("/healthz").status_code != 200:
        out.failures["unhealthy_after"] += 1


def report(out: Outcome, seconds: float) -> str:
    lines = [
        f"fuzz: {out.cases} cases in {seconds:.0f} s; failures {sum(out.failures.values())} "
        f"{dict(out.failures)}",
        f"statuses {dict(sorted(out.statuses.items()))}",
    ]
    lines += [f"  e.g. {check}: {text}" for check, text in out.examples.items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args()
    from gatekeeper.sidecar.ledger import Ledger, ledger_path

    port = free_port()
    with (
        tempfile.TemporaryDirectory(prefix="gk-fuzz-") as tmp,
        sidecar(Path(tmp), port, preload=False, worker_env=WORKER_ENV) as proc,
    ):
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=60) as c:
            spec = c.get("/openapi.json").json()
            started = time.monotonic()
            out = run_cases(c, spec, args.cases, args.seed)
            with Ledger(ledger_path(Path(tmp) / "state")) as ledger:
                cleanup_and_audit(c, lambda: len(ledger.outstanding()), out)
            if proc.poll() is not None:
                out.failures["sidecar_died"] += 1
        print(report(out, time.monotonic() - started))


if __name__ == "__main__":
    main()
