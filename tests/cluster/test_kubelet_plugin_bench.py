"""``bench.dra_prepare`` on the session's control plane, small: the installed agent's
kubelet plugin prepares claims over its socket, and a race for GPU 0's last bytes admits
exactly what fits (the rest wait, then are refused) and a waiter is admitted when one
racer is unprepared; and, where cgroups can be made (root), the agent's ``/metrics``
attributes each bound pod's process in its pod's cgroup to the pod."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.dra_prepare import Plan, measure
from bench.pod_cgroups import cgroup_root
from tests.support.kube_cluster import KubeCluster

pytestmark = pytest.mark.k8s
GIB = 2**30


def test_the_race_admits_what_fits_and_no_byte_beyond_free_memory(
    kube_cluster: KubeCluster, nvml_stub_lib: Path, tmp_path: Path
) -> None:
    plan = Plan(claims=4, racers=12, race_free_bytes=5 * GIB, race_claim_bytes=2 * GIB, scrapes=3)
    figures = measure(kube_cluster, tmp_path, nvml_stub_lib, plan)
    assert (figures["admitted"], figures["refused"], figures["fit"]) == (2, 10, 2)
    assert (figures["admitted_bytes"], figures["over_admitted_bytes"]) == (4 * GIB, 0)
    # the 10 that do not fit wait (the line holds 12) their 2 s out, then are refused
    assert (figures["refused_after_waiting"], figures["refused_at_once_line_full"]) == (10, 0)
    assert figures["race_seconds"] >= plan.wait_seconds
    # admitted within one read of NVML (every 0.5 s in the installed agent) of the
    # unprepare: this cannot tell the unprepare's wake-up from that read; the wake-up is
    # shown where NVML is read every 5 s (test_kubelet_plugin's waiting prepare admitted
    # as soon as the holder is unprepared)
    assert figures["waiter_admitted_after_unprepare_seconds"] < 0.5
    assert 0 < figures["prepare_p50_seconds"] <= figures["prepare_max_seconds"]
    assert figures["again_p50_seconds"] > 0 and figures["claims"] == 4
    if cgroup_root() is not None:  # measure() raises when /metrics misses a pod's 1 GiB
        assert figures["scrape_pods"] == 4 and figures["scrape_p50_seconds"] > 0
