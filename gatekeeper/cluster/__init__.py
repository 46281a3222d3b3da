"""Placement across nodes through Kubernetes (issue 29; ``../shared/reference/cluster.md``).

Kubernetes' own scheduler places the pods and keeps the books, with GPU memory as DRA
consumable capacity. ``slices`` turns a node's GPUs (an ``InventorySnapshot``) into the
ResourceSlice the node agent publishes, as plain dicts; ``accounting`` (pure too) reads
what the claims book on a pool's devices and taints a device that holds memory no claim
books; ``agent`` (``gatekeeper agent``) publishes, taints and republishes through the
apiserver. ``claims`` (pure) sizes a vLLM container's ranks as placement would and writes
the ResourceClaimTemplate the mutating webhook (``gatekeeper.k8s.mutate``) creates, and
reads a hand-written template's requests back as bytes; ``claim_annotation`` (pure) writes
and reads the record the webhook leaves on a pod (``vllm-gatekeeper.io/claim``: the flags,
the bytes and the rank's components). ``attribution`` (pure) gives each
GPU process to its pod's claim, the rest as foreign memory; ``agent_metrics`` exports the
agent's state and those per-pod figures; ``pod_relay`` serves a pod's headroom at the pod's
own address for the llm-d router (``deploy/llm-d``). The kubelet plugin (``kubelet_plugin``,
``dra_driver``) prepares claims: ``prepared`` (pure) reads a claim's devices and decides
whether their bytes are free, ``allocation_check`` (pure) whether each booking is one the
node's published slice allows, ``reserves`` (pure) whether the pods' vLLM flags fit it.
``unclaimed`` (pure) finds the node's pods that hold ``nvidia.com/gpu`` in no claim, which the
agent reports; ``unallocatable`` (pure) the Pending pods whose claims kube-scheduler cannot
allocate, with the bytes they ask and what each node has free, which the agent reports
through ``allocation_events`` (an Event per pod per change). ``decision_log`` names the
decision lines' logger every door writes to, and ``kube_time`` writes and reads
Kubernetes' RFC 3339 stamps (both imported by the webhook and the sidecar too).

May import: ``gatekeeper.placement`` (its types and its search), ``gatekeeper.vllm`` (the
launch fractions), ``gatekeeper.estimator``, ``gatekeeper.models`` (the spec type),
``gatekeeper.gpus`` (the inventory types, the GPU table), ``errors``, ``units``. Only
``agent`` and the modules it and the kubelet plugin run (``allocation_events``,
``claims_watch`` ...) import the Kubernetes client (lightkube, the ``cluster`` extra), and
this package imports none of them: ``import gatekeeper.cluster`` loads no client.
"""

from gatekeeper.cluster.slices import (
    DRIVER_NAME,
    REQUEST_STEP_BYTES,
    SliceError,
    device_capacity_bytes,
    device_name,
    gpu_device,
    resource_slice,
    slice_name,
)

__all__ = [
    "DRIVER_NAME",
    "REQUEST_STEP_BYTES",
    "SliceError",
    "device_capacity_bytes",
    "device_name",
    "gpu_device",
    "resource_slice",
    "slice_name",
]
