"""The claims modes' objects, pure (issue 29 item 3): the same sizing as gatekeeper's claim,
as a claim against NVIDIA's DRA driver, and as HAMi's extended resources; each object
strictly valid for Kubernetes 1.34-1.37. Through the real apiserver:
``test_claims_modes_cluster.py``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, get_args

import kubernetes_validate
import pytest
import yaml

from gatekeeper.cli.entry import build_parser
from gatekeeper.cluster.claim_annotation import CLAIM_ANNOTATION, entry
from gatekeeper.cluster.claims import (
    CLAIMS_MODES,
    GATEKEEPER_DRIVER,
    HAMI_GPU,
    HAMI_GPUMEM,
    NVIDIA_DRIVER,
    RankSizing,
    claim_driver,
    claim_template,
    claim_template_spec,
    hami_resources,
)
from gatekeeper.k8s.claim_record import intact
from gatekeeper.k8s.pod_patch import template_ops, with_budget_flags, with_resources
from gatekeeper.k8s.workloads import pod_templates, vllm_containers
from gatekeeper.settings import Settings
from tests.support.vllm_workloads import MODEL, deployment, patched

MiB = 2**20
VERSIONS = ["1.34", "1.35", "1.36", "1.37"]
SIZING = RankSizing(2, 20 * 2**30 + 1, 2**30, 0.1172, (8, 9))


def test_the_setting_offers_exactly_the_modes() -> None:
    field = Settings.model_fields["webhook_claims_mode"]
    assert get_args(field.annotation) == CLAIMS_MODES == ("gatekeeper", "nvidia-dra", "hami")
    assert Settings().webhook_claims_mode == "gatekeeper"
    assert claim_driver("gatekeeper") is GATEKEEPER_DRIVER
    assert claim_driver("nvidia-dra") is NVIDIA_DRIVER
    assert claim_driver("hami") is None


def test_a_claim_against_nvidias_driver_uses_its_class_and_attribute_names() -> None:
    """NVIDIA's driver publishes ``uuid`` and ``cudaComputeCapability`` (a version) in its
    own domain and no node attribute: its slices are node-local, so a claim's devices are
    on one node without a constraint; distinct GPUs still need one."""
    devices = claim_template_spec(SIZING, NVIDIA_DRIVER)["spec"]["devices"]
    for request in devices["requests"]:
        exactly = request["exactly"]
        assert exactly["deviceClassName"] == "gpu.nvidia.com"
        assert exactly["capacity"]["requests"]["memory"] == str(SIZING.request_bytes)
        (selector,) = exactly["selectors"]
        assert selector["cel"]["expression"] == (
            '"cudaComputeCapability" in device.attributes["gpu.nvidia.com"] && '
            'device.attributes["gpu.nvidia.com"].cudaComputeCapability'
            '.compareTo(semver("8.9.0")) >= 0'
        )
    assert devices["constraints"] == [
        {"requests": ["rank0", "rank1"], "distinctAttribute": "gpu.nvidia.com/uuid"}
    ]
    ours = claim_template_spec(SIZING, GATEKEEPER_DRIVER)["spec"]["devices"]["constraints"]
    assert [next(k for k in c if k != "requests") for c in ours] == [
        "matchAttribute",
        "distinctAttribute",
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_nvidia_template_validates_strictly(version: str) -> None:
    for sizing in (SIZING, RankSizing(1, 3 * 2**30, 2**30, 0.05, None)):
        spec = claim_template_spec(sizing, NVIDIA_DRIVER)
        kubernetes_validate.validate(claim_template("ns", spec), version, strict=True)


def test_hamis_resources_are_the_ranks_and_each_ranks_mib() -> None:
    """HAMi's ``nvidia.com/gpumem`` is MiB per GPU; the request is already whole MiB."""
    resources = hami_resources(SIZING)
    assert resources == {HAMI_GPU: "2", HAMI_GPUMEM: str(SIZING.request_bytes // MiB)}
    assert int(resources[HAMI_GPUMEM]) * MiB >= SIZING.rank_bytes


def _hami_deployment(requests: bool = False) -> dict[str, Any]:
    """A Deployment as vLLM's docs write one, with its container edited as ``hami`` mode
    edits it (the flags, HAMi's resources, the record)."""
    limits = {"nvidia.com/gpu": 2, **({"cpu": "4"} if requests else {})}
    resources = {"limits": limits, **({"requests": dict(limits)} if requests else {})}
    manifest = deployment("qwen", "ns", [MODEL, "-tp", "2"], resources=resources)
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    edited = with_budget_flags(container, SIZING.kv_cache_memory_bytes, 0.1172)
    assert isinstance(edited, dict)
    edited = with_resources(edited, hami_resources(SIZING))
    note = json.dumps({"vllm": entry(None, SIZING, "hami")})
    ops = template_ops(
        "/spec/template", manifest["spec"]["template"], {0: edited}, None, (CLAIM_ANNOTATION, note)
    )
    assert not any(op["path"].endswith("resourceClaims") for op in ops)
    return patched(manifest, ops)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_hami_workload_validates_strictly(version: str) -> None:
    for requests in (False, True):
        kubernetes_validate.validate(_hami_deployment(requests), version, strict=True)


def test_hamis_resources_go_where_kubernetes_requires_them() -> None:
    """Limits always; requests only where the container names them (an extended
    resource's request must equal its limit)."""
    (container,) = _hami_deployment(requests=True)["spec"]["template"]["spec"]["containers"]
    expected = {HAMI_GPU: "2", HAMI_GPUMEM: str(SIZING.request_bytes // MiB)}
    assert container["resources"]["limits"] == {"cpu": "4", **expected}
    assert container["resources"]["requests"] == {"cpu": "4", **expected}
    (bare,) = _hami_deployment()["spec"]["template"]["spec"]["containers"]
    assert "requests" not in bare["resources"]


def test_a_hami_record_holds_while_its_gpumem_is_there() -> None:
    """The record names the mode and no template; it holds while the container asks for
    the recorded MiB and reads with the recorded flags, and not once the MiB change."""
    manifest = _hami_deployment()
    (template,) = pod_templates("Deployment", manifest)
    record = json.loads(template.annotations[CLAIM_ANNOTATION])["vllm"]
    assert record["mode"] == "hami" and "template" not in record
    assert intact(template, vllm_containers(template, "0.32.0"))
    limits = manifest["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    limits[HAMI_GPUMEM] = "1024"
    (changed,) = pod_templates("Deployment", manifest)
    assert not intact(changed, vllm_containers(changed, "0.32.0"))


DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
KUBECTL = shutil.which("kubectl")


@pytest.mark.skipif(KUBECTL is None, reason="kubectl (its kustomize) is not installed")
@pytest.mark.parametrize("mode", ["nvidia-dra", "hami"])
def test_each_modes_component_runs_the_webhook_in_it_without_the_agent(
    mode: str, tmp_path: Path
) -> None:
    """The base, the cluster component and the mode's component, built by kustomize: the
    webhook parses as ``gatekeeper webhook --mutate --claims-mode MODE`` without
    ``--published-devices``, and nothing of gatekeeper's publishing is left (exactly one DRA
    driver publishes a GPU; a cluster without DRA has nothing to publish to)."""
    components = DEPLOY / "components"
    overlay = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY, tmp_path)],
        "components": [
            os.path.relpath(components / c, tmp_path) for c in ("cluster", f"claims-{mode}")
        ],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    built = subprocess.run(
        [str(KUBECTL), "kustomize", "--load-restrictor=LoadRestrictionsNone", str(tmp_path)],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    docs = [d for d in yaml.safe_load_all(built.stdout) if d]
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("MutatingWebhookConfiguration", "gatekeeper-vllm-claims") in kinds
    assert not {k for k in kinds if k[0] == "DeviceClass" or "gatekeeper-agent" in k[1]}
    (webhook,) = [d for d in docs if d["metadata"]["name"] == "gatekeeper-webhook"
                  and d["kind"] == "Deployment"]  # fmt: skip
    args = build_parser().parse_args(webhook["spec"]["template"]["spec"]["containers"][0]["args"])
    assert (args.mutate, args.claims_mode, args.published_devices) == (True, mode, False)
