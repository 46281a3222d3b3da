"""Which namespaces the mutating webhook's configuration selects (``gatekeeper.k8s.scope``,
pure): a LabelSelector as the apiserver matches it, the shipped selector on namespaces'
labels, and the webhooks a name or a pattern finds in the configurations."""

from __future__ import annotations

from pathlib import Path

import yaml

from gatekeeper.k8s.scope import hook_selectors, selects

SHIPPED = (
    Path(__file__).resolve().parents[2]
    / "deploy" / "kubernetes" / "components" / "cluster" / "mutatingwebhookconfiguration.yaml"
)  # fmt: skip


def _labels(name: str, **more: str) -> dict[str, str]:
    return {"kubernetes.io/metadata.name": name, **more}


def test_the_shipped_selector() -> None:
    (hook,) = yaml.safe_load(SHIPPED.read_text())["webhooks"]
    selector = hook["namespaceSelector"]
    assert selects(selector, _labels("team-a"))
    for name in ("kube-system", "kube-public", "kube-node-lease", "vllm-gatekeeper"):
        assert not selects(selector, _labels(name))
    assert not selects(selector, _labels("team-b", **{"vllm-gatekeeper.io/admission": "disabled"}))


def test_each_operator_and_match_labels() -> None:
    assert selects(None, {}) and selects({}, {"a": "b"})
    assert selects({"matchLabels": {"a": "b"}}, {"a": "b", "c": "d"})
    assert not selects({"matchLabels": {"a": "b"}}, {"a": "c"})
    expression = {"key": "tier", "operator": "In", "values": ["gpu", "cpu"]}
    assert selects({"matchExpressions": [expression]}, {"tier": "gpu"})
    assert not selects({"matchExpressions": [expression]}, {})
    exists = {"matchExpressions": [{"key": "tier", "operator": "Exists"}]}
    assert selects(exists, {"tier": ""}) and not selects(exists, {})
    absent = {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}
    assert selects(absent, {}) and not selects(absent, {"tier": "x"})
    assert not selects(
        {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}, {"a": "2"}
    )


def test_the_webhooks_a_name_or_a_pattern_finds() -> None:
    configs = [
        {"metadata": {"name": "shipped"},
         "webhooks": [{"name": "claims.vllm-gatekeeper.io", "namespaceSelector": {"matchLabels": {"a": "1"}}}]},
        {"metadata": {"name": "bench"},
         "webhooks": [{"name": "bench.vllm-gatekeeper.io"}, {"name": "other.example.com"}]},
    ]  # fmt: skip
    assert hook_selectors(configs, "claims.vllm-gatekeeper.io") == [
        ("shipped", {"matchLabels": {"a": "1"}})
    ]
    assert [n for n, _ in hook_selectors(configs, "*.vllm-gatekeeper.io")] == ["shipped", "bench"]
    assert hook_selectors(configs, "nothing") == []
