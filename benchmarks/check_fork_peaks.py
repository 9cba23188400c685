"""Does a forked child's peak memory start at its own RSS, or at its parent's high-water mark?

    python benchmarks/check_fork_peaks.py

The question a warm per-host runner (fork a fresh trial process after the imports)
must answer before its peaks can be trusted. The parent touches 300 MiB and frees
it, then forks; the child prints its VmHWM, VmRSS and ru_maxrss before and after
touching 100 MiB, and the parent prints what ``wait4`` says of the child.
"""

from __future__ import annotations

import os
import resource

import numpy as np

MIB = 2**20


def status() -> str:
    """VmHWM and VmRSS of this process, in MiB, from /proc/self/status."""
    fields = {}
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                fields[key] = int(value.split()[0]) // 1024
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    return f"VmHWM {fields['VmHWM']} MiB, VmRSS {fields['VmRSS']} MiB, ru_maxrss {maxrss} MiB"


def main() -> None:
    block = np.ones(300 * MIB // 8)
    del block
    print(f"parent, after touching and freeing 300 MiB: {status()}")
    pid = os.fork()
    if pid == 0:
        print(f"child, just forked:                        {status()}", flush=True)
        held = np.ones(100 * MIB // 8)
        print(f"child, after touching {held.nbytes // MIB} MiB:             {status()}", flush=True)
        os._exit(0)
    _, _, rusage = os.wait4(pid, 0)
    print(f"parent, wait4's ru_maxrss of the child:    {rusage.ru_maxrss // 1024} MiB")
    print(f"kernel: {os.uname().release}")


if __name__ == "__main__":
    main()
