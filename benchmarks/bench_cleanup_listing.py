"""What ``cloudprof cleanup --provider aws`` costs before it says "nothing to clean up".

    python benchmarks/bench_cleanup_listing.py                                # this checkout
    python benchmarks/bench_cleanup_listing.py --code /tmp/before --code .    # side by side
    python benchmarks/bench_cleanup_listing.py --rtt 0.1 ...                  # a distant endpoint

Cleanup lists every region cloudprof may have used (the shell's region and the
catalog's AWS regions), so it makes a boto3 client per region. Each round runs
the command once per checkout, interleaved, as a fresh process through its
console entry point (``orchestrator.cli.main()``), against a moto server started
here (EC2's API over real HTTP on loopback; no network latency, so what is left is
the client's own CPU). Reported: the process's wall and CPU seconds (user +
system, from the kernel's accounting of the child), medians with min–max. CPU is
the figure to compare on a shared machine: a neighbour's load stretches wall time,
not CPU time.

``--rtt S`` puts a relay in front of moto that holds each request S seconds before
passing it on: a stand-in for the round trip to a distant region's endpoint (a
simulation, labelled as such in the table; real round trips vary by region), where
the wall time of listing region after region, or at once, shows.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import ROOT, machine_line, median, print_table, unavailable

_WRAPPER = """
import sys
from orchestrator import cli
sys.argv = ["cloudprof", "cleanup", "--provider", "aws"]
sys.exit(cli.main())
"""


def _pump(src: socket.socket, dst: socket.socket, delay: float) -> None:
    """Copy ``src`` to ``dst`` until either closes, holding each chunk ``delay`` seconds."""
    try:
        while chunk := src.recv(65536):
            if delay:
                time.sleep(delay)
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def start_relay(target_port: int, delay: float) -> int:
    """A loopback TCP relay to ``target_port`` that delays requests (not replies); its port."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            client, _ = listener.accept()
            upstream = socket.create_connection(("127.0.0.1", target_port))
            for args in ((client, upstream, delay), (upstream, client, 0.0)):
                threading.Thread(target=_pump, args=args, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1]


def one_cleanup(code: str, env: dict[str, str], cwd: str) -> tuple[float, float]:
    """(wall, CPU) seconds of ``cloudprof cleanup --provider aws`` run from ``code``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    # ``-c`` puts the working directory first on sys.path: run in an empty directory,
    # where no checkout's orchestrator/ can shadow the one PYTHONPATH names.
    proc = subprocess.run([sys.executable, "-c", _WRAPPER], cwd=cwd, capture_output=True,
                          text=True, env={**env, "PYTHONPATH": code}, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0 or "nothing to clean up" not in proc.stdout:
        sys.exit(f"cloudprof cleanup failed with {code} (exit {proc.returncode}): "
                 f"{proc.stdout[-1000:]}{proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rtt", type=float, default=0.0,
                    help="seconds each request is held before it reaches moto (simulated)")
    ap.add_argument("--code", action="append", default=None,
                    help="a checkout to run the command from (repeatable; default: this one)")
    args = ap.parse_args()
    import importlib.util

    if importlib.util.find_spec("moto") is None:
        unavailable("it needs moto, the tests' AWS stand-in (pip install -e '.[dev]')")
    print(f"machine: {machine_line()}")
    codes = [str(Path(c).resolve()) for c in (args.code or [str(ROOT)])]

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint_port = start_relay(port, args.rtt) if args.rtt else port
    try:
        with tempfile.TemporaryDirectory(prefix="bench-cleanup-") as tmp:
            env = {**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{endpoint_port}",
                   "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                   "AWS_DEFAULT_REGION": "us-east-1", "HOME": tmp,
                   "CLOUDPROF_CACHE": str(Path(tmp) / "cache")}
            for code in codes:
                one_cleanup(code, env, tmp)  # bytecode compiled, page cache warm
            walls: dict[str, list[float]] = {c: [] for c in codes}
            cpus: dict[str, list[float]] = {c: [] for c in codes}
            for _ in range(args.rounds):
                for code in codes:
                    wall, cpu = one_cleanup(code, env, tmp)
                    walls[code].append(wall)
                    cpus[code].append(cpu)
    finally:
        server.stop()
    rows = [[code, median(cpus[code]), f"{min(cpus[code]):.2f}–{max(cpus[code]):.2f}",
             median(walls[code]), f"{min(walls[code]):.2f}–{max(walls[code]):.2f}"]
            for code in codes]
    print_table(["checkout", "CPU s (median)", "min–max", "wall s (median)", "min–max"], rows,
                title="cloudprof cleanup --provider aws (moto, nothing to clean"
                      + (f", simulated round trip {args.rtt:g} s" if args.rtt else "")
                      + f"), {args.rounds} interleaved rounds")


if __name__ == "__main__":
    main()
