"""The data plane: what runs on each VM (and locally).

Kept to numpy, pyarrow and psutil at run time, and never imports
``orchestrator`` — this package is what ships to a VM as a wheel.
"""

__version__ = "0.1.0"

from workloads import interrupts as _interrupts

if _interrupts.started_as_program():  # a process of cloudprof's own: Ctrl-C ends it quietly
    _interrupts.quiet()
