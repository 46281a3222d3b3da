"""The running service: ``gatekeeper serve``.

``app.build_app(settings, inventory, ledger, ...)`` assembles it: the OpenAI proxy
(``gatekeeper.proxy``) with the ``router`` as its resolver (its 507 message:
``rejection``), the ``admin_api`` (with its
``openapi`` schema), ``/metrics`` and the webhook. The ``manager`` admits
(``admitter``, bounded in time, around ``admission``: placement and reservation in one
``ledger`` transaction), launches (``launcher``), supervises and restarts
(``supervisor``), stops and adopts (``adoption``) ``deployment``s of
the models the ``registry`` allows, and probes the ready ones' ``/health`` (liveness); a
deployment's ``records`` survive a restart; the ledger's SQLite file is
``ledger_file``, and what its rows mean per GPU is ``ledger_view``; the
``ledger_keeper`` rebuilds the ledger's rows from the live deployments when the file
is lost; the ``calibrator`` learns corrections from ready workers;
``rehearsal`` is the one module that knows the simulator's protocol.

May import every wing below it: ``k8s``, ``metrics``, ``settings``, ``placement``,
``vllm``, ``estimate``, ``models``, ``gpus``, ``proxy``, ``simulator`` (``rehearsal``
only), ``errors``, ``units``. Nothing of ``gatekeeper.cli``.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gatekeeper.sidecar.app import build_app
    from gatekeeper.sidecar.calibrator import Calibrator
    from gatekeeper.sidecar.deployment import Deployment, DeploymentError, ManagerConfig
    from gatekeeper.sidecar.ledger import Ledger, ledger_path, ledger_usage
    from gatekeeper.sidecar.ledger_file import LedgerError
    from gatekeeper.sidecar.manager import DeploymentManager
    from gatekeeper.sidecar.registry import ModelNotAllowed, ModelRegistry
    from gatekeeper.sidecar.rehearsal import SIMULATOR, RehearsalInventory

__all__ = [
    "SIMULATOR",
    "Calibrator",
    "Deployment",
    "DeploymentError",
    "DeploymentManager",
    "Ledger",
    "LedgerError",
    "ManagerConfig",
    "ModelNotAllowed",
    "ModelRegistry",
    "RehearsalInventory",
    "build_app",
    "ledger_path",
    "ledger_usage",
]

_HOMES = {
    "SIMULATOR": "rehearsal",
    "Calibrator": "calibrator",
    "Deployment": "deployment",
    "DeploymentError": "deployment",
    "DeploymentManager": "manager",
    "Ledger": "ledger",
    "LedgerError": "ledger_file",
    "ManagerConfig": "deployment",
    "ModelNotAllowed": "registry",
    "ModelRegistry": "registry",
    "RehearsalInventory": "rehearsal",
    "build_app": "app",
    "ledger_path": "ledger",
    "ledger_usage": "ledger",
}


def __getattr__(name: str) -> Any:
    """A name of the face, imported from its module when first asked for (PEP 562), so
    that importing one module of the wing (``ledger``, ``logs``: ``gatekeeper check``
    and ``gpus`` read the ledger) loads neither the HTTP stack nor the rest of it."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value
    return value
