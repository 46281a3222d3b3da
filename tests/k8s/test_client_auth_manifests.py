"""The component that makes the webhook take reviews only from the apiserver
(``deploy/kubernetes/components/webhook-client-auth``, issue 38 item 2): its patch runs
``gatekeeper webhook --client-ca-file`` on the CA cert-manager makes, with probes on the
plain ``--health-port``; the apiserver's client certificate comes from that CA; the
control-plane files name the webhook's Service. ``kubectl kustomize`` builds it with the
cluster component when kubectl is here."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gatekeeper.cli.entry import build_parser

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
COMPONENT = DEPLOY / "components" / "webhook-client-auth"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _patch(kind: str) -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    (patch,) = [p for p in kustomization["patches"] if p["target"]["kind"] == kind]
    ops: list[dict[str, Any]] = yaml.safe_load(patch["patch"])
    return ops


def _base_deployment() -> dict[str, Any]:
    (base,) = [d for d in _docs(DEPLOY / "webhook-deployment.yaml") if d["kind"] == "Deployment"]
    return base


def test_the_webhook_requires_the_client_ca_and_serves_probes_in_plain_http() -> None:
    (container,) = _base_deployment()["spec"]["template"]["spec"]["containers"]
    ops = _patch("Deployment")
    added = [o["value"] for o in ops if o["path"].endswith("/args/-")]
    args = build_parser().parse_args([*container["args"], *added])
    assert args.client_ca_file == Path("/etc/gatekeeper/client-ca/ca.crt")
    assert args.health_port == 8081
    (port,) = [o["value"] for o in ops if o["path"].endswith("/ports/-")]
    assert port == {"name": "health", "containerPort": args.health_port}
    for probe in ("readinessProbe", "livenessProbe"):
        (op,) = [o for o in ops if o["path"].endswith(probe)]
        assert op["op"] == "replace"
        assert op["value"]["httpGet"] == {"path": "/healthz", "port": "health", "scheme": "HTTP"}
    (mount,) = [o["value"] for o in ops if o["path"].endswith("/volumeMounts/-")]
    assert args.client_ca_file.parent == Path(mount["mountPath"])
    (volume,) = [o["value"] for o in ops if o["path"].endswith("/volumes/-")]
    assert volume["name"] == mount["name"]
    (ca,) = [d for d in _docs(COMPONENT / "client-certificates.yaml")
             if d["kind"] == "Certificate" and d["spec"].get("isCA")]  # fmt: skip
    assert volume["secret"]["secretName"] == ca["spec"]["secretName"]
    assert volume["secret"]["items"] == [{"key": "tls.crt", "path": args.client_ca_file.name}]
    (service_port,) = [o["value"] for o in _patch("Service")]
    assert (service_port["name"], service_port["targetPort"]) == ("health", "health")


def test_the_apiserver_s_client_certificate_comes_from_that_ca() -> None:
    docs = {
        (d["kind"], d["metadata"]["name"]): d for d in _docs(COMPONENT / "client-certificates.yaml")
    }
    ca = docs[("Certificate", "gatekeeper-apiserver-client-ca")]
    issuer = docs[("Issuer", "gatekeeper-apiserver-client-ca")]
    client = docs[("Certificate", "gatekeeper-apiserver-client")]
    assert issuer["spec"]["ca"]["secretName"] == ca["spec"]["secretName"]
    assert client["spec"]["issuerRef"]["name"] == issuer["metadata"]["name"]
    assert (
        "client auth" in client["spec"]["usages"] and "server auth" not in client["spec"]["usages"]
    )
    base = {(d["kind"], d["metadata"]["name"]) for d in _docs(DEPLOY / "certificate.yaml")}
    assert ("Issuer", ca["spec"]["issuerRef"]["name"]) in base  # self-signed, the base's


def test_the_control_plane_files_name_the_webhook_s_service() -> None:
    admission = yaml.safe_load(
        (COMPONENT / "control-plane" / "admission-configuration.yaml.example").read_text()
    )
    plugins = {p["name"]: p["configuration"] for p in admission["plugins"]}
    assert set(plugins) == {"ValidatingAdmissionWebhook", "MutatingAdmissionWebhook"}
    kubeconfig = yaml.safe_load(
        (COMPONENT / "control-plane" / "webhook-kubeconfig.yaml.example").read_text()
    )
    assert {c["kubeConfigFile"] for c in plugins.values()} == {
        "/etc/kubernetes/gatekeeper/webhook-kubeconfig.yaml"
    }
    (service,) = [d for d in _docs(DEPLOY / "service.yaml") if d["kind"] == "Service"]
    (user,) = kubeconfig["users"]
    name = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert user["name"] == name and service["spec"]["ports"][0]["port"] == 443
    assert set(user["user"]) == {"client-certificate", "client-key"}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kustomize_builds_it_with_the_cluster_component(tmp_path: Path) -> None:
    shutil.copytree(DEPLOY.parent, tmp_path / "deploy")
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["deploy/kubernetes"],
        "components": ["deploy/kubernetes/components/cluster",
                       "deploy/kubernetes/components/webhook-client-auth"],
    }))  # fmt: skip
    built = subprocess.run(["kubectl", "kustomize", str(tmp_path)], capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    assert built.returncode == 0, built.stderr
    docs = [d for d in yaml.safe_load_all(built.stdout) if d]
    (webhook,) = [
        d
        for d in docs
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "gatekeeper-webhook"
    ]
    (container,) = webhook["spec"]["template"]["spec"]["containers"]
    assert {
        "--mutate",
        "--client-ca-file=/etc/gatekeeper/client-ca/ca.crt",
        "--health-port=8081",
    } <= set(container["args"])
