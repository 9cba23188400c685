"""Cold bootstrap of a bare Debian 12 box: from the package index vs from staged wheels.

    python benchmarks/bench_bootstrap.py [--rounds 3]   (as root: it runs boxes)

Each round starts two fresh boxes (tests/fixtures/box.py: a bare Debian 12
image, python3 without numpy, its own sshd on loopback) and times, on each, the
time from "start connecting" to "ready to run the first trial":

1. *first sweep on the host*: ``ensure_workloads`` into an empty home — upload
   the ``workloads`` wheel, create ``env-<hash>``, pip-install it with numpy,
   pyarrow and psutil, either **from the package index** (each VM downloads
   them itself, as before), **from staged wheels** (the sweep's set, copied
   to the host, installed with ``--no-index`` by pip run from its own staged
   wheel into an env made without pip), or **from staged wheels by the env's
   pip** (a set without pip's wheel: the env is made with ensurepip's pip);
2. *a second sweep on the same host*: a new connection, the env is reused.

The variants rotate which goes first in each round (interleaved), and each
figure is the median of the rounds with its min–max. Before timing, each
box gets python3-venv with apt (untimed), as a cloud VM's first-boot script
does before cloudprof logs in. The wheel set itself is downloaded once, on
this machine, before the rounds (its time is printed on its own: once per
sweep, then from the cache).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from _common import machine_line, median, print_table, unavailable

from orchestrator.providers.remote import SshTarget, open_ssh
from orchestrator.providers.wheelhouse import PROBE, HostPlatform, SweepWheels, WheelSource
from orchestrator.providers.wheels import requirements
from tests.fixtures.box import Box, build_image, remove_box, run_box
from tests.fixtures.box import unavailable as box_unavailable


def one_sweep(box: Box, wheels: WheelSource | None) -> tuple[float, str, str]:
    """Seconds until the first trial could start; what the bootstrap did; from where."""
    target = SshTarget(box.host, box.port, box.user, box.client_key, [box.host_public])
    start = time.perf_counter()
    ex = open_ssh(target, timeout=60)
    try:
        ex.ensure_workloads(wheels)
        return time.perf_counter() - start, ex.last_bootstrap or "?", ex.bootstrap_source or "-"
    finally:
        ex.close()


def ready_box(image: object, where: Path, name: str) -> Box:
    """A fresh box with python3-venv installed, as a cloud VM's first boot leaves it."""
    box = run_box(image, where, name)  # type: ignore[arg-type]
    box.exec("sh", "-c", "apt-get update -qq && DEBIAN_FRONTEND=noninteractive "
                         "apt-get install -y -qq --no-install-recommends python3-venv",
             timeout=900)
    return box


def spread(values: list[float]) -> str:
    return f"{min(values):.1f}–{max(values):.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    reason = box_unavailable()
    if reason:
        unavailable(reason)  # the page says why, and the script exits 0
    os.environ.pop("CLOUDPROF_SSH_WORKDIR", None)  # the box's own ~/.cloudprof
    print(machine_line())
    image = build_image()
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-bootstrap-") as tmp:
        probe_box = ready_box(image, Path(tmp), "probe")
        try:
            platform = HostPlatform.parse(probe_box.exec("python3", "-c", PROBE).stdout
                                          .split(" ", 1)[1])
        finally:
            probe_box.stop()
            remove_box(probe_box)
        assert platform is not None
        print("The wheel sets, on this machine (once per sweep, then cached):")
        sources: dict[str, WheelSource | None] = {"index": None}
        for variant, reqs in (("staged", None), ("env-pip", requirements())):
            for _ in range(2):  # two sweeps: the first downloads the set, the second reads it
                wheels = SweepWheels(lambda line: print(f"  {line}"), 3600, "bench",
                                     reqs=reqs, root=Path(tmp) / "wheel-cache")
                wheels.wheel_set(platform)
            sources[variant] = wheels.source(None)
        variants = list(sources)
        for r in range(args.rounds):
            order = variants[r % len(variants):] + variants[:r % len(variants)]
            for variant in order:
                box = ready_box(image, Path(tmp), f"r{r}-{variant}")
                try:
                    source = sources[variant]
                    for sweep, expect in (("first", "installed"), ("reuse", "reused")):
                        seconds, did, came = one_sweep(box, source)
                        assert did == expect, (did, expect)
                        assert sweep == "reuse" or came == ("index" if variant == "index"
                                                            else "staged"), (came, variant)
                        times.setdefault((variant, sweep), []).append(seconds)
                        print(f"  round {r + 1} {variant:6} {sweep:5}: {seconds:6.1f} s")
                finally:
                    box.stop()
                    remove_box(box)
    rows = []
    for variant, label in (("index", "from the package index"),
                           ("staged", "from staged wheels, pip run from its staged wheel"),
                           ("env-pip", "from staged wheels, by the env's own pip")):
        first, reuse = times[(variant, "first")], times[(variant, "reuse")]
        rows.append([label, median(first), spread(first), median(reuse), spread(reuse),
                     args.rounds])
    print_table(["bootstrap of a bare box", "first sweep (s, median)", "min–max",
                 "second sweep (s, median)", "min–max", "rounds"], rows,
                title="Time until the first trial can start (connect + bootstrap)")
    index, staged = median(times[("index", "first")]), median(times[("staged", "first")])
    env_pip = median(times[("env-pip", "first")])
    print(f"\nstaged wheels: the first bootstrap takes {staged / index:.2f}x the index's time "
          f"and {staged / env_pip:.2f}x the time of the env's own pip on the same set; "
          f"reuse is {staged / median(times[('staged', 'reuse')]):.0f}x faster than that")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
