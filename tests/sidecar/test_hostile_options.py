"""Hostile serving options at the admin API: a clean 400 at once, the ledger never held."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.sidecar_harness import running_sidecar, settings_for

HOSTILE = [
    b'{"model": "tiny", "options": {"max_model_len": 4096.5}}',
    b'{"model": "tiny", "options": {"max_model_len": 1e400}}',
    b'{"model": "tiny", "options": {"max_model_len": NaN}}',
    b'{"model": "tiny", "options": {"gpu_memory_utilization": Infinity}}',
    b'{"model": "tiny", "options": {"gpu_memory_utilization": NaN}}',
    b'{"model": "tiny", "options": {"enforce_eager": "no"}}',
    b'{"model": "tiny", "options": {"dtype": ["bfloat16"]}}',
    b'{"model": "tiny", "options": {"dtype": "BF16"}}',
    b'{"model": "tiny", "options": {"max_model_len": true}}',
    b'{"model": "tiny", "options": {"kv_cache_memory_bytes": "20GiB"}}',
    b'{"model": "tiny", "options": {"kv_offloading_backend": "native"}}',
    b'{"model": "tiny", "options": {"hf_overrides": "my_module.override"}}',
    b'{"model": "tiny", "options": {"speculative_config": {"method": "medusa"}}}',
    b'{"model": "tiny", "options": {"speculative_config": {"method": "ngram"}}}',
    b'{"model": "tiny", "options": {"cpu_offload_gb": -1}}',
    b'{"model": "tiny", "options": {"limit_mm_per_prompt": {"image": -1}}}',
    b'{"model": "tiny", "options": {"limit_mm_per_prompt": [1]}}',
    b'{"model": "tiny", "options": {"speculative_config": 3}}',
    b'{"model": "tiny", "options": {"compilation_config": true}}',
    b'{"model": "tiny", "options": {"cudagraph_capture_sizes": [8, 0]}}',
    b'{"model": "tiny", "options": {"max_modle_len": 4096}}',
    b'{"model": "tiny", "options": ["max_model_len", 4096]}',
]


def test_hostile_options_get_a_400_that_names_the_field_and_hold_nothing(tmp_path: Path):
    with running_sidecar(settings_for(tmp_path)) as sc:
        for body in HOSTILE:
            start = time.monotonic()
            r = sc.admin.post(
                "/admin/deployments", content=body, headers={"content-type": "application/json"}
            )
            elapsed = time.monotonic() - start
            assert r.status_code == 400, (body, r.status_code, r.text)
            error = r.json()["error"]
            assert error["type"] == "bad_request" and error["message"], body
            assert elapsed < 5, (body, elapsed)
            # the ledger and the GPU view still answer at once
            gpus = sc.admin.get("/admin/gpus")
            assert gpus.status_code == 200
            assert gpus.json()["gpus"][0]["reserved_by_gatekeeper_bytes"] == 0
        assert sc.admin.get("/admin/deployments").json()["deployments"] == []


@pytest.mark.parametrize(
    ("options", "flag"),
    [
        ({"max_model_len": "2k"}, "--max-model-len 2000"),
        ({"max-num-seqs": 8}, "--max-num-seqs 8"),
        ({"tokenizer": "org/tok"}, "--tokenizer org/tok"),
        ({"enable_lora": True, "max_loras": 2}, "--enable-lora --max-loras 2"),
        (
            {"hf_overrides": {"max_position_embeddings": 4096}},
            '--hf-overrides {"max_position_embeddings":4096}',
        ),
    ],
)
def test_vllms_value_forms_reach_the_command_line_normalised(tmp_path: Path, options, flag):
    with running_sidecar(settings_for(tmp_path)) as sc:
        r = sc.admin.post("/admin/deployments", json={"model": "tiny", "options": options})
        assert r.status_code == 201, r.text
        args = " ".join(r.json()["deployment"]["vllm_args"])
        assert flag in args
        sc.admin.delete(f"/admin/deployments/{r.json()['deployment']['id']}")


def test_a_revision_the_catalog_cannot_give_is_a_400_saying_so(tmp_path: Path):
    with running_sidecar(settings_for(tmp_path)) as sc:
        r = sc.admin.post(
            "/admin/deployments", json={"model": "tiny", "options": {"revision": "v2"}}
        )
        assert r.status_code == 400, r.text
        assert "revision 'v2'" in r.json()["error"]["message"]
        assert sc.admin.get("/admin/deployments").json()["deployments"] == []
