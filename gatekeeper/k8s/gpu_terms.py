"""How a pod gets its GPUs, in the words of the webhook's mode (pure): the texts of the
validating webhook's GPU counts and suggestions (``gatekeeper.k8s.fit``).

Without a claims mode (``claims`` None) a pod asks for ``nvidia.com/gpu``. With the
mutating webhook (``gatekeeper webhook --mutate --claims-mode ...``) what the operator
changes is different: in ``gatekeeper`` and ``nvidia-dra`` modes the webhook claims one GPU
of the mode's DeviceClass per tensor-parallel rank (``gatekeeper.cluster.claims``), so a
suggestion speaks of ranks and the DeviceClass, never of an ``nvidia.com/gpu`` count; in
``hami`` mode the pod's limits carry HAMi's ``nvidia.com/gpu`` and ``nvidia.com/gpumem``.

e.g. a suggestion of TP 2: ``--tensor-parallel-size 2 with nvidia.com/gpu: 2`` (no mode),
``--tensor-parallel-size 2 (2 ranks, one GPU of DeviceClass gpu.gatekeeper.dev claimed for
each)`` (gatekeeper), ``--tensor-parallel-size 2 with nvidia.com/gpu: 2 and
nvidia.com/gpumem per GPU`` (hami).
"""

from __future__ import annotations

from gatekeeper.cluster.claims import ClaimsMode, claim_driver

__all__ = ["give_text", "gpus_text", "has_text", "nothing_nearby"]


def _device_class(claims: ClaimsMode) -> str:
    driver = claim_driver(claims)
    return driver.device_class if driver is not None else claims


def has_text(gpus: int | None, claims: ClaimsMode | None, subject: str = "the pod") -> str:
    """What the pod has, in the words of the mode."""
    count = gpus if gpus is not None else "no"
    if claims in (None, "hami"):
        return f"{subject} requests {count} nvidia.com/gpu"
    plural = "s" if gpus != 1 else ""
    return f"{subject} claims {count} GPU{plural} of DeviceClass {_device_class(claims)}"


def give_text(gpus: int, claims: ClaimsMode | None) -> str:
    """How to give the pod ``gpus`` GPUs in the mode."""
    if claims is None:
        return f"set resources.limits nvidia.com/gpu: {gpus}"
    if claims == "hami":
        return (
            f"set resources.limits nvidia.com/gpu: {gpus} and nvidia.com/gpumem (MiB per GPU), "
            "or leave both to gatekeeper's mutating webhook"
        )
    return (
        f"let gatekeeper's mutating webhook claim {gpus} GPUs of DeviceClass "
        f"{_device_class(claims)}, one per rank (it leaves a claim written by hand alone: "
        "remove that claim)"
    )


def gpus_text(gpus: int, claims: ClaimsMode | None) -> str:
    """The GPUs a suggested size takes, as the operator gets them in the mode: an
    ``nvidia.com/gpu`` count, HAMi's count and memory, or one claimed GPU per rank."""
    if claims is None:
        return f"with nvidia.com/gpu: {gpus}"
    if claims == "hami":
        return f"with nvidia.com/gpu: {gpus} and nvidia.com/gpumem per GPU"
    return f"({gpus} ranks, one GPU of DeviceClass {_device_class(claims)} claimed for each)"


def nothing_nearby(claims: ClaimsMode | None) -> str:
    """The end of a denial when no nearby size fits."""
    pin = "pin a larger GPU (nodeSelector nvidia.com/gpu.product)"
    if claims in (None, "hami"):
        return f"Nothing nearby fits: {pin} or use more GPUs with --tensor-parallel-size"
    return (
        f"Nothing nearby fits: {pin} or add nodes with larger GPUs to DeviceClass "
        f"{_device_class(claims)}, or claim more ranks with --tensor-parallel-size"
    )
