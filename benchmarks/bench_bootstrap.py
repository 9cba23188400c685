"""SSH bootstrap: a host's first sweep (build the env) vs a later one (reuse it).

    python benchmarks/bench_bootstrap.py [--rounds 3]

Against a real OpenSSH sshd on loopback (the tests' fixture, started here),
each round times, side by side:

1. *first sweep on a host*: log in, then ``ensure_workloads`` into an empty
   workdir — upload the wheel, create ``env-<hash>``, pip-install the wheel;
2. *a later sweep*: a new connection, then ``ensure_workloads`` again, which
   finds the env for the same hash and reuses it.

Both use this interpreter as the host's python, whose numpy/pyarrow/psutil the
venv (``--system-site-packages``) reuses — the case of an image that already
has them. On an image without them the first sweep also downloads them from
PyPI (network bound) while the later one still only checks the env. The
figures are medians of ``--rounds`` rounds.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from _common import machine_line, median, print_table, unavailable

from orchestrator.providers.remote import SshTarget, open_ssh
from tests.fixtures.sshd import start_sshd


def one_sweep(target: SshTarget) -> tuple[float, str]:
    """Seconds from 'start connecting' to 'ready to run the first trial', and what it did."""
    start = time.perf_counter()
    ex = open_ssh(target, timeout=30)
    try:
        ex.ensure_workloads()
        return time.perf_counter() - start, ex.last_bootstrap or "?"
    finally:
        ex.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not Path("/usr/sbin/sshd").is_file():
        unavailable("it needs an OpenSSH server (/usr/sbin/sshd: apt-get install openssh-server)")
    print(machine_line())
    with tempfile.TemporaryDirectory(prefix="bench-bootstrap-") as tmp:
        server = start_sshd(Path(tmp) / "sshd")
        try:
            target = SshTarget(
                server.host,
                server.port,
                server.user,
                server.client_key,
                [server.host_public],
                python=sys.executable,
            )
            first, later = [], []
            for i in range(args.rounds):
                os.environ["CLOUDPROF_SSH_WORKDIR"] = str(Path(tmp) / f"workdir-{i}")
                seconds, did = one_sweep(target)
                assert did == "installed", did
                first.append(seconds)
                seconds, did = one_sweep(target)
                assert did == "reused", did
                later.append(seconds)
        finally:
            server.stop()
    a, b = median(first), median(later)
    print_table(
        ["sweep on the host", "connect + bootstrap (s, median)", "rounds"],
        [["first (install)", a, args.rounds], ["later (reuse)", b, args.rounds]],
        title="Time until the first trial can start",
    )
    print(f"\nreuse is {a / b:.1f}x faster than the first bootstrap")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
