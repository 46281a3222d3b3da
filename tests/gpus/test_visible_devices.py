"""``CUDA_VISIBLE_DEVICES`` parsing and mapping (pure; the NVML side is in test_nvml_stub)."""

from __future__ import annotations

import pytest

from gatekeeper.gpus.visible_devices import (
    VisibleDevicesError,
    parse_visible_devices,
    select_devices,
    worker_cuda_env,
)

GPUS = [(0, "GPU-aaaa-0000"), (1, "GPU-bbbb-1111"), (2, "GPU-bbbc-2222"), (3, None)]


@pytest.mark.parametrize(
    ("value", "tokens"),
    [
        (None, None),
        ("", ()),
        ("  ", ()),
        ("-1", ()),
        ("0", ("0",)),
        (" 2, 0 ", ("2", "0")),
        ("1,-1,3", ("1",)),
        ("GPU-aaaa,1", ("GPU-aaaa", "1")),
    ],
)
def test_parse(value: str | None, tokens: tuple[str, ...] | None) -> None:
    assert parse_visible_devices(value) == tokens


@pytest.mark.parametrize("value", ["0,,1", "0,"])
def test_parse_rejects_empty_entries(value: str) -> None:
    with pytest.raises(VisibleDevicesError, match=f"CUDA_VISIBLE_DEVICES={value!r} has an empty"):
        parse_visible_devices(value)


def test_select_by_index_and_uuid_prefix() -> None:
    assert select_devices(["2", "0"], GPUS, value="2,0") == (0, 2)
    assert select_devices(["GPU-bbbb"], GPUS, value="GPU-bbbb") == (1,)
    assert select_devices(["GPU-bbbc-2222", "0"], GPUS, value="x") == (0, 2)
    assert select_devices([], GPUS, value="") == ()


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        (["7"], "names GPU 7, but NVML sees GPUs 0, 1, 2, 3"),
        (["GPU-bbb"], "matches 2 GPUs (GPUs 1, 2) by UUID"),
        (["GPU-zzzz"], "matches no GPU by UUID"),
        (["MIG-1234"], "MIG instance MIG-1234"),
        (["1", "GPU-bbbb"], "names GPU 1 twice"),
    ],
)
def test_select_errors_name_the_value(tokens: list[str], expected: str) -> None:
    value = ",".join(tokens)
    with pytest.raises(VisibleDevicesError) as info:
        select_devices(tokens, GPUS, value=value)
    assert expected in str(info.value)
    assert f"CUDA_VISIBLE_DEVICES={value!r}" in str(info.value)


def test_worker_env_uses_nvml_indices_in_pci_order() -> None:
    assert worker_cuda_env([2, 3]) == {
        "CUDA_VISIBLE_DEVICES": "2,3",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
