"""README's two set-up commands, as make plans them for a fresh virtual environment
(``make -n``: the real Makefile, nothing run): ``make run`` installs what
``gatekeeper serve`` needs and no test extra, ``make test`` adds the test extras before it
runs the checks. The sizes quoted in the Makefile and the README were measured with
``du -sb`` on fresh venvs (issue 31 item 2)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def planned(target: str, venv: Path) -> list[str]:
    # under `make test` (CI) this make is a sub-make: MAKEFLAGS and MAKELEVEL would make it
    # print "make[1]: Entering/Leaving directory" lines among the commands
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    result = subprocess.run(
        ["make", "--no-print-directory", "-n", target, f"VENV={venv}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def installs(lines: list[str]) -> list[str]:
    return [line.split(" install -q ", 1)[1] for line in lines if "/pip install -q " in line]


def test_make_run_installs_the_runtime_only(tmp_path):
    lines = planned("run", tmp_path / "venv")
    assert installs(lines) == ["--upgrade pip", "-e ."]
    assert lines[-1] == f"{tmp_path / 'venv'}/bin/gatekeeper serve --rehearsal"


def test_make_test_adds_the_test_extras_before_the_checks(tmp_path):
    lines = planned("test", tmp_path / "venv")
    assert installs(lines) == ["--upgrade pip", "-e .", "-e '.[test]'"]
    extras = next(i for i, line in enumerate(lines) if "[test]" in line)
    assert extras < lines.index("bash scripts/test-deps.sh")
    assert lines[-1] == f"{tmp_path / 'venv'}/bin/pytest"


def test_a_run_venv_gets_the_test_extras_when_make_test_follows(tmp_path):
    """After ``make run`` (its stamp present), ``make test`` installs only the extras."""
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".installed").touch()
    assert installs(planned("test", venv)) == ["-e '.[test]'"]
    assert installs(planned("run", venv)) == []


def test_the_dockerfile_s_size_is_of_what_it_installs():
    """The Dockerfile quotes the measured size of /opt/gatekeeper installed by its own
    command (issue 31 item 13): a changed install line must be measured again."""
    text = (ROOT / "Dockerfile").read_text()
    quoted = re.search(r"\(`(pip install [^`]+)`\)[^`]*?measured (\d+) MiB", text)
    assert quoted is not None, "the Dockerfile states no measured size"
    assert f"/opt/gatekeeper/bin/{quoted.group(1)}\n" in text
