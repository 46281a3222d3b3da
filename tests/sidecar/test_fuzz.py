"""A short fuzz of a real sidecar from its own ``/openapi.json`` (#13): the cases of
``bench/fuzz.py`` (which runs thousands against ``gatekeeper serve``), a few hundred
here. No 5xx, no traceback, one JSON error shape on every 4xx, nothing left reserved."""

from __future__ import annotations

from pathlib import Path

from bench.fuzz import cleanup_and_audit, report, run_cases
from gatekeeper.sidecar.ledger import Ledger, ledger_path
from tests.support.sidecar_harness import running_sidecar, settings_for


def test_fuzzed_requests_from_the_schema_break_nothing(tmp_path: Path) -> None:
    with running_sidecar(settings_for(tmp_path)) as sc:
        spec = sc.admin.get("/openapi.json").json()
        out = run_cases(sc.admin, spec, cases=300, seed=13)
        with Ledger(ledger_path(tmp_path)) as ledger:
            cleanup_and_audit(sc.admin, lambda: len(ledger.outstanding()), out)
    assert out.cases == 300
    assert not out.failures, report(out, 0)
    assert sum(n for status, n in out.statuses.items() if 400 <= status < 500) > 100
