"""``python -m gatekeeper`` runs the command-line interface."""

from gatekeeper.cli.console import main

raise SystemExit(main())
