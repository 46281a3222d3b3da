"""The pods on a node that hold GPUs gatekeeper's books do not count
(``gatekeeper.cluster.unclaimed``, pure; issue 38 item 4)."""

from __future__ import annotations

from typing import Any

from gatekeeper.cluster.unclaimed import UnclaimedPod, unclaimed_gpu_pods, unclaimed_text


def pod(name: str, *, gpus: object = None, init: bool = False, phase: str = "Running",
        claims: list[str] | None = None, section: str = "limits") -> dict[str, Any]:  # fmt: skip
    container: dict[str, Any] = {"name": "c", "image": "vllm"}
    if gpus is not None:
        container["resources"] = {section: {"nvidia.com/gpu": gpus}}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if init:
        spec["initContainers"] = [container]
    else:
        spec["containers"].append(container)
    if claims is not None:
        spec["resourceClaims"] = [{"name": c, "resourceClaimName": f"x-{c}"} for c in claims]
    return {"metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
            "spec": spec, "status": {"phase": phase}}  # fmt: skip


def test_whole_gpus_in_no_gatekeeper_claim_are_found() -> None:
    pods = [
        pod("whole", gpus=2),
        pod("as-text", gpus="1", section="requests"),
        pod("in-init", gpus=1, init=True),
        pod("claimed", gpus=1, claims=["vllm-gpus"]),
        pod("claimed-second", gpus=1, claims=["other", "vllm-gpus-1"]),
        pod("own-claim-only", gpus=1, claims=["gpu"]),
        pod("none"),
        pod("zero", gpus=0),
        pod("garbage", gpus="lots"),
        pod("done", gpus=1, phase="Succeeded"),
        pod("failed", gpus=1, phase="Failed"),
        {"metadata": "odd", "spec": [], "status": None},
    ]
    found = unclaimed_gpu_pods(pods)
    assert [(p.name, p.gpus) for p in found] == [
        ("as-text", 1), ("in-init", 1), ("own-claim-only", 1), ("whole", 2),
    ]  # fmt: skip


def test_what_is_said_of_one() -> None:
    text = unclaimed_text(UnclaimedPod("team-a", "qwen-0", "u", 2), "node-a")
    assert text.startswith("pod team-a/qwen-0 holds 2 whole GPU(s) of node node-a through ")
    assert "nvidia.com/gpu, in no gatekeeper claim" in text and "delete it" in text
