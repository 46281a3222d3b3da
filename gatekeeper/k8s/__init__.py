"""The Kubernetes admission webhooks: the validating one, and the mutating one of cluster mode.

``webhook.AdmissionWebhook`` turns an ``AdmissionReview`` (``review``) of a Pod or a
workload (``workloads`` finds the pod templates, the vLLM containers and the GPU they
will land on) into allow, warn or deny; ``fit`` judges one container with the estimator
and suggests from placement's menu of nearby configurations; ``server`` builds the
webhook from the settings and serves it on its own over TLS. ``mutate.Mutator``
(``POST /k8s/mutate``, ``gatekeeper webhook --mutate``) gives a vLLM workload a DRA claim
of the bytes its ranks need (``gatekeeper.cluster.claims``) and the flags that hold it to
them (``pod_patch``), recording what it wrote (``claim_record``), saying why it could not
(``mutation_texts``); ``template_store`` creates the claim templates through the API, only
in namespaces the webhook's configuration selects (``scope``, pure: the selector). Both
webhooks bound the work of a review first (``limits``, pure: the shapes they read, the
sizes and a time budget). In cluster mode (``--published-devices``) the
validating webhook judges by the devices the node agents publish: ``published`` reads the
ResourceSlices and the Nodes' labels, ``fleet`` (pure) turns them into device shapes and
judges with ``fit``, ``node_scope`` (pure) keeps the nodes a pod may land on; ``gpu_terms``
words the GPU counts and suggestions for the mutating webhook's claims mode. Both webhooks
say each decision on a vLLM workload through ``decisions``: a line on
``gatekeeper.decisions`` and the estimate as the response's ``auditAnnotations``.

May import: ``gatekeeper.cluster`` (its pure modules; ``template_store`` also the agent's
quantity reader), ``gatekeeper.settings``, ``gatekeeper.metrics``,
``gatekeeper.placement``, ``gatekeeper.vllm``, ``gatekeeper.estimator``,
``gatekeeper.models``, ``gatekeeper.gpus`` (the GPU table), ``errors``, ``units``, Starlette
and ``prometheus_client``; lightkube only in ``template_store`` and ``published``, which this
package does not import (``import gatekeeper.k8s`` loads no Kubernetes client).
"""

from gatekeeper.k8s.fit import Case, Finding, GpuChoice, gpu_from_value, judge
from gatekeeper.k8s.mutate import Mutation, Mutator
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
    "Mutation",
    "Mutator",
    "WebhookConfig",
    "WebhookDecision",
    "build_webhook_app",
    "gpu_from_value",
    "judge",
    "parse_review",
    "review_response",
    "webhook_from_settings",
]
