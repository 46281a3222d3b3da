"""One vLLM version across the image, the manifests and the docs (#14): the version the
estimator assumes by default is the one the Dockerfile's examples build, the example
manifests run and the docs name."""

from __future__ import annotations

import re
from pathlib import Path

from gatekeeper.estimator.accounting import DEFAULT_VLLM_VERSION

ROOT = Path(__file__).resolve().parents[1]
PATTERNS = (
    re.compile(r"VLLM_VERSION=(\d+\.\d+\.\d+)"),
    re.compile(r"vllm/vllm-openai:v(\d+\.\d+\.\d+)"),
    re.compile(r"GATEKEEPER_DEFAULT_VLLM_VERSION` \((\d+\.\d+\.\d+)\)"),
)


def test_every_named_vllm_version_is_the_default_one() -> None:
    files = [ROOT / "Dockerfile", ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    files += sorted((ROOT / "deploy").rglob("*.yaml"))
    found = {
        f"{path.relative_to(ROOT)}: {match.group(0)}": match.group(1)
        for path in files
        for pattern in PATTERNS
        for match in pattern.finditer(path.read_text())
    }
    assert len(found) >= 4, found
    assert {k: v for k, v in found.items() if v != DEFAULT_VLLM_VERSION} == {}
