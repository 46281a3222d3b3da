"""What the mutating webhook says when it cannot write a claim (``gatekeeper.k8s.mutate``):
a command line it cannot size, and an internal error. Pure."""

from __future__ import annotations

from gatekeeper.vllm.command import VllmCommand

__all__ = ["internal_error", "unreadable"]


def unreadable(who: str, command: VllmCommand) -> str | None:
    """Why the command line cannot be sized, or None."""
    texts = [command.model or "", *command.problems, *command.unknown]
    expansions = sorted({w for t in texts for w in t.split() if "$" in w})
    if expansions:
        return (
            f"{who}: its vllm serve line holds shell or Kubernetes expansions gatekeeper cannot "
            f"resolve ({', '.join(expansions)[:120]}): a script it cannot read, not a bad flag; "
            "give the values literally (or in a literal env value), write the claim yourself, "
            "or annotate vllm-gatekeeper.io/skip"
        )
    if command.model is None:
        return (
            f"{who}: cannot size a claim: no model on the vllm serve line nor in a literal "
            "VLLM_MODEL, MODEL or MODEL_NAME env value; name the model on the command line"
        )
    if command.problems:
        return (
            f"{who}: its vllm serve line cannot be read ({'; '.join(command.problems)}), so no "
            "claim is written; fix the value"
        )
    return None


def internal_error(e: Exception) -> str:
    return (
        f"gatekeeper: internal error ({type(e).__name__}) while writing its claim; denied "
        "rather than admitted without one (a webhook that is down is refused the same way "
        "under failurePolicy Fail); the webhook's log has the traceback"
    )
