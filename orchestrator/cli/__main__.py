"""``python -m orchestrator.cli`` runs the cloudprof CLI (same as the ``cloudprof`` script)."""

import sys

from orchestrator.cli import main

sys.exit(main())
