"""vLLM's command-line surface, both ways.

``launch`` writes the ``vllm serve`` argument list a placement launches with (the
``LaunchFlags`` derived from the estimate); ``command`` reads a vLLM command line out of
a container (the webhook's input); ``log`` reads a worker's log: start-up phases, vLLM's
own memory figures and the errors that end a start-up. All pure.

May import: ``gatekeeper.estimate`` (the serving options), ``gatekeeper.errors``,
``gatekeeper.units``. Never ``vllm`` itself: the engine lives in its own environment.
"""

from gatekeeper.vllm.command import VllmCommand, parse_vllm_command
from gatekeeper.vllm.launch import LaunchFlags, launch_args
from gatekeeper.vllm.log import MemoryFigures, StartupLog, failure_reason, parse_line

__all__ = [
    "LaunchFlags",
    "MemoryFigures",
    "StartupLog",
    "VllmCommand",
    "failure_reason",
    "launch_args",
    "parse_line",
    "parse_vllm_command",
]
