"""Admission through the ledger: concurrent admissions never promise the same bytes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gatekeeper.estimator.options import ServeOptions
from gatekeeper.gpus.declared import parse_declared_node
from gatekeeper.models.source import resolve_model
from gatekeeper.placement.decision import decide
from gatekeeper.placement.gpu_search import gpu_lines
from gatekeeper.placement.policy import PlacementPolicy
from gatekeeper.placement.types import PlacementRequest
from gatekeeper.sidecar.admission import admit
from gatekeeper.sidecar.ledger import Ledger
from gatekeeper.sidecar.ledger_view import promised_bytes

POLICY = PlacementPolicy(share_gpus=True)
REQUEST = PlacementRequest(resolve_model("Qwen/Qwen3-0.6B"), ServeOptions(max_model_len=4096))


def capacity() -> tuple[int, int]:
    """(usable bytes of the one GPU, how many such workers fit)."""
    snap = parse_declared_node("1xL4")
    usable = gpu_lines(snap, {}, {}, POLICY)[0].usable_bytes
    one = decide(REQUEST, snap, policy=POLICY)
    assert one.placement is not None
    return usable, usable // one.placement.promise_bytes[0]


def test_200_concurrent_admissions_from_threads_never_overcommit(tmp_path: Path):
    snap = parse_declared_node("1xL4")
    usable, fits = capacity()
    with Ledger(tmp_path / "l.sqlite3") as ledger:

        def one(i: int) -> bool:
            d = admit(ledger, REQUEST, snap, deployment_id=f"d{i}", policy=POLICY, ttl_seconds=600)
            return d.admitted

        with ThreadPoolExecutor(max_workers=16) as pool:
            admitted = sum(pool.map(one, range(200)))
        promised = promised_bytes(ledger.outstanding())
    assert admitted == fits
    assert sum(promised.values()) <= usable


def test_two_processes_admitting_against_one_ledger_never_overcommit(tmp_path: Path):
    usable, fits = capacity()
    script = textwrap.dedent(
        """
        import sys
        from gatekeeper.sidecar.admission import admit
        from gatekeeper.gpus.declared import parse_declared_node
        from gatekeeper.sidecar.ledger import Ledger
        from tests.sidecar.test_admission import POLICY, REQUEST
        snap = parse_declared_node("1xL4")
        n = 0
        with Ledger(__import__("pathlib").Path(sys.argv[1])) as ledger:
            for i in range(100):
                d = admit(ledger, REQUEST, snap, deployment_id=sys.argv[2] + str(i), policy=POLICY, ttl_seconds=600)
                n += d.admitted
        print(n)
        """
    )
    path = tmp_path / "l.sqlite3"
    root = str(Path(__file__).resolve().parents[2])
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(path), tag],
            stdout=subprocess.PIPE,
            text=True,
            cwd=root,
        )
        for tag in ("a", "b")
    ]
    counts = [int(p.communicate(timeout=120)[0]) for p in procs]
    assert sum(counts) == fits
    with Ledger(path) as ledger:
        assert sum(promised_bytes(ledger.outstanding()).values()) <= usable


def test_rejection_after_the_transaction_carries_suggestions(tmp_path: Path):
    big = PlacementRequest(
        resolve_model("meta-llama/Llama-3.1-8B-Instruct"), ServeOptions(max_model_len=131072)
    )
    with Ledger(tmp_path / "l.sqlite3") as ledger:
        d = admit(
            ledger,
            big,
            parse_declared_node("1xL4"),
            deployment_id="x",
            policy=POLICY,
            ttl_seconds=60,
        )
        assert not d.admitted and d.suggestions
        assert ledger.outstanding() == ()
