"""Shared fixtures. The NVML stand-in driver (``gatekeeper/gpus/stand_in``): built once per
session with gcc, preloaded in-process, its state file per test."""

from __future__ import annotations

import ctypes.util
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from gatekeeper.gpus.stand_in import STATE_ENV, FakeNvml, build_stub, preload

pytest_plugins = ["tests.support.golden_option"]

NO_GCC = (
    "gcc is not installed, so the NVML stand-in driver (gatekeeper/gpus/stand_in/fake_nvml.c) "
    "cannot be built; install gcc (apt-get install gcc libc6-dev) to run these tests"
)

NO_DRIVER = "needs an NVIDIA driver (libnvidia-ml.so.1 was not found); runs on a GPU machine"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip tests marked ``gpu`` where no NVIDIA driver library is installed."""
    if ctypes.util.find_library("nvidia-ml") is not None:
        return
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(pytest.mark.skip(reason=NO_DRIVER))


@pytest.fixture(scope="session")
def nvml_stub_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in ``libnvidia-ml.so.1`` with every entry point."""
    if shutil.which("gcc") is None:
        pytest.skip(NO_GCC)
    return build_stub(tmp_path_factory.mktemp("nvml_stub"))


@pytest.fixture(scope="session")
def nvml_stub_old_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in as an older driver: no memory info v2, no process list v3."""
    if shutil.which("gcc") is None:
        pytest.skip(NO_GCC)
    return build_stub(
        tmp_path_factory.mktemp("nvml_stub_old"), ["OMIT_MEMORY_V2", "OMIT_PROCESSES_V3"]
    )


@pytest.fixture
def fake_nvml(
    nvml_stub_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FakeNvml]:
    """The stand-in loaded in this process, serving an empty node until ``set``.

    After the test, every ``nvmlInit`` must have been matched by a shutdown.
    """
    try:
        library = preload(nvml_stub_lib)
    except RuntimeError as e:
        pytest.skip(f"the NVML stand-in cannot be used in this process: {e}")
    state = tmp_path / "nvml_state.txt"
    monkeypatch.setenv(STATE_ENV, str(state))
    fake = FakeNvml(state, library)
    fake.set(gpus=[])
    yield fake
    assert fake.init_count() == 0, "an NvmlInventory was not closed"
