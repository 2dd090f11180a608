"""Entry point: ``python -m simlan``."""

from simlan.cli import main

raise SystemExit(main())
