"""The record of allocations on vanished GPUs that the agent keeps on its slice
(``accounting.orphans_text`` / ``parse_orphans``), pure."""

from __future__ import annotations

import pytest

from gatekeeper.cluster.accounting import (
    VANISHED_ANNOTATION,
    Allocation,
    orphan_key,
    orphans_text,
    parse_orphans,
)

HELD = Allocation("team-a", "qwen-gpu-x", "gpu-1", 12 * 2**30, ("qwen-0", "qwen-1"))
OTHER = Allocation("team-a", "llama-gpu-y", "gpu-0", 2**20, ())


def test_the_record_reads_back_as_written_in_one_order():
    orphans = {orphan_key(a): (a, f"GPU-{a.device}") for a in (HELD, OTHER)}
    text = orphans_text(orphans)
    assert parse_orphans(text) == orphans
    assert text == orphans_text(dict(reversed(orphans.items())))  # compared as text
    assert text.index("llama-gpu-y") < text.index("qwen-gpu-x")
    assert '"memoryBytes":12884901888' in text and '"pods":["qwen-0","qwen-1"]' in text
    assert orphans_text({}) == "[]"


@pytest.mark.parametrize("text", ["", "{", '{"claim": "x"}', "[1]", '[{"claim": "x"}]'])
def test_a_damaged_record_is_refused_naming_the_annotation_and_its_fields(text):
    with pytest.raises(ValueError, match=VANISHED_ANNOTATION) as caught:
        parse_orphans(text)
    assert "namespace, claim, device, uuid, memoryBytes and pods" in str(caught.value)
