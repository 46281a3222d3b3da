"""The Kubernetes validating admission webhook.

``webhook.AdmissionWebhook`` turns an ``AdmissionReview`` (``review``) of a Pod or a
workload (``workloads`` finds the pod templates, the vLLM containers and the GPU they
will land on) into allow, warn or deny; ``fit`` judges one container with the estimator
and suggests from placement's menu of nearby configurations; ``server`` builds the
webhook from the settings and serves it on its own over TLS.

May import: ``gatekeeper.settings``, ``gatekeeper.metrics``, ``gatekeeper.placement``,
``gatekeeper.vllm``, ``gatekeeper.estimator``, ``gatekeeper.models``, ``gatekeeper.gpus``
(the GPU table), ``errors``, ``units``, Starlette and ``prometheus_client``.
"""

from gatekeeper.k8s.fit import Case, Finding, GpuChoice, gpu_from_value, judge
from gatekeeper.k8s.review import AdmissionReview, parse_review, review_response
from gatekeeper.k8s.server import CertReloader, build_webhook_app, webhook_from_settings
from gatekeeper.k8s.webhook import AdmissionWebhook, WebhookConfig, WebhookDecision

__all__ = [
    "AdmissionReview",
    "AdmissionWebhook",
    "Case",
    "CertReloader",
    "Finding",
    "GpuChoice",
    "WebhookConfig",
    "WebhookDecision",
    "build_webhook_app",
    "gpu_from_value",
    "judge",
    "parse_review",
    "review_response",
    "webhook_from_settings",
]
