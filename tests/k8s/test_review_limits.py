"""Bounded work per review (issue 38 item 1): both webhooks deny a malformed object naming
the field, and each limit passed naming the limit, before they read a vLLM line; at the
limit they read on. The apiserver's side of it (denials, not fail-opens) is
``tests/cluster/test_webhook_limits.py``."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

import pytest

from gatekeeper.k8s.limits import Budget, ReviewLimits
from gatekeeper.k8s.mutate import Mutator
from gatekeeper.k8s.review import AdmissionReview, Oversized, oversized_answer, parse_review
from gatekeeper.k8s.server import webhook_from_settings
from gatekeeper.settings import Settings
from tests.support.vllm_workloads import IMAGE, MODEL

LIMITS = ReviewLimits()


class Store:
    """Templates kept in memory (``TemplateStore``)."""

    def __init__(self) -> None:
        self.made: list[Mapping[str, Any]] = []

    def ensure(self, template: Mapping[str, Any]) -> None:
        self.made.append(template)

    def read(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return None

    def to_bytes(self, quantity: str) -> int:
        return int(quantity)


def vllm(name: str = "vllm", args: list[str] | None = None, **more: Any) -> dict[str, Any]:
    return {"name": name, "image": IMAGE, "command": ["vllm", "serve"],
            "args": args if args is not None else [MODEL, "--max-model-len", "8192"],
            "resources": {"limits": {"nvidia.com/gpu": 1}}, **more}  # fmt: skip


def pod(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": list(containers), **spec}}  # fmt: skip


def review(obj: dict[str, Any], kind: str = "Pod") -> bytes:
    group = "" if kind == "Pod" else "apps"
    return json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u-1", "kind": {"group": group, "version": "v1", "kind": kind},
                    "operation": "CREATE", "namespace": "ns", "object": obj},
    }).encode()  # fmt: skip


def answers(obj: dict[str, Any], kind: str = "Pod", **settings: Any) -> list[dict[str, Any]]:
    """The validating and the mutating webhook's responses to a CREATE of ``obj``."""
    webhook = webhook_from_settings(Settings(**settings))
    out = []
    for answer in (webhook.answer, Mutator(webhook, Store()).answer):
        status, body, _ = answer(review(obj, kind))
        assert status == 200, body
        out.append(body["response"])
    return out


def denied(obj: dict[str, Any], kind: str = "Pod", **settings: Any) -> list[str]:
    """Both webhooks' denials of ``obj`` (asserting both deny)."""
    messages = []
    for response in answers(obj, kind, **settings):
        assert response["allowed"] is False, response
        messages.append(response["status"]["message"])
    return messages


def deployment(template: object) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "namespace": "ns"}, "spec": {"template": template}}  # fmt: skip


@pytest.mark.parametrize(
    ("obj", "kind", "field", "described"),
    [
        (pod(containers=5), "Pod", "spec.containers", "a number (5), not a list"),
        (pod(vllm(command="vllm serve x")), "Pod", "spec.containers[0].command",
         "a string ('vllm serve x'), not a list"),
        (pod(vllm(env={"MODEL": "x"})), "Pod", "spec.containers[0].env", "an object, not a list"),
        (pod(vllm(resources=[])), "Pod", "spec.containers[0].resources", "a list, not an object"),
        (pod(vllm(env=[["MODEL", "x"]])), "Pod", "spec.containers[0].env[0]",
         "a list, not an object"),
        (pod(vllm(), resourceClaims="vllm-gpus"), "Pod", "spec.resourceClaims",
         "a string ('vllm-gpus'), not a list"),
        (pod(vllm(), nodeSelector=["a"]), "Pod", "spec.nodeSelector", "a list, not an object"),
        ({**pod(vllm()), "metadata": {"annotations": []}}, "Pod", "metadata.annotations",
         "a list, not an object"),
        (deployment([]), "Deployment", "spec.template", "a list, not an object"),
        (deployment({"spec": {"containers": [7]}}), "Deployment",
         "spec.template.spec.containers[0]", "a number (7), not an object"),
        (deployment({"metadata": "x", "spec": {}}), "Deployment", "spec.template.metadata",
         "a string ('x'), not an object"),
    ],
)  # fmt: skip
def test_a_malformed_object_is_denied_naming_the_field(
    obj: dict[str, Any], kind: str, field: str, described: str
) -> None:
    """Never an internal error, never admitted unread: ``containers: 5`` was a TypeError
    the mutating webhook answered by admitting the pod unmutated."""
    for message in denied(obj, kind):
        assert f"the object is malformed: {field} is {described}" in message


def test_containers_per_pod_at_the_limit_are_read_and_one_more_is_denied() -> None:
    plain = [{"name": f"c{i}", "image": "busybox"} for i in range(LIMITS.containers_per_pod - 1)]
    at = pod(vllm(), *plain)
    assert all(r["allowed"] for r in answers(at))
    over = copy.deepcopy(at)
    over["spec"]["initContainers"] = [{"name": "init", "image": "busybox"}]
    for message in denied(over):
        assert (
            f"its pod has {LIMITS.containers_per_pod + 1} containers, over the webhook's limit "
            f"of {LIMITS.containers_per_pod} containers per pod (setting "
            "webhook_max_containers_per_pod)" in message
        )


def _line_of(size: int) -> list[str]:
    """Args whose vLLM line (``vllm``, ``serve`` and these) is ``size`` bytes."""
    base = [MODEL, "--max-model-len", "8192", "--served-model-name"]
    used = sum(len(w) for w in ["vllm", "serve", *base])
    return [*base, "m" * (size - used)]


def test_a_line_at_the_byte_limit_is_read_and_one_byte_more_is_denied() -> None:
    validated, mutated = answers(pod(vllm(args=_line_of(LIMITS.line_bytes))))
    assert validated["allowed"] and mutated["allowed"] and mutated["patch"]
    for message in denied(pod(vllm(args=_line_of(LIMITS.line_bytes + 1)))):
        assert (
            f"is {LIMITS.line_bytes + 1} bytes, over the webhook's limit of "
            f"{LIMITS.line_bytes} command-line bytes (setting webhook_max_line_bytes)" in message
        )


def test_literal_env_values_count_with_the_line() -> None:
    """``$(VAR)`` and scripts expand env values into the line: they count."""
    args = [MODEL, "--served-model-name", "$(NAME)"]
    env = [{"name": "NAME", "value": "n" * LIMITS.line_bytes}]
    for message in denied(pod(vllm(args=args, env=env))):
        assert "command-line bytes" in message


def test_flags_at_the_limit_are_read_and_one_more_is_denied() -> None:
    flags = ["--max-num-seqs", "4"] * (LIMITS.flags_per_line - 1)
    validated, mutated = answers(pod(vllm(args=[MODEL, *flags, "--max-model-len", "8192"])))
    assert validated["allowed"] and mutated["allowed"] and mutated["patch"]
    # sh's -c counts: the words of the container's line that begin with a dash
    script = f"vllm serve {MODEL} {' '.join(flags[2:])} --max-model-len 8192 --enforce-eager"
    for message in denied(pod(vllm(command=["sh", "-c", script], args=[]))):
        assert (
            f"has {LIMITS.flags_per_line + 1} flags, over the webhook's limit of "
            f"{LIMITS.flags_per_line} flags per line (setting webhook_max_flags_per_line)"
            in message
        )
    # negative numbers are values, not flags
    negative = [MODEL, "--max-model-len", "8192", *flags[2:], "--seed", "-5"]
    assert all(r["allowed"] for r in answers(pod(vllm(args=negative))))


def test_a_container_that_runs_no_vllm_is_not_limited() -> None:
    """gatekeeper reads only vLLM lines; another program's long script is its own."""
    script = "python -c '" + "x = 1; " * 20000 + "'"
    other = {"name": "other", "image": "python", "command": ["sh", "-c", script]}
    assert all(r["allowed"] for r in answers(pod(vllm(), other)))


def test_the_limits_are_settings() -> None:
    settings = Settings(
        webhook_max_review_bytes=65536,
        webhook_max_containers_per_pod=4,
        webhook_max_line_bytes=2048,
        webhook_max_flags_per_line=8,
        webhook_review_budget_seconds=2.5,
    )
    assert webhook_from_settings(settings).config.limits == ReviewLimits(65536, 4, 2048, 8, 2.5)
    flags = ["--max-num-seqs", "4"] * 9
    for message in denied(pod(vllm(args=[MODEL, *flags])), webhook_max_flags_per_line=8):
        assert "limit of 8 flags per line" in message


def test_a_review_past_its_budget_is_denied() -> None:
    for message in denied(pod(vllm()), webhook_review_budget_seconds=1e-9):
        assert "could not finish reviewing it within its budget of 1e-09 s" in message
        assert "after 0 vLLM container(s)" in message
    assert Budget(10.0).spent() is False


def test_identical_containers_are_read_and_sized_once() -> None:
    """A pod of 500 copies of one vLLM container: one line read (and its edited form),
    one template created, 500 pod claims of it, the denial list of a worse pod capped."""
    store = Store()
    webhook = webhook_from_settings(Settings())
    same = pod(*(vllm(f"c{i}") for i in range(500)))
    status, _, outcome = Mutator(webhook, store).answer(review(same))
    assert (status, outcome) == (200, "mutated")
    assert len(store.made) == 1
    parsed = parse_review(review(same))
    assert isinstance(parsed, AdmissionReview)
    m = Mutator(webhook, Store()).decide(parsed.request)
    assert len(m.lines) == 2 and len(m.sized) == 1
    claims = [op for op in m.patch if op["path"] == "/spec/resourceClaims"]
    assert len(claims[0]["value"]) == 500
    bad = pod(*(vllm(f"c{i}", args=["--max-model-len", "banana"]) for i in range(40)))
    (_, mutated) = answers(bad)
    lines = mutated["status"]["message"].split("\n")
    assert len(lines) == 17 and lines[-1] == "... and 24 more"


def test_an_internal_error_is_a_denial_of_the_mutating_webhook() -> None:
    """A bug (here a store failing other than as the API fails) denies: under the
    failure policy Fail the shipped cluster mode takes, admitting would be the one way
    round it."""

    class Broken(Store):
        def ensure(self, template: Mapping[str, Any]) -> None:
            raise RuntimeError("boom")

    status, body, outcome = Mutator(webhook_from_settings(Settings()), Broken()).answer(
        review(pod(vllm()))
    )
    assert (status, outcome, body["response"]["allowed"]) == (200, "denied", False)
    assert "internal error (RuntimeError)" in body["response"]["status"]["message"]


def test_an_oversized_review_is_denied_by_its_uid_or_refused() -> None:
    head = b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"ab-1"'
    status, body = oversized_answer(Oversized(head, 3 * 2**20 + 1, 3 * 2**20))
    assert status == 200 and body["response"]["uid"] == "ab-1"
    assert body["response"]["allowed"] is False
    message = body["response"]["status"]["message"]
    assert (
        f"the review is {3 * 2**20 + 1} bytes, over the webhook's limit of {3 * 2**20} " in message
    )
    assert "review bytes (setting webhook_max_review_bytes)" in message
    assert oversized_answer(Oversized(b"{}", 9 * 2**20, 3 * 2**20))[0] == 413


def test_more_templates_than_one_review_may_create_stop_the_sizing() -> None:
    """500 containers of 500 sizes: denied at the ninth distinct template, none created,
    the rest never sized."""
    store = Store()
    webhook = webhook_from_settings(Settings())
    sizes = pod(
        *(vllm(f"c{i}", args=[MODEL, "--max-model-len", str(2048 * (i + 1))]) for i in range(500))
    )
    parsed = parse_review(review(sizes))
    assert isinstance(parsed, AdmissionReview)
    m = Mutator(webhook, store).decide(parsed.request)
    assert m.outcome == "denied" and store.made == [] and len(m.sized) == 9
    (text,) = m.denials
    assert "need at least 9 distinct ResourceClaimTemplates, over the webhook's limit of 8 " in text
