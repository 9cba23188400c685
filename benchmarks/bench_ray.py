"""The cube under Ray at 1 node vs the plain runner, side by side; and cluster start-up time.

    python benchmarks/bench_ray.py --rounds 4 --duration 3

Both sides are real trials (``python -m workloads.run``) on the same cached inputs
and worker count: the plain runner, and the runner with ``--ray-nodes 1
--ray-address`` (the workload as one Ray actor on a one-node cluster, its units
summed by the driver). The order alternates every round, so a neighbour's load
falls on both sides alike. Overhead = 1 - Ray / plain, per round, reported as
median, min and max, in units per wall second and per CPU-second of the node's
Ray tree vs the plain trial's process. Cluster start-up is ``RayCluster.start``
(head, then the other nodes at once) as the engine runs it, timed per size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, add_input_args, input_spec, machine_line, print_table, unavailable


def trial(args: argparse.Namespace, inputs: Path, out: Path, address: str | None) -> dict:
    argv = [sys.executable, "-m", "workloads.run", "--workload", "cube", "--workers",
            str(args.workers), "--duration", str(args.duration), "--param",
            f"inputs={inputs}", "--param", f"dim={args.dim}", "--quiet", "--out", str(out)]
    if address:
        argv += ["--ray-nodes", "1", "--ray-address", address]
    subprocess.run(argv, check=True, cwd=ROOT, timeout=600)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "ok", summary["error"]
    cpu = summary["nodes"][0]["cpu_seconds"] if address else summary.get("cpu_seconds")
    return {"ups": summary["units_per_s"], "cpu": cpu, "units": summary["units"]}


def cluster(n: int, tag: str, tmp: Path):  # -> RayCluster
    from orchestrator.engine.ray_cluster import RayCluster, RayNode, plan_cluster
    from orchestrator.providers.local import LocalExecutor

    plan = plan_cluster(f"bench-{tag}", "local", "127.0.0.1", "local", False)
    nodes = []
    for i in range(n):
        (tmp / f"{tag}-{i}").mkdir(parents=True, exist_ok=True)
        nodes.append(RayNode(i, LocalExecutor(tmp / f"{tag}-{i}"), "127.0.0.1"))
    return RayCluster(plan, nodes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--startup-sizes", default="1,2", help="cluster sizes to time")
    add_input_args(ap)
    ap.set_defaults(frames=20)
    args = ap.parse_args()
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        unavailable("Ray is not installed here (pip install 'cloudprof[ray]')")
    from workloads.inputs import ensure_inputs

    inputs = ensure_inputs(input_spec(args))
    print(machine_line())
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp_name:
        tmp = Path(tmp_name)
        startups = []
        for n in [int(x) for x in args.startup_sizes.split(",")]:
            c = cluster(n, f"s{n}", tmp)
            try:
                c.start()
                startups.append((n, c.start_s))
            finally:
                c.stop()
        c = cluster(1, "o", tmp)
        try:
            c.start()
            ratios, cpu_ratios = [], []
            for r in range(args.rounds):
                sides = ["plain", "ray"] if r % 2 == 0 else ["ray", "plain"]
                got = {}
                for side in sides:
                    got[side] = trial(args, inputs, tmp / f"{side}-{r}",
                                      c.address if side == "ray" else None)
                ratios.append(got["ray"]["ups"] / got["plain"]["ups"])
                if got["ray"]["cpu"] and got["plain"]["cpu"]:
                    per_cpu = [got[s]["units"] / got[s]["cpu"] for s in ("ray", "plain")]
                    cpu_ratios.append(per_cpu[0] / per_cpu[1])
                print(f"round {r}: plain {got['plain']['ups']:.2f} /s, "
                      f"ray {got['ray']['ups']:.2f} /s", flush=True)
        finally:
            time.sleep(0.1)
            c.stop()

    def row(name: str, values: list[float]) -> list[str]:
        return [name, f"{statistics.median(values):.3f}", f"{min(values):.3f}",
                f"{max(values):.3f}", f"{(1 - statistics.median(values)) * 100:+.1f} %"]

    rows = [row("cubes per wall second", ratios)]
    if cpu_ratios:
        rows.append(row("cubes per CPU-second", cpu_ratios))
    print_table(["ratio Ray(1 node) / plain", "median", "min", "max", "overhead (median)"],
                rows, title=f"{args.rounds} interleaved rounds, {args.workers} worker(s), "
                f"{args.duration:g} s each")
    print_table(["nodes", "cluster start-up (s)"],
                [[str(n), f"{s:.1f}"] for n, s in startups], title="RayCluster.start, measured")


if __name__ == "__main__":
    main()
