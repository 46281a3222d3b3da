"""``python -m gatekeeper.simulator serve MODEL [flags]``: the stand-in ``vllm serve``."""

from gatekeeper.simulator.cli import main

raise SystemExit(main())
