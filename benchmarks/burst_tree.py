"""Three children at once, each holding MB MiB of anonymous memory for HOLD seconds.

    python benchmarks/burst_tree.py MB HOLD

The process tree whose simultaneous peak docs/benchmarks.md's "A process tree's peak"
measures under ``python -m workloads.run --command`` (with and without a memory cgroup).
"""

import subprocess
import sys

mb, hold = int(sys.argv[1]), float(sys.argv[2])
child = f"b = bytearray(b'x') * ({mb} << 20); import time; time.sleep({hold})"
procs = [subprocess.Popen([sys.executable, "-c", child]) for _ in range(3)]
sys.exit(max(p.wait() for p in procs))
