"""``python -m gatekeeper`` runs the command-line interface."""

from gatekeeper.cli.entry import main

raise SystemExit(main())
