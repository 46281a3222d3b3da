"""``python -m gatekeeper`` runs the command-line interface."""

from gatekeeper.cli import main

raise SystemExit(main())
