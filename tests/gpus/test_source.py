"""The one reading of the ``gpus`` setting: the driver or a declared node."""

from __future__ import annotations

import pytest

from gatekeeper.errors import GatekeeperError
from gatekeeper.gpus import NvmlInventory, StaticInventory, parse_gpu_source
from gatekeeper.settings import Settings, gpu_source, placement_policy


def test_a_declared_node_is_parsed_once_and_served_statically():
    source = parse_gpu_source("2xH100-80GB")
    assert source.is_declared
    inventory = source.inventory(visible_devices=None)
    assert isinstance(inventory, StaticInventory)
    assert [g.name for g in source.snapshot(visible_devices=None).gpus] == ["H100-80GB"] * 2


def test_nvml_is_the_driver_and_is_not_touched_until_read():
    source = parse_gpu_source(" NVML ")
    assert not source.is_declared and source.declared is None
    inventory = source.inventory(visible_devices="0")
    assert isinstance(inventory, NvmlInventory)
    inventory.close()


def test_a_bad_declaration_names_the_value():
    with pytest.raises(GatekeeperError, match="2xWHAT"):
        parse_gpu_source("2xWHAT")


def test_settings_name_the_source_and_the_policy_once():
    settings = Settings(gpus="1xL4", safety_margin_bytes=2**30, share_gpus=True)
    assert gpu_source(settings).is_declared
    assert gpu_source(settings, "nvml").declared is None  # the CLI's --node wins
    policy = placement_policy(settings)
    assert policy.share_gpus and policy.margin_bytes == 2**30
    assert policy.margin_for(100 * 2**30) == 2**30 + int(0.02 * 100 * 2**30)
