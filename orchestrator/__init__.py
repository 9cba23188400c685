"""The control plane: CLI, catalog, planner, providers, sweep engine, results and reports."""

import os as _os
import sys as _sys

__version__ = "0.1.0"

# A Ctrl-C while ``cloudprof`` is still importing itself (its first few tenths of a
# second, before ``cli.main`` and its signal policy take over) ends it quietly, with
# no traceback through the import frames: only when this package is being imported to
# run the CLI (the ``cloudprof`` script or ``python -m orchestrator``), never when a
# program or a test imports it.
if _os.path.basename(_sys.argv[0] if _sys.argv else "") == "cloudprof" or _sys.argv[:1] == ["-m"]:
    from workloads import interrupts as _interrupts

    _interrupts.quiet()
