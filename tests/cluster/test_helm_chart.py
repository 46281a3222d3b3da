"""deploy/helm/gatekeeper (issue 39 item 1) without a cluster: ``helm lint``; ``helm
template`` equal, object for object, to ``kubectl kustomize`` of deploy/kubernetes with the
matching components (Helm's own labels aside; the release's Namespace is the operator's,
docs/cluster.md); every rendered built-in object valid against Kubernetes' schemas with all
options on; the generated serving certificate chains to the caBundle both configurations
carry; values that cannot work refused naming the value; the values table in
docs/cluster.md lists every value.

The helm command is the one ``scripts/helm.sh`` builds (Helm v4 from the Go module proxy);
without it these tests skip with the command that builds it.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cryptography import x509

from gatekeeper.cli.entry import build_parser
from tests.support.helm_chart import (
    CHART,
    RELEASE_NAMESPACE,
    comparable,
    helm,
    helm_missing_reason,
    kubectl_missing_reason,
    kustomize,
    template,
)

pytestmark = pytest.mark.skipif(
    helm_missing_reason() is not None, reason=str(helm_missing_reason())
)

ROOT = Path(__file__).resolve().parents[2]
BUILTIN_GROUPS = ("v1", "apps/v1", "policy/v1", "rbac.authorization.k8s.io/v1",
                  "admissionregistration.k8s.io/v1", "resource.k8s.io/v1")  # fmt: skip
AGENT_NAMESPACE = f"{RELEASE_NAMESPACE}-agent"

# kustomize components -> the chart's values that render the same objects.
EQUIVALENT: dict[str, tuple[list[str], dict[str, Any]]] = {
    "base": ([], {"cluster": {"enabled": False}}),
    "cluster": (["cluster"], {}),
    "nvidia-dra": (["cluster", "claims-nvidia-dra"], {"cluster": {"claimsMode": "nvidia-dra"}}),
    "hami": (["cluster", "claims-hami"], {"cluster": {"claimsMode": "hami"}}),
    "prometheus-operator": (
        ["cluster", "prometheus-operator"],
        {"metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}},
    ),
    "webhook-client-auth": (
        ["cluster", "webhook-client-auth"],
        {"webhook": {"clientAuth": {"enabled": True}}},
    ),
}
ALL_ON: dict[str, Any] = {
    "image": {"repository": "registry.example/gatekeeper", "tag": "0.1.0", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "pull"}],
    "webhook": {
        "tls": {"mode": "generate", "extraDnsNames": ["webhook.example"]},
        "clientAuth": {"enabled": True},
        "extraEnv": [{"name": "GATEKEEPER_WEBHOOK_REVIEW_BUDGET_SECONDS", "value": "2"}],
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "k", "operator": "Exists"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]}}},
        "priorityClassName": "system-cluster-critical",
        "podAnnotations": {"a": "b"},
    },
    "sidecar": {"priorityClassName": "system-node-critical", "podAnnotations": {"a": "b"}},
    "agent": {"priorityClassName": "system-node-critical", "podAnnotations": {"a": "b"},
              "extraArgs": ["--prepare-wait-seconds=5"]},
    "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
                "podMonitor": {"enabled": True, "labels": {"release": "prom"}}},
}  # fmt: skip


def test_helm_lint_passes_strict() -> None:
    out = helm("lint", "--strict", str(CHART), "--namespace", RELEASE_NAMESPACE)
    assert "1 chart(s) linted, 0 chart(s) failed" in out


@pytest.mark.skipif(kubectl_missing_reason() is not None, reason=str(kubectl_missing_reason()))
@pytest.mark.parametrize("case", EQUIVALENT)
def test_the_chart_renders_what_kustomize_renders(case: str) -> None:
    components, values = EQUIVALENT[case]
    built = comparable(kustomize(components))
    release_namespace = built.pop(("v1", "Namespace", "", RELEASE_NAMESPACE))
    labels = release_namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    rendered = comparable(template(values))
    assert sorted(rendered) == sorted(built)
    for key, doc in built.items():
        assert rendered[key] == doc, key


def test_the_default_values_run_the_agent_in_a_privileged_namespace_of_its_own() -> None:
    docs = comparable(template())
    namespace = docs[("v1", "Namespace", "", AGENT_NAMESPACE)]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    daemonsets = {k[3]: (k[2], d) for k, d in docs.items() if k[1] == "DaemonSet"}
    assert daemonsets["gatekeeper-agent"][0] == AGENT_NAMESPACE
    assert daemonsets["gatekeeper-sidecar"][0] == RELEASE_NAMESPACE
    others = {k[2] for k in docs if k[2] and k[3] != "gatekeeper-agent"}
    assert others == {RELEASE_NAMESPACE}  # everything else stays restricted
    agent = daemonsets["gatekeeper-agent"][1]["spec"]["template"]["spec"]
    args = build_parser().parse_args(agent["containers"][0]["args"])
    assert (args.command, args.gpus, args.kubelet_plugin) == ("agent", "nvml", True)
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        (config,) = [d for k, d in docs.items() if k[1] == kind]
        (hook,) = config["webhooks"]
        excluded = hook["namespaceSelector"]["matchExpressions"][0]["values"]
        assert {RELEASE_NAMESPACE, AGENT_NAMESPACE} <= set(excluded)


def _validate(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_every_builtin_object_validates_with_all_options_on() -> None:
    docs = template(ALL_ON)
    builtin = [d for d in docs if d["apiVersion"] in BUILTIN_GROUPS]
    assert {d["kind"] for d in builtin} >= {"Namespace", "Deployment", "DaemonSet", "Secret",
                                           "MutatingWebhookConfiguration", "DeviceClass"}  # fmt: skip
    for doc in builtin:
        _validate(doc)
    kinds = {d["kind"] for d in docs} - {d["kind"] for d in builtin}
    assert kinds == {"ServiceMonitor", "PodMonitor"}  # generate mode: no cert-manager objects
    (webhook,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = webhook["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(container["args"])
    assert args.client_ca_file == Path("/etc/gatekeeper/client-ca/ca.crt")
    assert (args.health_port, args.mutate, args.published_devices) == (8081, True, True)
    assert container["image"] == "registry.example/gatekeeper:0.1.0"
    assert container["imagePullPolicy"] == "Always"
    (monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    (endpoint,) = monitor["spec"]["endpoints"]  # the HTTPS port answers only the apiserver
    assert (endpoint["port"], endpoint["scheme"]) == ("health", "http")
    # the generated client CA (its tls.crt is what --client-ca-file reads) signed the
    # apiserver's client certificate, a certificate for client auth
    client_ca = _pem(_secret(docs, "gatekeeper-apiserver-client-ca")["tls.crt"])
    client = _pem(_secret(docs, "gatekeeper-apiserver-client-tls")["tls.crt"])
    client.verify_directly_issued_by(client_ca)
    usages = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH in usages
    (volume,) = [
        v for v in webhook["spec"]["template"]["spec"]["volumes"] if v["name"] == "client-ca"
    ]
    assert volume["secret"]["secretName"] == "gatekeeper-apiserver-client-ca"


def test_an_existing_secret_serves_with_the_ca_bundle_given() -> None:
    """webhook.tls.mode secret: nothing is made, the Deployment mounts the Secret named and
    both configurations carry the CA bundle given."""
    bundle = base64.b64encode(b"-----BEGIN CERTIFICATE-----\n...").decode()
    docs = template({"webhook": {"tls": {"mode": "secret", "secretName": "own-tls",
                                         "caBundle": bundle}}})  # fmt: skip
    assert not [d for d in docs if d["kind"] == "Secret" or "cert-manager" in d["apiVersion"]]
    (webhook,) = [d for d in docs if d["kind"] == "Deployment"]
    (tls,) = [v for v in webhook["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"]
    assert tls["secret"]["secretName"] == "own-tls"
    for config in [d for d in docs if d["kind"].endswith("WebhookConfiguration")]:
        (hook,) = config["webhooks"]
        assert hook["clientConfig"]["caBundle"] == bundle


def _secret(docs: list[dict[str, Any]], name: str) -> dict[str, bytes]:
    (secret,) = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == name]
    return {k: base64.b64decode(v) for k, v in secret["data"].items()}


def _pem(data: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(data)


def test_a_generated_certificate_serves_the_service_and_chains_to_the_ca_bundle() -> None:
    docs = template({"webhook": {"tls": {"mode": "generate", "extraDnsNames": ["localhost"]}}})
    data = _secret(docs, "gatekeeper-webhook-tls")
    cert, ca = _pem(data["tls.crt"]), _pem(data["ca.crt"])
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.DNSName)) == {
        f"gatekeeper-webhook.{RELEASE_NAMESPACE}.svc",
        f"gatekeeper-webhook.{RELEASE_NAMESPACE}.svc.cluster.local",
        "localhost",
    }
    configs = [d for d in docs if d["kind"].endswith("WebhookConfiguration")]
    assert len(configs) == 2
    for config in configs:
        (hook,) = config["webhooks"]
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == data["ca.crt"]
        assert "annotations" not in config["metadata"]  # nothing for cert-manager to inject
    assert not [d for d in docs if d["apiVersion"].startswith("cert-manager.io/")]


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"webhook": {"tls": {"mode": "vault"}}}, 'webhook.tls.mode is "vault"'),
        ({"webhook": {"tls": {"mode": "secret"}}}, "needs webhook.tls.secretName"),
        ({"cluster": {"claimsMode": "nvidia"}}, 'cluster.claimsMode is "nvidia"'),
        ({"webhook": {"url": "http://127.0.0.1:8443"}}, "over HTTPS only"),
        ({"agent": {"namespace": {"name": RELEASE_NAMESPACE}}}, "a namespace of its own"),
    ],
)
def test_values_that_cannot_work_are_refused_naming_the_value(
    values: dict[str, Any], says: str
) -> None:
    with pytest.raises(AssertionError) as refused:
        template(values)
    assert says in str(refused.value)


OBJECT_VALUES = {
    "resources",
    "initResources",
    "nodeSelector",
    "affinity",
    "podAnnotations",
    "labels",
    "issuerRef",
}
"""Values that are Kubernetes objects or maps as a whole: one row each in the table."""


def _leaf_keys(values: dict[str, Any], prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for key, value in values.items():
        if isinstance(value, dict) and key not in OBJECT_VALUES:
            keys |= _leaf_keys(value, f"{prefix}{key}.")
        else:
            keys.add(f"{prefix}{key}")
    return keys


def test_the_docs_values_table_lists_every_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    text = (ROOT / "docs" / "cluster.md").read_text()
    rows = text.split("\n| value | default | what |\n", 1)[1].split("\n\n", 1)[0]
    table = set(re.findall(r"^\| `([A-Za-z0-9_.]+)` \|", rows, flags=re.MULTILINE))
    leaves = _leaf_keys(values)
    assert leaves - table == set()
    assert table - leaves == set()
