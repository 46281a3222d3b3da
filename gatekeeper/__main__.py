"""``python -m gatekeeper`` runs the command-line interface."""

from gatekeeper.cli.main import main

raise SystemExit(main())
