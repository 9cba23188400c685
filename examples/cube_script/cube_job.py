"""The built-in cube workload written as a plain script that speaks cloudprof's protocol.

It runs the same kernel as ``--workload cube`` (``workloads.cube``) on the same
generated inputs, but as an ordinary process profiled from outside: the
workers are threads of this script and it prints ``cloudprof:units N`` every
tenth of a second. Comparing its cubes/s with the built-in's shows what the
command path costs (see BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import os
import threading

from workloads.base import UnitCounter
from workloads.cube import CubeWorkload


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("frames", 100), ("rows", 1000), ("cols", 1000), ("dim", 100)):
        p.add_argument(f"--{name}", type=int, default=default)
    args = p.parse_args()
    workers = int(os.environ.get("CLOUDPROF_WORKERS", "1"))
    print("cloudprof:unit cube", flush=True)
    print("cloudprof:phase prepare", flush=True)
    workload = CubeWorkload(frames=args.frames, rows=args.rows, cols=args.cols, dim=args.dim)
    workload.prepare()
    print("cloudprof:phase cubes", flush=True)
    counter, stop = UnitCounter(), threading.Event()
    runner = threading.Thread(target=workload.run, args=(workers, stop, counter), daemon=True)
    runner.start()
    reported = 0
    while runner.is_alive():  # until the trial's --duration stops this process
        runner.join(0.1)
        done = counter.value
        if done > reported:
            print(f"cloudprof:units {done - reported}", flush=True)
            reported = done


if __name__ == "__main__":
    main()
