"""gatekeeper's settings: one class, read from ``GATEKEEPER_*`` environment variables
and an optional TOML file (``--config PATH``, else ``GATEKEEPER_CONFIG_FILE``; the
environment wins over the file). An unknown key in the file is an error that names the
nearest setting; an unknown ``GATEKEEPER_*`` variable is reported by
``unknown_environment`` (the CLI prints it as a warning); ``GATEKEEPER_CONFIG``, a
name people try, is refused with the right one.

Only the entry points construct or read ``Settings`` (``gatekeeper.cli``, and what the
sidecar and the webhook read at start: ``gatekeeper.sidecar.app``,
``gatekeeper.k8s.server``); everything else receives plain
values. The helpers below are the one place settings become those values:
``placement_policy`` (placement, the webhook and the metrics' margin),
``model_resolver`` (how model references are resolved) and ``gpu_source`` (the driver
or a declared node).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)
from pydantic_settings import (
    SettingsError as PydanticSettingsError,
)

from gatekeeper.errors import GatekeeperError
from gatekeeper.estimator.accounting import DEFAULT_VLLM_VERSION
from gatekeeper.placement.policy import PlacementPolicy
from gatekeeper.vllm.flags import flag_table, options_from_mapping
from gatekeeper.vllm.sleep_mode import IdleAction, sleep_level_problem

if TYPE_CHECKING:
    from gatekeeper.gpus.source import GpuSource
    from gatekeeper.models.spec import ModelSpec

__all__ = [
    "ModelEntry",
    "Settings",
    "SettingsError",
    "gpu_source",
    "load_settings",
    "model_resolver",
    "placement_policy",
    "setting_source",
    "unknown_environment",
]


class SettingsError(GatekeeperError):
    """The settings could not be read: which field, from which source, and why."""


class ModelEntry(BaseModel):
    """A model the sidecar may serve, with its serving options."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    """The name clients send in the ``model`` field (``--served-model-name``)."""
    model: str = Field(min_length=1)
    """Catalog name, local checkpoint directory or hub repo id."""
    options: dict[str, Any] = Field(default_factory=dict)
    """``vllm serve`` flags gatekeeper models (``max_model_len``, ``kv-cache-dtype`` …), with
    vLLM's value forms (``"32k"``); checked when the settings load, with the flags of the
    entry's ``vllm_version`` or else the settings' ``default_vllm_version``."""
    min_sequences: int = Field(default=1, gt=0)
    min_kv_tokens: int | None = Field(default=None, gt=0)
    preload: bool = False
    """Deploy when the sidecar starts instead of on the first request."""
    idle_action: IdleAction | None = None
    """This model's ``idle_action`` (``stop`` or ``sleep``); unset: the global one."""
    sleep_level: int | None = None
    """This model's ``sleep_level`` (1 or 2); unset: the global one."""

    @field_validator("sleep_level")
    @classmethod
    def _entry_sleep_level(cls, value: int | None) -> int | None:
        return value if value is None else _checked_sleep_level(value)


class Settings(BaseSettings):
    """Everything an operator can configure."""

    model_config = SettingsConfigDict(env_prefix="GATEKEEPER_", extra="forbid")

    state_dir: Path = Path("~/.local/state/gatekeeper")
    """Where the reservations ledger, worker logs and calibration live."""

    allow_network: bool = False
    """Let model references that are neither a local path nor in the Hugging Face cache
    be looked up on the Hugging Face hub (config and safetensors metadata only, never
    weights; written into the cache, so the next look-up is offline), before the
    embedded catalog. Off by default: admission must not depend on the network.
    ``HF_HUB_OFFLINE=1`` keeps the hub off even when this is on."""

    hf_endpoint: str | None = None
    """Hub endpoint to use instead of huggingface.co (a mirror); ``HF_ENDPOINT`` also works."""

    hub_timeout_seconds: float = Field(default=10.0, gt=0)
    """Time limit for each hub request."""

    default_vllm_version: str = DEFAULT_VLLM_VERSION
    """The vLLM version the sidecar runs: its memory accounting (the estimator's, when a
    request does not name one) and its ``vllm serve`` flag table (``[[models]]`` options,
    the admin API's, the webhook's for an image whose tag names no release)."""

    @field_validator("default_vllm_version")
    @classmethod
    def _is_a_version(cls, value: str) -> str:
        try:
            flag_table(value)
        except GatekeeperError as e:
            raise ValueError(str(e)) from e
        return value

    safety_margin_bytes: int = Field(default=512 * 1024 * 1024, ge=0)
    """Bytes kept free on every GPU on top of the estimate."""

    safety_margin_fraction: float = Field(default=0.02, ge=0, lt=1)
    """Fraction of each GPU's total memory kept free on top of the estimate."""

    host_memory_root: Path = Path("/")
    """Where the node's host memory is read: ``<root>/proc/meminfo`` and the memory cgroup
    the sidecar runs under, ``<root>/sys/fs/cgroup`` (``/`` on a node; a directory of such
    files written by a test or a demo stands in, ``gpus.host_memory.write_host_files``)."""

    host_margin_bytes: int = Field(default=1024**3, ge=0)
    """Host bytes kept available on top of every worker's predicted host memory."""

    share_gpus: bool = False
    """Let several workers share a GPU, each with a byte budget
    (``--kv-cache-memory-bytes``); off: a GPU hosts one gatekeeper worker, which gets all
    of its usable memory as ``--gpu-memory-utilization``."""

    shared_kv_sequences: int = Field(default=8, gt=0)
    """With ``share_gpus``, how many sequences of max_model_len a worker's KV cache is
    sized for when its options set no budget (no ``kv-cache-memory-bytes`` or
    ``gpu-memory-utilization``): min(max_num_seqs, this); when that does not fit, the
    most that do, down to the model's ``min_sequences``. A budget that cannot run
    max_num_seqs at full length is named in the decision's warnings. (Alone on a GPU a
    worker gets all of its usable memory, as ``vllm serve`` would.)"""

    allow_pipeline: bool = False
    """Let placement use pipeline parallelism when no tensor-parallel group fits."""

    allowed_gpus: list[str] | None = None
    """GPU indices or UUIDs gatekeeper may place on; unset = every healthy GPU."""

    host: str = "127.0.0.1"
    """Address the sidecar listens on (loopback unless told otherwise)."""

    port: int = Field(default=8080, ge=0, le=65535)
    """Port of the OpenAI-compatible proxy, the admin API and /metrics."""

    node_name: str | None = None
    """The node's name in the ``Hostname`` and ``node`` labels of the GPU and worker
    metrics and of the discovered workers (DCGM exporter's and kube-state-metrics'
    names); unset: the host name. In Kubernetes set ``GATEKEEPER_NODE_NAME`` from the
    downward API (``spec.nodeName``), as DCGM exporter's ``NODE_NAME``."""

    admin_token: str | None = None
    """Bearer token of the admin API; without one the admin API is off."""

    log_format: Literal["text", "json"] = "text"
    """How ``gatekeeper serve`` and ``gatekeeper webhook`` write their log: ``text``, or
    ``json``, one object a line (time, level, logger, message, and ``deployment_id`` and
    ``model`` where they apply; ``gatekeeper.sidecar.logs``) for Loki or Elasticsearch.
    ``--log-format`` overrides it."""

    api_keys: list[str] = Field(default_factory=list, repr=False)
    """Keys a client must send as ``Authorization: Bearer <key>``, any one of them, on the
    paths vLLM's ``--api-key`` guards (``/v1``, ``/v2``, ``/inference``, ``/cohere``);
    ``GATEKEEPER_API_KEYS`` takes a JSON list. Empty (the default): they are open.
    ``/healthz``, ``/metrics``, ``/discovery/workers``, ``/openapi.json`` and the
    forwarding routes outside those prefixes (``/tokenize``, ``/pooling``, ...) stay open
    either way, as in vLLM, the latter only for models with a ready worker: launching,
    waiting for or evicting a worker needs a key on every route (docs/sidecar.md); the
    admin API keeps ``admin_token``."""

    request_body_timeout_seconds: float = Field(default=30.0, gt=0)
    """How long the sidecar waits for each next chunk of a request body; a client that
    stalls longer gets 408 and its connection is closed."""

    request_header_timeout_seconds: float = Field(default=30.0, gt=0)
    """How long a client may take to send a request's headers, from the connection's
    start or the request's first byte; past it the client gets 408 and its connection is
    closed (uvicorn alone would wait forever)."""

    request_body_total_seconds: float = Field(default=60.0, gt=0)
    """How long a whole request body may take from the end of its headers, plus one
    second for each ``request_body_min_bytes_per_second`` bytes of it received (Apache's
    ``mod_reqtimeout`` ``body=60,MinRate=500``): a body trickled slower gets 408 and its
    connection is closed; a large one that keeps coming at that rate is cut only at
    ``request_body_max_seconds``."""

    request_body_min_bytes_per_second: int = Field(default=500, gt=0)
    """The rate that earns a request body more time than ``request_body_total_seconds``."""

    request_body_max_seconds: float = Field(default=300.0, gt=0)
    """The most time a whole request body may take from the end of its headers, whatever
    rate it comes at: a body that keeps just above ``request_body_min_bytes_per_second``
    would otherwise hold its connection for hours (a 32 MiB body at 600 B/s: 15 hours).
    Five minutes is the largest body the proxy takes (32 MiB) at 112 KB/s; past it the
    client gets 408 and its connection is closed."""

    max_request_head_bytes: int = Field(default=32768, ge=1024)
    """The largest request head: request line and header fields (and a chunked body's
    trailer fields), as nginx's ``large_client_header_buffers 4 8k``; a larger one gets
    431 (a request target alone longer: 414) and its connection is closed, before it is
    held in memory."""

    max_request_headers: int = Field(default=100, ge=1)
    """The most header fields (trailer fields included) a request may have, as h11's and
    uvicorn's h11 protocol's; one more gets 431 and its connection is closed."""

    http_server: Literal["gatekeeper", "uvicorn", "granian"] = "gatekeeper"
    """The HTTP server ``gatekeeper serve`` runs under (``sidecar.http_servers``;
    docs/sidecar.md, "HTTP servers"), and so which of the limits above hold.
    ``gatekeeper`` (the default): uvicorn with the sidecar's own protocol: all of them,
    and the lean path for the proxy's POSTs. ``uvicorn``: uvicorn's stock httptools
    protocol: none of the head bounds, header deadline or body deadlines (one client
    sending an endless head grew it by 1 GiB in 3 s; a silent or trickling client holds
    its connection forever); its own 5 s keep-alive only. ``granian`` (the ``http-alt``
    extra): granian's HTTP/1 server: the head bounded by its read buffer
    (``max_request_head_bytes``, at least 8192) and at a fixed 100 fields (431), the
    headers' time by ``request_header_timeout_seconds`` (at most 60; the connection is
    closed without a 408); no body deadlines. ``serve`` names the missing limits in one
    warning line at start."""

    max_whole_answer_bytes: int = Field(default=8 * 1024 * 1024, ge=65536)
    """A worker's answer that is not an event stream is held until it is whole (so that it
    goes to the client in one write with its length) up to this many bytes; a larger one is
    relayed as it arrives, chunked, instead of held in memory."""

    @field_validator("api_keys")
    @classmethod
    def _api_keys_are_tokens(cls, value: list[str]) -> list[str]:
        for i, key in enumerate(value):
            if not key or key != key.strip() or any(c.isspace() for c in key):
                raise ValueError(
                    f"api_keys[{i}] is empty or holds whitespace ({len(key)} characters); "
                    "give each key as one non-empty word, or leave api_keys empty to keep the API open"
                )
        return value

    models: list[ModelEntry] = Field(default_factory=list)
    """Models the sidecar may serve, with their options."""

    @field_validator("models")
    @classmethod
    def _options_are_the_releases(
        cls, value: list[ModelEntry], info: ValidationInfo
    ) -> list[ModelEntry]:
        """Each entry's options as the configured vLLM release reads them (its flag
        table: ``default_vllm_version`` comes first among the fields, so it is read)."""
        release = info.data.get("default_vllm_version")
        for i, entry in enumerate(value):
            try:
                options_from_mapping(entry.options, where=f"models[{i}].options", release=release)
            except GatekeeperError as e:
                raise ValueError(str(e)) from e
        return value

    allowed_models: list[str] = Field(default_factory=list)
    """Further model references that may be deployed with default options, as shell-style
    patterns (``meta-llama/*``) over well-formed hub repo ids ``ORG/NAME`` only, or over
    normalised absolute paths when the pattern is itself one (``/models/*``): ``..``,
    ``~``, backslashes and the like never match. A worker is never launched for anything
    else; models without an ``ORG/`` part go in ``[[models]]``."""

    worker_command: list[str] = Field(default_factory=lambda: ["vllm", "serve"])
    """The worker program and its first arguments; the model and flags follow."""

    worker_env: dict[str, str] = Field(default_factory=dict)
    """Extra environment for workers (HF_HOME, HF_TOKEN, VLLM_* …)."""

    worker_host: str = "127.0.0.1"
    """Address workers listen on."""

    worker_port_min: int = Field(default=18000, gt=0, le=65535)
    worker_port_max: int = Field(default=18999, gt=0, le=65535)
    """Range of ports for workers."""

    startup_timeout_seconds: float = Field(default=900.0, gt=0)
    """How long a worker may take to answer /health 200."""

    stop_grace_seconds: float = Field(default=30.0, ge=0)
    """Time between SIGTERM and SIGKILL when stopping a worker."""

    drain_seconds: float = Field(default=30.0, ge=0)
    """How long an undeploy waits for in-flight requests to finish."""

    restart_policy: Literal["never", "on-failure"] = "on-failure"
    """Restart a worker that exits unexpectedly."""

    restart_limit: int = Field(default=3, ge=0)
    """Restarts allowed per deployment before it stays failed."""

    restart_backoff_seconds: float = Field(default=5.0, ge=0)
    """Wait before the first restart; doubled at each further one."""

    health_interval_seconds: float = Field(default=10.0, gt=0)
    """How often a ready worker's ``/health`` is probed (liveness, as Kubernetes' own
    default period); a worker that misses ``health_failures`` probes in a row becomes
    ``unhealthy``, gets no traffic, and is stopped and restarted per ``restart_policy``."""

    health_timeout_seconds: float = Field(default=5.0, gt=0)
    """How long one liveness probe waits for ``/health`` (vLLM answers at once while the
    engine lives; a hung or frozen worker never does)."""

    health_failures: int = Field(default=3, ge=1)
    """Failed liveness probes in a row that make a ready worker ``unhealthy``."""

    admission_timeout_seconds: float = Field(default=30.0, gt=0)
    """Longest an admission (estimate and placement) may take; past it the request gets
    503 and nothing is reserved (an estimate that never ends holds one thread, never the
    ledger or the other admissions)."""

    on_demand: bool = True
    """Launch an allowed model when a request names it and no worker serves it."""

    request_wait_seconds: float = Field(default=60.0, ge=0)
    """How long a request waits for an on-demand or loading worker before 503."""

    start_failure_backoff_seconds: float = Field(default=30.0, ge=0)
    """After an on-demand worker of a model fails at start, requests naming that model
    are answered at once with 503 and the reason vLLM's log gave, and no launch is tried
    for this long; doubled after each further failure in a row, at most an hour (or this
    value, if larger). A worker of the model that turns ready clears it; an admin deploy
    is never blocked."""

    idle_eviction: bool = False
    """Stop the least recently used idle workers when a new model needs their room."""

    idle_seconds: float = Field(default=300.0, ge=0)
    """A worker counts as idle after this long without requests."""

    idle_action: IdleAction = "stop"
    """What an idle worker becomes: ``stop`` (stopped when its room is needed, with
    ``idle_eviction``) or ``sleep``: launched with vLLM's ``--enable-sleep-mode``, put to
    sleep after ``idle_seconds`` without requests (at once when its room is needed), its
    GPU memory released but for vLLM's residue, and woken by the next request naming it.
    Per model: ``[[models]]``' ``idle_action``; per deployment: the deploy body's."""

    sleep_level: int = 1
    """vLLM's sleep level for ``idle_action = "sleep"``: 1 keeps the weights in pinned host
    memory (a wake copies them back), 2 drops them (less host memory, a slower wake)."""

    @field_validator("sleep_level")
    @classmethod
    def _global_sleep_level(cls, value: int) -> int:
        return _checked_sleep_level(value)

    wake_timeout_seconds: float = Field(default=120.0, gt=0)
    """How long a sleeping worker may take to answer ``/wake_up``; past it the worker is
    stopped and restarted per ``restart_policy``."""

    calibration: bool = True
    """Correct each admission's predicted bytes per model family and component by what
    earlier workers of that family used (learned when they reach ready, bounded to
    0.8-1.25x, kept in state_dir/calibration.json). Off: predictions are used as they are."""

    stop_workers_on_exit: bool = False
    """Stop workers when the sidecar exits; off: they run on and are adopted next start."""

    webhook_default_gpu: str | None = None
    """GPU the admission webhook assumes for a workload that names none (no
    ``vllm-gatekeeper.io/gpu-memory`` annotation, no ``nvidia.com/gpu.product`` node selector
    or required node affinity): a GPU from the table (``H100-80GB``) or the memory it
    reports (``79.19GiB``). Unset: such workloads are allowed with a warning."""

    webhook_max_gpus_per_node: int = Field(default=8, ge=1, le=1024)
    """The most GPUs the admission webhook's denials suggest on one node (a larger
    ``--tensor-parallel-size`` is offered only while TP x PP x DP stays within it): 8 for
    NVIDIA's HGX and DGX boards; set 4 (or 2) where the cluster's GPU nodes carry fewer."""

    webhook_unknown_model: Literal["warn", "deny"] = "warn"
    """What the admission webhook does with a vLLM workload whose model is neither in the
    catalog nor reachable (a path inside the container, a private repo, the hub off):
    ``warn`` allows it with a warning, ``deny`` rejects it."""
    webhook_undersized_claims: Literal["warn", "deny"] = "deny"
    """What the mutating webhook (``gatekeeper webhook --mutate``, cluster mode) does with a
    vLLM workload whose own DRA claim requests less GPU memory than a rank needs: ``deny``
    rejects it, ``warn`` allows it with a warning (``--undersized-claims`` overrides)."""

    webhook_max_review_bytes: int = Field(default=3 * 2**20, ge=65536)
    """The largest AdmissionReview either webhook reads (the apiserver's own request limit
    is 3 MiB); a larger one is denied unread, naming this limit (docs/cluster.md, "Bounded
    work per review")."""

    webhook_max_containers_per_pod: int = Field(default=512, ge=1)
    """The most containers (init containers included) of one pod template either webhook
    reads; more are denied, naming this limit."""

    webhook_max_line_bytes: int = Field(default=64 * 2**10, ge=1024)
    """The largest vLLM command line (command, args and literal env values, in UTF-8
    bytes) either webhook reads; a longer one is denied, naming this limit."""

    webhook_max_flags_per_line: int = Field(default=128, ge=8)
    """The most flags (words that begin with a dash) a vLLM command line may have for
    either webhook to read it; more are denied, naming this limit."""

    webhook_max_templates_per_review: int = Field(default=8, ge=1)
    """The most distinct ResourceClaimTemplates the mutating webhook creates for one review;
    a review that needs more is denied, naming this limit, before any is created."""

    webhook_mutating_name: str = Field(default="*.vllm-gatekeeper.io", min_length=1)
    """The name the MutatingWebhookConfigurations give the mutating webhook, or a
    shell-style pattern of it: it creates claim templates only in namespaces the
    namespaceSelector of a webhook of such a name selects (read from the configurations;
    docs/cluster.md, "Only the apiserver"). The default takes every mutating webhook in
    gatekeeper's domain (the shipped one is ``claims.vllm-gatekeeper.io``)."""

    webhook_client_ca_file: Path | None = None
    """A CA certificate (PEM): the webhook's TLS listener then requires a client
    certificate signed by it (``gatekeeper webhook --client-ca-file``; the apiserver
    presents one configured in its AdmissionConfiguration), and serves /healthz and
    /metrics without one on ``--health-port``. Unset: any client may connect."""

    webhook_review_budget_seconds: float = Field(default=2.5, gt=0)
    """How long either webhook may spend on one review: what it has not finished by then is
    denied (half the shipped validating configuration's timeoutSeconds of 5, after which
    the apiserver would follow the failure policy; the mutating one's is 10)."""

    webhook_claims_mode: Literal["gatekeeper", "nvidia-dra", "hami"] = "gatekeeper"
    """Whose GPUs the mutating webhook's requests name (``--claims-mode`` overrides;
    docs/cluster.md, "Coexistence and fallback"): ``gatekeeper``, claims against the
    DeviceClass ``gpu.gatekeeper.dev`` that ``gatekeeper agent`` publishes; ``nvidia-dra``,
    claims against NVIDIA's DRA driver's ``gpu.nvidia.com`` (run with
    ``--consumable-shares=memory``) and gatekeeper publishes nothing (no agent); ``hami``,
    for clusters without DRA, HAMi's ``nvidia.com/gpu`` and ``nvidia.com/gpumem`` (MiB) on
    the container instead of a claim. The vLLM flags are the same in every mode."""

    kubelet_plugin: bool = False
    """``gatekeeper agent`` also serves the kubelet plugin of its DRA driver (registration,
    then NodePrepareResources / NodeUnprepareResources on unix sockets; docs/cluster.md)."""

    kubelet_plugin_dir: Path | None = None
    """The kubelet plugin's DRA socket and checkpoint directory; unset:
    ``/var/lib/kubelet/plugins/<driver name>``."""

    kubelet_registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    """Where kubelet looks for plugins' registration sockets."""

    prepare_wait_seconds: float = Field(default=30.0, ge=0, le=43)
    """How long the kubelet plugin's prepare of a claim whose bytes are not free on its GPU
    waits for them (another claim unprepared, or memory freed outside the claims) before it
    is refused; 0: refused at once (kubelet retries). At most 43: kubelet gives each call
    45 s (``defaultClientCallTimeout``, pkg/kubelet/cm/dra/plugin/dra_plugin.go), and the
    plugin keeps 2 s of the call's own deadline for its answer."""

    cdi_dir: Path = Path("/var/run/cdi")
    """Where the container runtime reads CDI specs: the kubelet plugin writes one per
    prepared claim there."""

    config_file: Path | None = None
    """Optional TOML file with the same keys (read before environment variables are applied)."""

    gpus: str = Field(default="nvml", min_length=1)
    """Where the GPU inventory comes from: ``nvml`` (the NVIDIA driver, honouring
    ``CUDA_VISIBLE_DEVICES``), or a declared node for planning without GPUs: a product
    list such as ``2xH100-80GB`` or ``1xA100-40GB,1xL4``, or the path of a JSON file of
    GPUs or of a snapshot recorded with ``gatekeeper gpus --json`` (docs/gpus.md)."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_path = os.environ.get("GATEKEEPER_CONFIG_FILE")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if toml_path:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(toml_path)))
        return tuple(sources)


def _checked_sleep_level(value: int) -> int:
    problem = sleep_level_problem(value)
    if problem is not None:
        raise ValueError(f"sleep_level = {value!r}: {problem}")
    return value


def placement_policy(settings: Settings) -> PlacementPolicy:
    """The placement rules the settings give (also the webhook's margin and version)."""
    return PlacementPolicy(
        margin_bytes=settings.safety_margin_bytes,
        margin_fraction=settings.safety_margin_fraction,
        allowed_gpus=frozenset(settings.allowed_gpus) if settings.allowed_gpus else None,
        share_gpus=settings.share_gpus,
        shared_kv_sequences=settings.shared_kv_sequences,
        allow_pipeline=settings.allow_pipeline,
        default_vllm_version=settings.default_vllm_version,
    )


def gpu_source(settings: Settings, node: str | None = None) -> GpuSource:
    """The GPUs to place on: ``node`` (the CLI's ``--node``) when given, else the
    ``gpus`` setting; raises ``GatekeeperError`` for a bad declared node."""
    from gatekeeper.gpus.source import parse_gpu_source  # loaded by the commands that read GPUs

    return parse_gpu_source(node or settings.gpus)


def model_resolver(
    settings: Settings,
    *,
    revision: str | None = None,
    download_dir: str | None = None,
    hf_overrides: Mapping[str, Any] | None = None,
) -> Callable[[str], ModelSpec]:
    """``resolve_model`` with the settings' hub access (network, endpoint, timeout) and
    vLLM's ``--revision`` and ``--download-dir`` when a command line gave them."""
    from gatekeeper.models.source import resolve_model

    return partial(
        resolve_model,
        allow_network=settings.allow_network,
        hf_endpoint=settings.hf_endpoint,
        timeout_seconds=settings.hub_timeout_seconds,
        revision=revision,
        download_dir=download_dir,
        hf_overrides=hf_overrides,
    )


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Build ``Settings`` from the environment and an optional TOML file.

    Raises ``SettingsError`` naming the source (the file and line, or the environment
    variable), the value and what to do when the file does not parse or a value is
    invalid.
    """
    _refuse_config_alias()
    previous = os.environ.get("GATEKEEPER_CONFIG_FILE")
    if config_file is not None:
        _check_toml(config_file, "config")
    elif previous:
        _check_toml(Path(previous), "GATEKEEPER_CONFIG_FILE")
    if config_file is not None:
        os.environ["GATEKEEPER_CONFIG_FILE"] = str(config_file)
    toml_file = config_file or (Path(previous) if previous else None)
    try:
        return Settings(**overrides)
    except ValidationError as e:
        raise _invalid_value(e, toml_file, overrides) from e
    except PydanticSettingsError as e:  # a complex value (list, dict) that is not JSON
        raise _unparsable_env(e) from e
    finally:
        if previous is None:
            os.environ.pop("GATEKEEPER_CONFIG_FILE", None)
        else:
            os.environ["GATEKEEPER_CONFIG_FILE"] = previous


CONFIG_ALIAS = "GATEKEEPER_CONFIG"
"""A name people try for the settings file; never read, so refused rather than ignored."""


def _refuse_config_alias() -> None:
    if CONFIG_ALIAS in os.environ:
        raise SettingsError(
            f"settings: environment variable {CONFIG_ALIAS}={os.environ[CONFIG_ALIAS]!r} is "
            "not read; name the settings file with GATEKEEPER_CONFIG_FILE=PATH (or "
            f"`gatekeeper --config PATH`) and unset {CONFIG_ALIAS}",
            field="config_file",
            value=os.environ[CONFIG_ALIAS],
        )


NOT_SETTINGS = ("GATEKEEPER_DEBUG", "GATEKEEPER_SIM_", "GATEKEEPER_SKIP_VLLM_CPU")
"""``GATEKEEPER_*`` variables that are not settings: the CLI's traceback switch, the
simulator's variables (a prefix) and the test set-up's."""


def unknown_environment(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per ``GATEKEEPER_*`` variable that names no setting (pydantic-settings
    would ignore it), with the nearest setting's variable when one is close."""
    environ = os.environ if environ is None else environ
    fields = list(Settings.model_fields)
    lines = []
    for name in sorted(environ):
        upper = name.upper()
        key = upper.removeprefix("GATEKEEPER_").lower()
        if key == upper.lower() or key in fields or upper == CONFIG_ALIAS:
            continue
        if any(upper.startswith(known) for known in NOT_SETTINGS):
            continue
        close = difflib.get_close_matches(key, fields, n=1)
        hint = (
            f"; did you mean GATEKEEPER_{close[0].upper()}?"
            if close
            else "; the settings are listed in gatekeeper/settings.py"
        )
        lines.append(f"environment variable {name} is not a gatekeeper setting{hint}")
    return lines


def setting_source(settings: Settings, field: str) -> str:
    """Where ``field``'s value came from, for people: the environment variable, the
    settings file, or the default (the environment wins over the file)."""
    env = _env_value(field)
    if env is not None:
        return f"environment variable {env[0]}"
    path = settings.config_file
    if path is not None:
        import tomllib  # only where a settings file is named (#39: not every start)

        try:
            data = tomllib.loads(path.expanduser().read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            data = {}
        if field in data:
            return f"settings file {str(path)!r} ({field})"
    return "default"


def _unknown_key(loc: tuple[Any, ...], value: object, where: str) -> str:
    """'unknown setting 'prot' in FILE; did you mean 'port'?' for an extra key at ``loc``
    (a top-level setting, or a key of a ``[[models]]`` entry)."""
    key = str(loc[-1])
    model: type[BaseModel] = ModelEntry if len(loc) > 1 and loc[0] == "models" else Settings
    names = [n for n in model.model_fields if n != "config_file"]
    close = difflib.get_close_matches(key, names, n=1)
    shown = _hidden(value) if close and close[0] in SECRET_FIELDS else repr(value)
    what = f"unknown setting {key!r}"
    if len(loc) > 1:
        what = f"unknown key {key!r} in {loc[0]}[{loc[1]}]"
    hint = f"did you mean {close[0]!r}?" if close else f"the keys are: {', '.join(names)}"
    return f"{what} in {where} ({key} = {shown}); {hint}"


def _check_toml(path: Path, where: str) -> None:
    """A TOML settings file that exists and parses, or ``SettingsError`` saying why."""
    import tomllib  # only where a settings file is named (#39: not every start)

    try:
        text = path.read_bytes()
    except OSError as e:
        raise SettingsError(
            f"{where}: {str(path)!r} is not a readable file ({e.strerror or e}); "
            "give the path of a TOML settings file",
            field="config",
            value=str(path),
        ) from e
    try:
        tomllib.loads(text.decode("utf-8", "replace"))
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(
            f"settings file {str(path)!r} is not valid TOML: {e}; "
            "fix the TOML syntax there (keys as in `key = value`, strings quoted)",
            field="config",
            value=str(path),
        ) from e


def _env_value(field: str) -> tuple[str, str] | None:
    """The ``GATEKEEPER_*`` variable that sets ``field`` and its value, if one does
    (pydantic-settings matches the names case-insensitively)."""
    wanted = f"GATEKEEPER_{field}".lower()
    for name, value in os.environ.items():
        if name.lower() == wanted:
            return name, value
    return None


SECRET_FIELDS = frozenset({"admin_token", "api_keys"})
"""Settings whose values no message shows."""


def _hidden(value: object) -> str:
    return f"<hidden, {len(str(value))} characters>"


def _invalid_value(
    e: ValidationError, toml_file: Path | None, overrides: Mapping[str, Any]
) -> SettingsError:
    errors = e.errors()
    first = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
    field = ".".join(str(p) for p in first["loc"])
    top = str(first["loc"][0]) if first["loc"] else field
    value = first.get("input")
    env = _env_value(top)
    if top in SECRET_FIELDS:  # an error message must not print a secret
        value = _hidden(value)
        env = (env[0], _hidden(env[1])) if env is not None else None
    if first["type"] == "extra_forbidden":
        where = f"settings file {str(toml_file)!r}" if toml_file is not None else "the settings"
        if top in overrides:
            where = "the settings given by the command"
        return SettingsError(_unknown_key(first["loc"], value, where), field=field, value=value)
    if top in overrides:
        source = f"settings: {field} = {value!r} (given by the command)"
        fix = "give a valid value"
    elif env is not None:
        source = f"settings: {field}: environment variable {env[0]}={env[1]!r}"
        source += f" ({field} = {value!r})" if field != top else ""
        fix = f"set {env[0]} to a valid value or unset it"
    elif toml_file is not None:
        source = f"settings file {str(toml_file)!r}: {field} = {value!r}"
        fix = f"set the '{top}' key there to a valid value"
    else:
        source = f"settings: {field} = {value!r}"
        fix = f"set GATEKEEPER_{top.upper()} or the '{top}' key of the TOML file to a valid value"
    return SettingsError(f"{source} is invalid ({first['msg']}); {fix}", field=field, value=value)


def _unparsable_env(e: PydanticSettingsError) -> SettingsError:
    match = re.search(r'field "(\w+)"', str(e))
    field = match.group(1) if match else "?"
    env = _env_value(field)
    name, value = env if env is not None else (f"GATEKEEPER_{field.upper()}", "")
    if field in SECRET_FIELDS:
        value = _hidden(value)
    return SettingsError(
        f"settings: {field}: environment variable {name}={value!r} cannot be parsed ({e.__cause__ or e}); "
        f"{field} is a list or table: give it as JSON, e.g. {name}='{_json_example(field)}', "
        "or set it in the TOML file",
        field=field,
        value=value,
    )


def _json_example(field: str) -> str:
    annotation = (
        str(Settings.model_fields[field].annotation) if field in Settings.model_fields else ""
    )
    if annotation.startswith("dict"):
        return '{"KEY": "VALUE"}'
    if "ModelEntry" in annotation:
        return '[{"name": "NAME", "model": "MODEL"}]'
    return '["VALUE"]'
