"""The gatekeeper simulator: a stand-in for ``vllm serve`` in rehearsals and tests.

It is **not vLLM** and loads no model: it accepts every flag of ``vllm serve``, prints
the start-up log lines of vLLM 0.33 (or 0.34: ``GATEKEEPER_SIM_VLLM_VERSION``) with
made-up but consistent memory figures, refuses connections while "loading", then serves vLLM's HTTP surface with
deterministic text (``gatekeeper.simulator.http``), and can hold memory in the
stand-in NVML driver (``gatekeeper.simulator.nvml_claims``). Its first log line and
``/version`` say "gatekeeper simulator, not vLLM".

Command line, as ``vllm serve``: every flag of vLLM's own flag table (the shipped
``gatekeeper/data/vllm_flags/<release>.json`` of the release it plays, read by the
simulator itself), with vLLM's spellings (``-tp``, ``--no-enforce-eager``), ``nargs``,
choices and value grammar (``32k`` = 32000, ``32K`` = 32768, ``auto``, ``None``, JSON),
and the rewrites of vLLM's ``FlexibleArgumentParser`` (``--model`` moved to the front,
``--config FILE.yaml``, ``--max_model_len``, ``-O3``, ``--compilation-config.mode 3``)::

    python -m gatekeeper.simulator [serve] MODEL [any vllm serve flag ...]

An unknown flag or a bad value exits 2 with argparse's message on stderr; what vLLM
refuses before argparse (a config file that is not YAML, ``--served-model-name``
without a model) exits 1 with vLLM's ``ValueError``. The simulator reads
``--model``/the model tag, ``--host``, ``--port``, ``--served-model-name``,
``--max-model-len`` (8192 when not given or ``auto``; vLLM derives it from the model's
config), ``-tp``, ``-pp``, ``--gpu-memory-utilization``, ``--kv-cache-memory-bytes``,
``--max-num-seqs``, ``--max-num-batched-tokens``, ``--block-size``,
``--kv-cache-dtype``, ``--enable-prefix-caching``, ``--enforce-eager`` and, playing 0.34,
``--[no-]enable-extensible-kv-cache`` (``process.simulated_flags``). Every other flag (``--dtype``, ``-dp``, LoRA,
speculative decoding, ``--compilation-config`` ...) is checked, shown in ``non-default
args`` and named in a WARNING line as not simulated, and changes nothing else.

Start-up log on stdout, one flushed line each, in vLLM's format
``(APIServer|EngineCore|Worker_TP<k> pid=N) LEVEL MM-DD HH:MM:SS [file.py:line] text``
and order: the simulator banner (WARNING), ``non-default args: {...}``, the flags not
simulated (WARNING, when any), ``Using max model len N``, ``Model loading took X GiB memory and S seconds``, ``Available KV cache
memory: X GiB`` (or, with ``--kv-cache-memory-bytes``, ``Initial free memory X GiB,
reserved Y GiB memory for KV Cache ...``), ``GPU KV cache size: N tokens, Maximum
concurrency for L tokens per request: C.CCx``, ``Graph capturing finished in N secs,
took X GiB`` (not with ``--enforce-eager``), ``Free memory on device (F/T GiB) on
startup. ...`` (not with a KV byte budget), ``init engine (profile, create kv cache,
warmup model) took S s``, ``Starting vLLM server on http://HOST:PORT``, then uvicorn's
lines. Worker lines repeat per rank when TP x PP > 1.

Playing vLLM 0.34 (``extensible`` has the arithmetic, from 0.34.0's source): the blocks
are 64 tokens; with the extensible KV cache (on unless ``--kv-cache-memory-bytes`` or
``--no-enable-extensible-kv-cache``) ``--gpu-memory-utilization`` defaults to a 1.0 cap,
nothing refuses a GPU with less free than that, "Available KV cache memory" shows the
reservation, and after the graphs and the summary come ``Memory after warmup: F GiB free,
... N KV cache blocks (X GiB) fit within the requested R GiB. ...``, the ``max_model_len``
check against those blocks, ``GPU KV cache size: ...`` and ``Extended KV cache to N blocks
(X GiB).``; the cache is ``min(requested - used, free - used - margin) - activation`` of the
GPU's free memory at start (the total without an NVML state file). With the cache off: no
"Estimated CUDA graph memory" line, "CUDA graph memory profiling is enabled ..." instead,
and the default fraction 0.92.

Environment (sizes in bytes, or with a unit such as ``20GiB``):

- ``GATEKEEPER_SIM_VLLM_VERSION`` (0.33.0): the vLLM release played, 0.33.0 or 0.34.0
  (a release maps to the newest of them at or before it: 0.34.2 and 0.35.0 play 0.34,
  older ones 0.33); its flag table reads the command line.
- ``GATEKEEPER_SIM_STARTUP_SECONDS`` (0.5): time from start to serving; the port is
  bound at once but listens only then, so connections are refused until ready.
- ``GATEKEEPER_SIM_TOKEN_SECONDS`` (0.005): delay before each generated token.
- ``GATEKEEPER_SIM_FAIL``: ``free-memory``, ``max-model-len``, ``oom-load`` or
  ``oom-sampler`` print vLLM's error text for that failure at the step where vLLM
  raises it and exit 1 (playing 0.34 with the extensible KV cache, which has no
  free-memory refusal, ``free-memory`` ends as a GPU with nothing left does: "No
  available memory for the cache blocks" after warm-up); ``crash-after-requests:N`` makes the N-th chat or completion
  request kill the process with SIGKILL after half its tokens (exit status -9, "137"
  in a shell); ``hang`` accepts connections once ready and never answers;
  ``die-after-ready:S`` logs vLLM's engine-death error and exits 1 S seconds after ready;
  ``wake-error`` makes ``/wake_up`` answer 500, ``wake-hang`` never answer (``sleep``).
- ``VLLM_SERVER_DEV_MODE`` (vLLM's own, ``0``): ``1`` serves vLLM's sleep routes
  (``/sleep``, ``/wake_up``, ``/is_sleeping``, ``/release_kv_cache_memory``); with
  ``--enable-sleep-mode`` a sleeping simulator gives back its weights and KV cache in the
  stand-in driver's state and takes them back at wake (``sleep``).
- ``GATEKEEPER_SIM_GPU_TOTAL_BYTES``: the GPU's total (80 GiB; with an NVML state file,
  that GPU's total minus its reserved memory).
- ``GATEKEEPER_SIM_ACTUAL_BYTES``: bytes held per GPU (default ``gpu_memory_utilization
  x total``, or ``--kv-cache-memory-bytes`` + 2 GiB; playing 0.34 with the extensible KV
  cache, the components and the KV cache measured).
- ``GATEKEEPER_SIM_WEIGHTS_BYTES``, ``_KV_BYTES``, ``_ACTIVATION_BYTES``,
  ``_NON_TORCH_BYTES``, ``_CUDA_GRAPH_BYTES``: the per-GPU figures the log reports;
  unset ones are split from the actual bytes (weights 40%, non-torch 2%, activation
  3%, CUDA graphs 1% or 0 with ``--enforce-eager``, KV cache the rest; with
  ``--kv-cache-memory-bytes`` the KV cache is that and the rest is split 70/10/15/5;
  playing 0.34 with the extensible KV cache, split from the requested memory when the
  actual bytes are not given, the KV cache measured after warm-up unless given).
- ``GATEKEEPER_SIM_KV_BYTES_PER_TOKEN``: KV bytes per token per GPU for the token
  count (128 KiB / (TP x PP)); when set, vLLM's fit check runs for real.
- ``GATEKEEPER_SIM_NVML_STATE``: the stand-in NVML driver's state file. When set, the
  simulator checks vLLM's start-up condition (free >= ceil(u x total), else the
  free-memory error, not checked by 0.34's extensible KV cache, which sizes itself from
  the free memory; free >= actual bytes, else CUDA out of memory; the weights with the
  extensible cache) and holds the
  actual bytes on the first TP x PP GPUs of ``CUDA_VISIBLE_DEVICES`` (NVML indices or
  UUIDs; all GPUs when unset): 90% under its own pid, 10% under its child's. The
  claims go on SIGTERM, SIGINT, normal exit and start-up failure; after a SIGKILL the
  child releases them, as a driver frees a dead process's memory.

The child process (``python -m gatekeeper.simulator.nvml_claims``, vLLM's "engine core")
runs in every mode and exits with the simulator. SIGTERM or SIGINT stops the
simulator within about a second (exit 0).

Modules: ``cli`` (the command line), ``flags`` (the parser from vLLM's flag table and
its value grammar), ``argv`` (vLLM's rewrites before argparse), ``env`` (the ``GATEKEEPER_SIM_*`` variables), ``process``
(start-up, log, signals), ``http`` (vLLM's HTTP surface), ``memory`` (the figures and
vLLM's start-up failures), ``extensible`` (a vLLM 0.34 worker's extensible KV cache), ``nvml_claims`` (memory held in the stand-in NVML driver), ``sleep`` (vLLM's sleep mode).

It stands apart from the estimator: it imports nothing of ``gatekeeper.estimator``,
``placement``, ``vllm`` or ``sidecar``, so that a rehearsal cannot agree with the
prediction by sharing its code (an import-linter contract keeps it so). It shares vLLM's
flag table with ``gatekeeper.vllm`` as data: each reads the file with its own code. Only
``gatekeeper.sidecar.rehearsal`` imports it, for the protocol in ``env``.

The face imports only ``env``: the engine-core child (``nvml_claims``) starts without
loading the HTTP stack. ``python -m gatekeeper.simulator`` runs ``cli.main``.
"""

from gatekeeper.simulator.env import SimEnv

__all__ = ["SimEnv"]
