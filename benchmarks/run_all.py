"""Run every benchmark script in this folder, one after another, and print their tables.

Benchmarks are whole scripts rather than timed unit tests: they measure ratios
side by side in one run (so a busy machine slows both sides alike) and their
figures go into BENCHMARKS.md with the command that produced them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def main() -> int:
    here = Path(__file__).resolve().parent
    failed = 0
    for script in sorted(here.glob("bench_*.py")):
        print(f"\n=== {script.name} ===", flush=True)
        failed += subprocess.call([sys.executable, str(script), *sys.argv[1:]]) != 0
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
