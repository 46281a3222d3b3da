"""``gatekeeper webhook`` as its own process over TLS on loopback: ``bench/webhook_process.py``,
which ``python -m bench.cluster`` shares."""

from bench.webhook_process import START_SECONDS, WebhookProcess, start_webhook

__all__ = ["START_SECONDS", "WebhookProcess", "start_webhook"]
