"""vLLM's command-line surface, both ways.

``table`` is vLLM's own table of ``vllm serve`` flags per release (generated from vLLM's
parser by ``scripts/vllm-flag-table.py``, shipped as package data) with their value
grammar and argparse's reading of a spelling (abbreviations); ``flags`` is the one door
for options given as a mapping (``options_from_mapping``); ``serve_args``
reads a whole command line as vLLM's parser does. ``launch`` writes the argument list a
placement launches with (the ``LaunchFlags`` derived from the estimate); ``command``
reads a vLLM command line out of a container (the webhook's input), ``shell`` the
line in a container's script, split as the shell splits it; ``log`` reads a
worker's log: start-up phases, vLLM's own memory figures and the errors that end a
start-up; ``sleep_mode`` is vLLM's sleep mode (its routes, what stays on the GPU asleep)
and gatekeeper's idle policy over it. All pure but for reading the shipped table (and ``--config`` files).

May import: ``gatekeeper.estimator`` (the serving options), ``gatekeeper.errors``,
``gatekeeper.units``. Never ``vllm`` itself: the engine lives in its own environment.
"""

from typing import TYPE_CHECKING

from gatekeeper._lazy import face

if TYPE_CHECKING:
    from gatekeeper.vllm.command import VllmCommand, parse_vllm_command
    from gatekeeper.vllm.flags import options_from_mapping, serve_options, serve_values
    from gatekeeper.vllm.launch import LaunchFlags, launch_args
    from gatekeeper.vllm.log import MemoryFigures, StartupLog, failure_reason, parse_line
    from gatekeeper.vllm.serve_args import ServeCommand, parse_serve_args
    from gatekeeper.vllm.sleep_mode import DEV_MODE_ENV, SLEEP_FLAG, IdlePolicy, asleep_bytes
    from gatekeeper.vllm.table import Flag, FlagTable, flag_table, human_readable_int

__all__ = [
    "DEV_MODE_ENV",
    "SLEEP_FLAG",
    "Flag",
    "FlagTable",
    "IdlePolicy",
    "LaunchFlags",
    "MemoryFigures",
    "ServeCommand",
    "StartupLog",
    "VllmCommand",
    "asleep_bytes",
    "failure_reason",
    "flag_table",
    "human_readable_int",
    "launch_args",
    "options_from_mapping",
    "parse_line",
    "parse_serve_args",
    "parse_vllm_command",
    "serve_options",
    "serve_values",
]

__getattr__, __dir__ = face(globals())
