"""``helm install`` of deploy/helm/gatekeeper into the real control plane (issue 39 item 1):
the agent publishes its node's GPUs and a vLLM Deployment reaches Bound with its claim.

The release ``helm-gatekeeper`` goes into a namespace labelled ``restricted``, as
docs/cluster.md creates it, with the serving certificate Helm generates
(``webhook.tls.mode=generate``) and ``webhook.url`` pointing both webhook configurations at
loopback. The test control plane has no kubelet and no DaemonSet controller, so:

- the webhook Deployment's pods are created by the deployment controller in the restricted
  namespace (PodSecurity admits them: the test waits for them) but nothing runs them; the
  webhook runs as a process with the installed Deployment's arguments and environment, its
  mounts (the Secret Helm generated, /tmp) remapped to a temporary directory, the listen
  address to 127.0.0.1 and a free port, and the session's kubeconfig for the pod's token;
- the agent's DaemonSet makes no pod: its pod template, as installed, goes to the apiserver
  as a Pod (server-side dry run), which PodSecurity admits in the agent's privileged
  namespace and refuses in the release's; the agent runs as a process with the installed
  DaemonSet's arguments and environment (hostPath directories remapped to temporary ones,
  the metrics port to a free one, NODE_NAME to this module's node, the kubeconfig for the
  token) on two H100s of the NVML stand-in.

One module fixture; the release is uninstalled at the end (its webhook configurations go
before the webhook process stops). Figures printed: install, webhook and agent start,
Deployment created to pod bound.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, Client
from lightkube.codecs import from_dict
from lightkube.resources.admissionregistration_v1 import (
    MutatingWebhookConfiguration,
    ValidatingWebhookConfiguration,
)
from lightkube.resources.apps_v1 import DaemonSet, Deployment, ReplicaSet
from lightkube.resources.core_v1 import Node, Pod, Secret
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from gatekeeper.cluster import DRIVER_NAME
from gatekeeper.cluster.claim_annotation import CLAIM_ANNOTATION
from gatekeeper.gpus.stand_in import h100, subprocess_env, write_state
from tests.support import vllm_workloads
from tests.support.helm_chart import CHART, helm, helm_missing_reason, pod_of
from tests.support.kube_cluster import KubeCluster, ready_node
from tests.support.polling import wait_for
from tests.support.prometheus_server import free_port

pytestmark = [
    pytest.mark.k8s,
    pytest.mark.skipif(helm_missing_reason() is not None, reason=str(helm_missing_reason())),
]

RELEASE = "helm-gatekeeper"
NAMESPACE = RELEASE
AGENT_NAMESPACE = f"{RELEASE}-agent"
WORKLOADS = "helm-vllm"
NODE = "helm-node"
TAINT = {"key": "gatekeeper-test", "value": "helm", "effect": "NoSchedule"}
GATEKEEPER = Path(sys.executable).with_name("gatekeeper")
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted",
              "pod-security.kubernetes.io/enforce-version": "latest"}  # fmt: skip


@dataclasses.dataclass
class Installed:
    api: Client
    kubeconfig: Path
    values: Path
    work: Path
    webhook_port: int
    ca_pem: bytes
    figures: dict[str, float]


def _namespace(name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": dict(labels)}}  # fmt: skip


def _container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return dict(found)


def _remap(text: str, mounts: Mapping[str, Path]) -> str:
    """``text`` (an argument, ``--flag=PATH`` or ``PATH``, or an env value) with a mount
    path of the pod replaced by the local directory that stands for it."""
    flag, eq, value = text.rpartition("=") if text.startswith("--") else ("", "", text)
    for mount in sorted(mounts, key=len, reverse=True):
        if value == mount or value.startswith(mount + "/"):
            return f"{flag}{eq}{mounts[mount]}{value[len(mount) :]}"
    return text


def _local_mounts(container: dict[str, Any], root: Path) -> dict[str, Path]:
    """Each of the container's mount paths -> a directory under ``root`` (hostPath and
    emptyDir volumes); a Secret volume's files are written by the caller."""
    return {m["mountPath"]: root / m["name"] for m in container.get("volumeMounts", [])}


def _literal_env(container: dict[str, Any], mounts: Mapping[str, Path]) -> dict[str, str]:
    return {e["name"]: _remap(e["value"], mounts) for e in container.get("env", []) if "value" in e}


def _start(argv: list[str], env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=dict(env))


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _webhook_ready(port: int, ca_pem: bytes, process: subprocess.Popen[bytes], log: Path) -> bool:
    """/healthz at the name the certificate holds (localhost: webhook.tls.extraDnsNames)."""
    context = ssl.create_default_context(cadata=ca_pem.decode())
    url = f"https://localhost:{port}/healthz"
    with (
        contextlib.suppress(OSError),
        urllib.request.urlopen(url, context=context, timeout=2) as answer,
    ):
        return bool(answer.status == 200)
    assert process.poll() is None, f"gatekeeper webhook exited: {log.read_text()[-4000:]}"
    return False


def _start_webhook(installed: Installed, log: Path) -> subprocess.Popen[bytes]:
    """``gatekeeper webhook`` with the installed Deployment's arguments and environment."""
    api, work = installed.api, installed.work / "webhook"
    deployment = api.get(Deployment, f"{RELEASE}-webhook", namespace=NAMESPACE).to_dict()
    container = _container(deployment, "webhook")
    mounts = _local_mounts(container, work)
    secret = api.get(Secret, f"{RELEASE}-webhook-tls", namespace=NAMESPACE).to_dict()
    tls_mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "tls")
    mounts[tls_mount].mkdir(parents=True)
    for key, value in secret["data"].items():
        (mounts[tls_mount] / key).write_bytes(base64.b64decode(value))
    installed.ca_pem = (mounts[tls_mount] / "ca.crt").read_bytes()
    listen = {
        "--host=0.0.0.0": "--host=127.0.0.1",
        "--port=8443": f"--port={installed.webhook_port}",
    }
    args = [listen.get(a, _remap(a, mounts)) for a in container["args"]]
    assert args[:1] == ["webhook"] and set(listen.values()) <= set(args), args
    env = {k: v for k, v in subprocess_env(None, None).items() if not k.startswith("GATEKEEPER_")}
    env |= _literal_env(container, mounts) | {"GATEKEEPER_STATE_DIR": str(work / "state")}
    argv = [str(GATEKEEPER), *args, f"--kubeconfig={installed.kubeconfig}"]
    return _start(argv, env, log)


def _start_agent(
    installed: Installed, nvml_stub_lib: Path, sockets: Path
) -> tuple[subprocess.Popen[bytes], int]:
    """``gatekeeper agent`` with the installed DaemonSet's arguments and environment."""
    api = installed.api
    daemonset = api.get(DaemonSet, f"{RELEASE}-agent", namespace=AGENT_NAMESPACE).to_dict()
    container = _container(daemonset, "agent")
    mounts = _local_mounts(container, sockets)  # short: Unix socket paths
    args = [_remap(a, mounts) for a in container["args"]]
    port = free_port()
    args[args.index("--metrics-port") + 1] = str(port)
    state = installed.work / "nvml_state.txt"
    write_state(state, [h100(0), h100(1)])
    env = subprocess_env(nvml_stub_lib.parent, state) | _literal_env(container, mounts)
    env["NODE_NAME"] = NODE  # the pod's fieldRef spec.nodeName
    argv = [str(GATEKEEPER), *args, f"--kubeconfig={installed.kubeconfig}"]
    return _start(argv, env, installed.work / "agent.log"), port


@pytest.fixture(scope="module")
def installed(
    kube_cluster: KubeCluster, nvml_stub_lib: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installed]:
    work = tmp_path_factory.mktemp("helm-install")
    api = kube_cluster.client()
    node = ready_node(NODE, (TAINT,))
    node["metadata"]["labels"]["nvidia.com/gpu.present"] = "true"
    for manifest in (_namespace(NAMESPACE, RESTRICTED), node, _namespace(WORKLOADS, {})):
        api.create(from_dict(manifest))
    port = free_port()
    values = work / "values.yaml"
    values.write_text(yaml.safe_dump({"webhook": {
        "url": f"https://localhost:{port}",
        "tls": {"mode": "generate", "extraDnsNames": ["localhost"]},
    }}))  # fmt: skip
    kubeconfig = kube_cluster.kubeconfig
    figures: dict[str, float] = {}
    start = time.monotonic()
    # --take-ownership: the DeviceClass gpu.gatekeeper.dev is the cluster's, and another
    # module of the session may have made it.
    helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kubeconfig",
         str(kubeconfig), "-f", str(values), "--take-ownership")  # fmt: skip
    figures["install"] = time.monotonic() - start
    installed = Installed(api, kubeconfig, values, work, port, b"", figures)
    sockets = Path(tempfile.mkdtemp(prefix="helm", dir="/tmp"))
    processes: list[subprocess.Popen[bytes]] = []
    try:
        start = time.monotonic()
        processes.append(_start_webhook(installed, work / "webhook.log"))
        wait_for("the webhook's /healthz", lambda: _webhook_ready(
            port, installed.ca_pem, processes[0], work / "webhook.log"))  # fmt: skip
        figures["webhook start"] = time.monotonic() - start
        start = time.monotonic()
        agent, figures["agent metrics port"] = _start_agent(installed, nvml_stub_lib, sockets)
        processes.append(agent)
        wait_for("the agent's slice", lambda: _slice(api), timeout_seconds=60)
        figures["agent start to slice"] = time.monotonic() - start
        yield installed
    finally:
        with contextlib.suppress(AssertionError):
            helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--kubeconfig", str(kubeconfig))
        # Gone even if the uninstall failed: a configuration left behind (failurePolicy Fail,
        # a webhook that no longer answers) would refuse the next modules' vLLM workloads.
        with contextlib.suppress(ApiError):
            api.delete(MutatingWebhookConfiguration, f"{RELEASE}-vllm-claims")
        with contextlib.suppress(ApiError):
            api.delete(ValidatingWebhookConfiguration, f"{RELEASE}-vllm")
        for process in processes:
            _stop(process)
        shutil.rmtree(sockets, ignore_errors=True)
        # No garbage collector runs here: the webhook Deployment's ReplicaSet and pods (and
        # the vLLM Deployment's) outlive their owners unless deleted, and would keep the
        # scheduler busy for the modules after this one.
        for namespace in (NAMESPACE, WORKLOADS):
            for owned in (Deployment, ReplicaSet, Pod):
                api.deletecollection(owned, namespace=namespace)
        for kind, name in ((ResourceSlice, f"{NODE}-{DRIVER_NAME}"), (Node, NODE)):
            with contextlib.suppress(ApiError):
                api.delete(kind, name)
        api.close()


def _slice(api: Client) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = api.get(ResourceSlice, f"{NODE}-{DRIVER_NAME}").to_dict()
    except ApiError:
        return None
    return found


def test_the_agents_pod_is_admitted_in_its_namespace_and_refused_in_the_releases(
    installed: Installed,
) -> None:
    api = installed.api
    daemonset = api.get(DaemonSet, f"{RELEASE}-agent", namespace=AGENT_NAMESPACE).to_dict()
    admitted = api.create(from_dict(pod_of(daemonset, AGENT_NAMESPACE)),
                          dry_run=True)  # fmt: skip
    assert admitted.metadata is not None and admitted.metadata.name == f"{RELEASE}-agent"
    with pytest.raises(ApiError) as refused:
        api.create(from_dict(pod_of(daemonset, NAMESPACE)), dry_run=True)
    message = str(refused.value.status.message)
    assert refused.value.status.code == 403, message
    assert 'violates PodSecurity "restricted:latest"' in message and "hostPID=true" in message
    assert 'restricted volume type "hostPath"' in message


def test_the_webhooks_pods_are_admitted_in_the_restricted_namespace(installed: Installed) -> None:
    """The deployment controller's pods of the webhook Deployment pass PodSecurity
    "restricted" (nothing runs them: there is no kubelet)."""
    labels: dict[str, Any] = {"app.kubernetes.io/name": "gatekeeper",
                              "app.kubernetes.io/component": "webhook"}  # fmt: skip

    def pods() -> list[Pod] | None:
        found = list(installed.api.list(Pod, namespace=NAMESPACE, labels=labels))
        return found if len(found) == 2 else None

    assert len(wait_for("the webhook Deployment's 2 pods", pods)) == 2


def _bound(api: Client) -> dict[str, Any] | None:
    for pod in api.list(Pod, namespace=WORKLOADS, labels={"app": "qwen"}):
        if pod.spec is not None and pod.spec.nodeName:
            found: dict[str, Any] = pod.to_dict()
            return found
    return None


def test_a_vllm_deployment_reaches_bound_with_its_claim(installed: Installed) -> None:
    api = installed.api
    published = _slice(api)
    assert published is not None and len(published["spec"]["devices"]) == 2
    pod_fields = {"tolerations": [{**TAINT, "operator": "Equal"}],
                  "nodeSelector": {"kubernetes.io/hostname": NODE}}  # fmt: skip
    args = [vllm_workloads.MODEL, "--max-model-len", "8192", "--tensor-parallel-size", "2"]
    manifest = vllm_workloads.deployment("qwen", WORKLOADS, args, pod=pod_fields)
    start = time.monotonic()
    made: Any = api.create(from_dict(manifest))
    created: dict[str, Any] = made.to_dict()
    pod = wait_for("the vLLM pod bound", lambda: _bound(api), timeout_seconds=60)
    installed.figures["created to bound"] = time.monotonic() - start
    annotations = created["spec"]["template"]["metadata"]["annotations"]
    record = json.loads(annotations[CLAIM_ANNOTATION])["vllm"]  # the chart's mutating webhook
    assert pod["spec"]["nodeName"] == NODE
    (claim,) = [c.to_dict() for c in api.list(ResourceClaim, namespace=WORKLOADS)]
    results = claim["status"]["allocation"]["devices"]["results"]
    assert sorted(r["request"] for r in results) == ["rank0", "rank1"]
    assert {(r["driver"], r["pool"]) for r in results} == {(DRIVER_NAME, NODE)}
    assert claim["status"]["reservedFor"][0]["name"] == pod["metadata"]["name"]
    assert record["memoryBytes"] > 0
    print("helm chart figures (s): " + ", ".join(
        f"{k} {v:.2f}" for k, v in installed.figures.items() if k != "agent metrics port"))  # fmt: skip


def test_helm_upgrade_keeps_the_generated_certificate(installed: Installed) -> None:
    api = installed.api
    before = api.get(Secret, f"{RELEASE}-webhook-tls", namespace=NAMESPACE).to_dict()["data"]
    helm("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kubeconfig",
         str(installed.kubeconfig), "-f", str(installed.values))  # fmt: skip
    after = api.get(Secret, f"{RELEASE}-webhook-tls", namespace=NAMESPACE).to_dict()["data"]
    assert after == before
    assert base64.b64decode(after["ca.crt"]) == installed.ca_pem
