"""The command lines gatekeeper launches workers with, drawn by hypothesis.

``launches()`` draws what placement decides (``LaunchFlags``) and what the operator
asked for (options given as data, read by the mapping door ``options_from_mapping`` as
the admin API reads them), and gives the argument list ``launch_args`` emits for them
with the options it must read back as. The space is two tables of one line per field:

- ``DECIDED``: every field of ``LaunchFlags``, the values placement decides;
- ``ASKED``: every other flag the estimator models (``MODELLED``), the values as the
  admin API takes them (JSON: ``None`` is not given).

``undrawn()`` names what is missing from either (``test_every_launched_field_is_drawn``).

A new field is one line with the values to draw: ``st.sampled_from([...])`` or
``st.integers(...)``, ``vllm_choice(dest)`` for a flag with choices (vLLM's own spellings,
from its flag table), ``optional(...)`` where not giving it is a value, JSON objects for a
JSON flag, as in the lines below. A rule vLLM sets between flags goes in ``vllm_rules``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, TypeVar

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gatekeeper.estimator.options import ServeOptions
from gatekeeper.vllm.flags import MODELLED, flag_table, options_from_mapping
from gatekeeper.vllm.launch import LaunchFlags, launch_args
from tests.support.conformance import VLLM_VERSION

__all__ = [
    "ASKED",
    "DECIDED",
    "MODEL",
    "Launch",
    "launches",
    "optional",
    "sample",
    "undrawn",
    "vllm_choice",
    "vllm_rules",
]

MODEL = "org/model"
T = TypeVar("T")


def vllm_choice(dest: str) -> st.SearchStrategy[str]:
    """One of vLLM's spellings of the flag ``dest`` (its choices in the flag table of the
    release the real-vLLM tests run: from 0.33 ``--kv-cache-dtype`` takes any string its
    registry knows, and the table has no choices)."""
    choices = flag_table(VLLM_VERSION).flags[dest].choices
    assert choices, f"{dest} has no choices in vLLM's flag table; draw its values explicitly"
    return st.sampled_from(choices)


def optional(values: st.SearchStrategy[T]) -> st.SearchStrategy[T | None]:
    """Not given (``None``, vLLM's default) or one of ``values``."""
    return st.none() | values


DECIDED: dict[str, st.SearchStrategy[Any]] = {
    "max_model_len": st.integers(1, 2**20),
    "tensor_parallel_size": st.sampled_from([1, 2, 4, 8]),
    "pipeline_parallel_size": st.sampled_from([1, 2, 4]),
    "gpu_memory_utilization": st.integers(1, 10_000).map(lambda n: n / 10_000),  # 4 decimals
    "kv_cache_memory_bytes": optional(st.integers(1, 2**40)),
    "max_num_seqs": st.integers(1, 4096),
    "max_num_batched_tokens": st.integers(1, 2**17),
}
"""What placement decides: ``LaunchFlags``' fields."""

SPECULATIVE = [
    {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4},
    {"method": "mtp", "num_speculative_tokens": 1},
    {"model": "org/drafter", "num_speculative_tokens": 5, "draft_tensor_parallel_size": 1},
]
COMPILATION = [{"mode": 3}, {"cudagraph_mode": "PIECEWISE"}, {"cudagraph_capture_sizes": [1, 8]}]

ASKED: dict[str, st.SearchStrategy[Any]] = {
    "dtype": vllm_choice("dtype"),
    "quantization": optional(st.sampled_from(["fp8", "fp8_per_tensor", "awq", "gptq"])),
    "kv_cache_dtype": vllm_choice("kv_cache_dtype"),
    "block_size": optional(st.sampled_from([16, 32, 64])),
    "enforce_eager": st.booleans(),
    "enable_lora": st.booleans(),
    "max_loras": optional(st.integers(1, 16)),
    "max_lora_rank": optional(vllm_choice("max_lora_rank")),
    "fully_sharded_loras": st.booleans(),
    "lora_dtype": vllm_choice("lora_dtype"),
    "max_cpu_loras": optional(st.integers(1, 64)),
    "speculative_config": optional(st.sampled_from(SPECULATIVE)),
    "cpu_offload_gb": st.sampled_from([0, 0.5, 2.5, 16]),
    "kv_offloading_size": optional(st.sampled_from([0.5, 4, 64])),
    "swap_space": st.none(),  # V0's flag: gone from the releases these launches are read with
    "data_parallel_size": st.sampled_from([1, 2, 4]),
    "enable_expert_parallel": st.booleans(),
    "decode_context_parallel_size": st.sampled_from([1, 2]),
    "limit_mm_per_prompt": optional(  # keys sorted: MmLimits.counts keeps the order given
        st.dictionaries(st.sampled_from(["audio", "image", "video"]), st.integers(0, 8)).map(
            lambda d: dict(sorted(d.items()))
        )
    ),
    "skip_mm_profiling": st.booleans(),
    "mm_encoder_tp_mode": vllm_choice("mm_encoder_tp_mode"),
    "num_gpu_blocks_override": optional(st.integers(1, 2**20)),
    "cudagraph_capture_sizes": optional(st.lists(st.integers(1, 1024), min_size=1, max_size=4)),
    "max_cudagraph_capture_size": optional(st.integers(1, 1024)),
    "compilation_config": optional(st.sampled_from(COMPILATION)),
    "optimization_level": optional(st.sampled_from(["0", "1", "2", "3"])),
    "runner": vllm_choice("runner"),
    "convert": vllm_choice("convert"),
    "enable_sleep_mode": st.booleans(),
    "performance_mode": vllm_choice("performance_mode"),
    "mamba_cache_dtype": vllm_choice("mamba_cache_dtype"),
    "mamba_ssm_cache_dtype": vllm_choice("mamba_ssm_cache_dtype"),
    "enable_prefix_caching": optional(st.booleans()),
    # vLLM 0.34's flag: the releases these launches are read with lack it (draw
    # optional(st.booleans()) once the default release is 0.34)
    "enable_extensible_kv_cache": st.none(),
    "revision": optional(st.sampled_from(["main", "v1.0", "0" * 40])),
    "hf_overrides": optional(
        st.sampled_from([{"max_position_embeddings": 4096}, {"text_config": {"vocab_size": 8}}])
    ),
    "download_dir": optional(st.sampled_from(["/models", "/mnt/hf cache"])),
    "tokenizer": optional(st.sampled_from(["org/tokenizer", "/models/tok"])),
}
"""What the operator asked for: the other modelled flags, as the admin API takes them."""


def vllm_rules(asked: dict[str, Any]) -> dict[str, Any]:
    """``asked`` made to keep the rules vLLM sets between flags (the door refuses what
    breaks them): one line a rule."""
    sizes = asked.get("cudagraph_capture_sizes")
    if sizes and asked.get("max_cudagraph_capture_size") is not None:
        asked["max_cudagraph_capture_size"] = max(sizes)  # the largest of the sizes
    return asked


def undrawn() -> list[str]:
    """What the space misses: a ``LaunchFlags`` field not in ``DECIDED``, a modelled flag
    in neither table (each with where its line goes)."""
    decided = {f.name for f in fields(LaunchFlags)}
    missing = [f"DECIDED lacks LaunchFlags.{name}" for name in sorted(decided - set(DECIDED))]
    missing += [f"DECIDED has {name}, not a LaunchFlags field" for name in set(DECIDED) - decided]
    left_out = sorted(set(MODELLED) - decided - set(ASKED))
    return missing + [f"ASKED lacks {name} (one line: the values to draw)" for name in left_out]


@dataclass(frozen=True, slots=True)
class Launch:
    argv: tuple[str, ...]
    """What ``launch_args`` emits (what follows ``vllm serve``)."""
    options: ServeOptions
    """What ``argv`` must read back as: the options asked, with placement's decisions."""


@st.composite
def launches(draw: st.DrawFn) -> Launch:
    """A launch command line drawn over ``DECIDED`` and ``ASKED``."""
    flags = draw(st.builds(LaunchFlags, **DECIDED))
    asked, _ = options_from_mapping(vllm_rules(draw(st.fixed_dictionaries(ASKED))), where="ASKED")
    decided = {name: getattr(flags, name) for name in DECIDED}
    return Launch(launch_args(MODEL, flags, asked), replace(asked, **decided))


def sample(strategy: st.SearchStrategy[T], n: int) -> list[T]:
    """``n`` examples of ``strategy`` drawn by hypothesis (generation only: no database,
    no shrinking), for a check that runs once over all of them."""
    drawn: list[T] = []

    @settings(
        max_examples=n,
        database=None,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(strategy)
    def collect(example: T) -> None:
        drawn.append(example)

    collect()
    return drawn
