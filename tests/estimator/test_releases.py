"""A vLLM release past the newest one gatekeeper models is never estimated silently: every
door names it and what was applied instead (#37)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry

from gatekeeper.estimator.accounting import ACCOUNTINGS, DEFAULT_VLLM_VERSION, accounting_for
from gatekeeper.estimator.releases import (
    newest_modelled_release,
    release_modelled,
    release_warning,
)
from gatekeeper.k8s.server import webhook_from_settings
from gatekeeper.metrics.release_info import register_release_info
from gatekeeper.settings import Settings
from gatekeeper.vllm.table import flag_table, shipped_releases
from tests.k8s.test_webhook import LLAMA_8B
from tests.k8s.test_webhook_versions import review, warnings

ROOT = Path(__file__).resolve().parents[2]
PAST = "0.99.0"


def test_the_newest_modelled_release_is_the_newest_span_and_the_newest_table() -> None:
    newest = newest_modelled_release()
    assert accounting_for(newest) is ACCOUNTINGS[-1]
    assert shipped_releases()[-1] == newest
    assert release_modelled(DEFAULT_VLLM_VERSION)


def test_a_release_past_the_newest_is_named_with_what_was_applied() -> None:
    newest = newest_modelled_release()
    warning = release_warning(PAST)
    assert warning is not None
    assert f"vLLM {PAST} is newer than the newest release gatekeeper models ({newest})" in warning
    assert f"{ACCOUNTINGS[-1].name}'s rules" in warning
    assert f"vLLM {flag_table(PAST).vllm}'s flag table" in warning
    assert f"scripts/vllm-release.sh {PAST}" in warning
    # a patch release of the newest minor is modelled (a span says when a patch differs)
    major, minor, _ = newest.split(".")
    assert release_warning(f"{major}.{minor}.7") is None
    assert release_warning("0.19.1") is None and release_warning("0.8.5 V0") is None


def _gatekeeper(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gatekeeper", *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip


def test_estimate_and_check_name_the_release_in_text_and_json() -> None:
    model = "meta-llama/Llama-3.1-8B-Instruct"
    text = _gatekeeper("estimate", model, "--gpu", "H100-80GB", "--vllm-version", PAST)
    assert text.returncode == 0, text.stderr
    assert f"vLLM {PAST} is newer than the newest release" in text.stdout
    data = json.loads(
        _gatekeeper(
            "estimate", model, "--gpu", "H100-80GB", "--vllm-version", PAST, "--json"
        ).stdout
    )
    assert any(PAST in w for w in data["warnings"]), data["warnings"]
    check = _gatekeeper("check", model, "--node", "1xH100-80GB", "--vllm-version", PAST, "--json")
    assert f"vLLM {PAST} is newer than the newest release" in check.stdout, check.stdout[-2000:]
    modelled = _gatekeeper("estimate", model, "--gpu", "H100-80GB", "--json")
    assert not any("newer than the newest" in w for w in json.loads(modelled.stdout)["warnings"])


def test_the_webhook_warns_of_an_image_past_the_newest_release() -> None:
    webhook = webhook_from_settings(Settings())
    past = review(webhook, f"vllm/vllm-openai:v{PAST}", LLAMA_8B, "--max-model-len", "4096")
    assert f"vLLM {PAST} is newer than the newest release" in warnings(past), past
    newest = newest_modelled_release()
    ok = review(webhook, f"vllm/vllm-openai:v{newest}", LLAMA_8B, "--max-model-len", "4096")
    assert "newer than the newest release" not in warnings(ok), ok


def test_metrics_say_which_release_is_sized_for_and_whether_it_is_modelled() -> None:
    for release, modelled in ((PAST, "false"), (DEFAULT_VLLM_VERSION, "true")):
        registry = CollectorRegistry()
        register_release_info(registry, release)
        labels = {
            "release": release,
            "accounting": accounting_for(release).name,
            "flag_table": flag_table(release).vllm,
            "newest_modelled": newest_modelled_release(),
            "modelled": modelled,
        }
        assert registry.get_sample_value("gatekeeper_vllm_release_info", labels) == 1.0
