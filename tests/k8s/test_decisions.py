"""The decision line's fields and the audit annotations (``gatekeeper.k8s.decisions``), and
the text form of a decision line (``gatekeeper.sidecar.logs``): what the apiserver takes
as annotation keys, several containers, and a value with spaces and quotes read back."""

from __future__ import annotations

import io
import json
import logging
import re

from gatekeeper.cluster.decision_log import DECISIONS_LOGGER
from gatekeeper.k8s.decisions import Judged, Sizing, audit_annotations, decision_fields, workload
from gatekeeper.sidecar.logs import configure_logging, logfmt

QUALIFIED = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
"""A qualified name without a prefix (the apiserver prefixes the webhook's name)."""
SIZED = Sizing(16_440_256_306, 2, 8192, 8, "H100-80GB")


def test_annotation_keys_are_what_the_apiserver_takes() -> None:
    audit = audit_annotations("allowed", [Judged("vllm", "Qwen/Qwen2.5-7B-Instruct", SIZED)])
    assert audit == {
        "verdict": "allowed",
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "estimate-bytes-per-rank": "16440256306",
        "ranks": "2",
        "sized-for": "8 sequences of 8192 tokens",
        "gpu": "H100-80GB",
    }
    assert all(QUALIFIED.match(k) and len(k) <= 63 for k in audit)
    assert all(isinstance(v, str) for v in audit.values())


def test_several_containers_name_theirs_and_an_unsized_one_says_what_it_can() -> None:
    judged = [Judged("vllm", "a/b", SIZED), Judged("draft", "c/d", None)]
    audit = audit_annotations("warned", judged)
    assert audit["model"] == "vllm=a/b, draft=c/d"
    assert audit["estimate-bytes-per-rank"] == "vllm=16440256306"
    assert audit_annotations("allowed", []) == {}
    fields = decision_fields("validating", "warned", ("Pod", "ns", "p"), judged, "")
    assert fields["container"] == ["vllm", "draft"]
    assert fields["bytes_per_rank"] == [16_440_256_306, None]
    assert fields["reason"] is None


def test_the_workload_is_named_as_the_object_names_it() -> None:
    assert workload("Pod", None, {"metadata": {"generateName": "web-"}}, None) == (
        "Pod", "default", "web-*"
    )  # fmt: skip
    assert workload("Job", "ml", {"metadata": {"name": "j"}}, "x") == ("Job", "ml", "j")


def test_a_text_line_reads_back() -> None:
    text = logfmt("validating webhook: denied", {"model": "a/b", "reason": 'no "room"\nat all',
                                                   "ranks": 2, "gone": None})  # fmt: skip
    assert text.startswith("validating webhook: denied model=a/b ")
    pairs = dict(re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', text))
    assert json.loads(pairs["reason"]) == 'no "room"\nat all'
    assert pairs["ranks"] == "2" and "gone" not in pairs


def test_text_logging_writes_decision_lines_at_info_and_json_carries_the_fields() -> None:
    decisions = logging.getLogger(DECISIONS_LOGGER)
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, list(decisions.handlers), decisions.level)
    try:
        configure_logging("text")
        configure_logging("text")  # once is enough: no second handler
        assert len(decisions.handlers) == 1
        stream = io.StringIO()
        configure_logging("json", stream)
        assert decisions.handlers == []  # the JSON handler on the root takes them
        decisions.info("m", extra={"fields": {"verdict": "allowed", "message": "kept out"}})
        line = json.loads(stream.getvalue())
        assert (line["message"], line["verdict"]) == ("m", "allowed")
    finally:
        root.handlers[:], decisions.handlers[:] = saved[0], saved[2]
        root.setLevel(saved[1])
        decisions.setLevel(saved[3])
