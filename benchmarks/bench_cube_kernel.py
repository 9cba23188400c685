"""Cube kernel throughput against this machine's memory bandwidth, and the article's table.

    python benchmarks/bench_cube_kernel.py            # defaults: the article's sizes
    python benchmarks/bench_cube_kernel.py --consumers-only   # what one unit delivers

The ``fast`` strategy moves, per cube, ``frames*dim`` contiguous runs of ``dim``
doubles from a (cols, frames, dim) array into a per-worker buffer:

    bytes a cube must move = 2 * frames * dim * dim * 8   (read the runs + write the cube)

which is 16 MB at the defaults. Two bounds are measured in the same run:

- DRAM bound: copy bandwidth (read + write bytes/s of a 256 MB numpy copy,
  with 1 and with N threads) divided by that figure. It assumes both sides
  go to DRAM; when the 8 MB per-worker buffer stays in the last-level cache,
  the kernel can beat it (fraction > 100%).
- Contiguous bound: the same number of bytes copied with ``np.copyto`` from the
  same source array into the same kind of buffer, as one contiguous run from a
  random offset — no gather at all. No layout of the data can do better.

Then every strategy of the article is run (``naive`` on a few cubes only) so
its table is reproduced on this machine next to the article's own figures.
"""

from __future__ import annotations

import argparse
import gc
import threading
import time

from _common import (
    add_input_args,
    input_spec,
    machine_line,
    median,
    memory_bandwidth,
    print_table,
    timed,
)

from workloads.base import UnitCounter
from workloads.cube import CubeWorkload
from workloads.inputs import ensure_inputs

# The article's Table 3 (12-core desktop; ``threads`` used 12 workers).
ARTICLE_RATES = {"naive": 0.15, "dataframes": 15.13, "numpy": 76.26, "threads": 355.50}


def contiguous_copy_rate(src_flat, cube_items: int, threads: int, seconds: float) -> float:
    """Copies/s of ``cube_items`` contiguous doubles from random offsets of ``src_flat``."""
    import numpy as np

    stop = threading.Event()
    counts = [0] * threads

    def work(index: int) -> None:
        rng = np.random.default_rng(index)
        buf = np.empty(cube_items)
        limit = src_flat.size - cube_items
        while not stop.is_set():
            start = int(rng.integers(0, limit))
            np.copyto(buf, src_flat[start : start + cube_items])
            counts[index] += 1

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    begin = time.perf_counter()
    for w in workers:
        w.start()
    time.sleep(seconds)
    stop.set()
    for w in workers:
        w.join()
    return sum(counts) / (time.perf_counter() - begin)


def run_for(work: CubeWorkload, workers: int, seconds: float) -> float:
    """Cubes/s of ``work`` with ``workers`` threads over ``seconds``, through its ``run``."""
    stop, counter = threading.Event(), UnitCounter()
    timer = threading.Timer(seconds, stop.set)
    start = time.perf_counter()
    timer.start()
    work.run(workers, stop, counter)
    return counter.value / (time.perf_counter() - start)


def compare_layouts(directory: str, dim: int, seconds: float, repeats: int) -> None:
    """One-thread rates of three kernels over the same first ``dim`` rows, interleaved.

    Each gathers a cube equal to the reference; only the memory layout differs:
    how long a contiguous run one sampled column gives.
    """
    import numpy as np

    from workloads.inputs import load_rows

    rows = load_rows(directory, dim)  # (frames, dim, cols), C order
    frames, _, ncols = rows.shape
    per_frame = np.ascontiguousarray(rows.transpose(0, 2, 1))  # (frames, cols, dim)
    ours = np.ascontiguousarray(rows.transpose(2, 0, 1))  # (cols, frames, dim)
    out_frame = np.empty((frames, dim, dim))
    out_ours = np.empty((dim, frames, dim))
    rng = np.random.default_rng(0)
    kernels = {
        # The article's fancy indexing (a fresh array per cube).
        "row gather: (frames, dim, cols)[:, :, cols]": lambda c: rows[:, :, c],
        "runs of dim: take (frames, cols, dim) axis 1": lambda c: np.take(
            per_frame, c, axis=1, out=out_frame, mode="clip"
        ),
        "runs of frames*dim: take (cols, frames, dim) axis 0 (fast)": lambda c: np.take(
            ours, c, axis=0, out=out_ours, mode="clip"
        ),
    }
    rates: dict[str, list[float]] = {k: [] for k in kernels}
    for _ in range(repeats):
        for name, kernel in kernels.items():
            n, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                kernel(rng.choice(ncols, dim, replace=False))
                n += 1
            rates[name].append(n / (time.perf_counter() - start))
    best = median(rates[next(reversed(kernels))])
    print_table(
        ["layout (one worker)", "run bytes", "cubes/s", "fast is"],
        [
            [name, run, median(r), f"{best / median(r):.1f}x"]
            for (name, r), run in zip(rates.items(), [8, dim * 8, frames * dim * 8], strict=True)
        ],
        title=f"memory layouts of the same data (medians of {repeats} interleaved rounds)",
    )


def compare_consumers(params: dict[str, str], seconds: float, repeats: int) -> None:
    """One-worker rates by consumer (what one unit delivers), and the article's ``numpy`` kernel.

    Interleaved rounds: every configuration runs once per round, so a neighbour's
    load hits all alike; ratios are medians of the per-round ratios to ``fast``
    with the ``view`` consumer (the default unit).
    """
    configs = {
        "fast, view (default)": ("fast", "view"),
        "fast, contiguous": ("fast", "contiguous"),
        "fast, keep": ("fast", "keep"),
        "numpy (article), view": ("numpy", "view"),
    }
    works = {}
    for name, (strategy, consumer) in configs.items():
        works[name] = CubeWorkload(strategy=strategy, consumer=consumer, **params)
        works[name].prepare()
        run_for(works[name], 1, 0.2)  # warm-up
    rates: dict[str, list[float]] = {k: [] for k in configs}
    for _ in range(repeats):
        for name, work in works.items():
            rates[name].append(run_for(work, 1, seconds))
    base = rates["fast, view (default)"]
    rows = []
    for name, r in rates.items():
        ratios = [a / b for a, b in zip(r, base, strict=True)]
        rows.append(
            [name, median(r), f"{min(r):,.0f}–{max(r):,.0f}", f"{median(ratios):.2f}x",
             f"{min(ratios):.2f}–{max(ratios):.2f}"]
        )  # fmt: skip
    print_table(
        ["kernel, consumer (one worker)", "cubes/s", "min–max", "vs fast view", "ratio min–max"],
        rows,
        title=f"what one unit delivers (medians of {repeats} interleaved rounds of {seconds} s)",
    )
    numpy = rates["numpy (article), view"]
    times = [b / a for a, b in zip(numpy, base, strict=True)]
    print(
        f"fast (view) is {median(times):.1f}x the article's numpy kernel side by side "
        f"(median of per-round ratios, {min(times):.1f}–{max(times):.1f})"
    )


def measure_fast(
    args: argparse.Namespace, params: dict[str, str], worker_counts: list[int]
) -> tuple[list[list], float]:
    """The fast kernel's rate and both bounds, per worker count."""
    fast = CubeWorkload(strategy="fast", **params)
    (load_s,) = timed(fast.prepare)
    assert fast.strategy is not None
    frames = fast.strategy.frames
    cube_bytes = frames * args.dim * args.dim * 8
    moved = 2 * cube_bytes
    print(
        f"cube: {frames}x{args.dim}x{args.dim} float64 = {cube_bytes / 1e6:.1f} MB; "
        f"bytes a cube must move = 2 * frames * dim * dim * 8 = {moved / 1e6:.1f} MB"
    )

    rows, per_round = [], []
    items = frames * args.dim * args.dim
    src = fast.strategy.src.reshape(-1)
    for n in worker_counts:
        run_for(fast, n, 0.3)  # warm-up
        # Interleave the probes and the kernel so a neighbour's load hits all alike;
        # report medians of the per-round figures and ratios.
        rounds = []
        for _ in range(args.repeats):
            bandwidth = memory_bandwidth(n, repeats=3)
            contiguous = contiguous_copy_rate(src, items, n, args.seconds)
            rate = run_for(fast, n, args.seconds)
            dram_bound = bandwidth / moved
            rounds.append(
                (bandwidth, rate, dram_bound, contiguous, rate / dram_bound, rate / contiguous)
            )
        bandwidth, rate, dram_bound, contiguous, of_dram, of_contiguous = (
            median([r[i] for r in rounds]) for i in range(6)
        )
        per_round.append(
            f"  {n} worker(s), per round: of DRAM bound "
            + ", ".join(f"{100 * r[4]:.0f}%" for r in rounds)
            + "; of contiguous "
            + ", ".join(f"{100 * r[5]:.0f}%" for r in rounds)
        )
        rows.append(
            [
                n,
                bandwidth / 1e9,
                rate,
                rate / n,
                dram_bound,
                f"{100 * of_dram:.0f}%",
                contiguous,
                f"{100 * of_contiguous:.0f}%",
            ]
        )
    print_table(
        [
            "workers",
            "copy GB/s (r+w)",
            "fast cubes/s",
            "per core",
            "DRAM bound",
            "of DRAM bound",
            "contiguous bound",
            "of contiguous",
        ],
        rows,
        title=f"fast kernel: medians of {args.repeats} interleaved rounds of {args.seconds} s "
        "(bounds in cubes/s)",
    )
    print("percentages are medians of the per-round ratios (each round measures the bound and")
    print("the kernel back to back), so they need not equal the ratio of the median columns:")
    print("\n".join(per_round))
    return rows, load_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_input_args(ap)
    ap.add_argument("--workers", default="1,2", help="worker counts for the fast kernel")
    ap.add_argument("--seconds", type=float, default=0.3, help="duration of each probe")
    ap.add_argument("--repeats", type=int, default=9, help="interleaved rounds (median)")
    ap.add_argument(
        "--article-cubes", type=int, default=100, help="cubes for dataframes/numpy/threads"
    )
    ap.add_argument("--naive-cubes", type=int, default=2, help="cubes for naive (slow!)")
    ap.add_argument("--skip-article", action="store_true", help="only the fast kernel")
    ap.add_argument(
        "--consumers-only", action="store_true", help="only the consumers table (fast, 1 worker)"
    )
    ap.add_argument(
        "--cache", default=None, help="inputs cache (default: $CLOUDPROF_CACHE or ~/.cache)"
    )
    args = ap.parse_args()
    worker_counts = [int(w) for w in args.workers.split(",")]

    print(f"machine: {machine_line()}")
    spec = input_spec(args)
    (gen_s,) = timed(lambda: ensure_inputs(spec, args.cache))
    directory = ensure_inputs(spec, args.cache)
    print(f"inputs: {directory} (ensure_inputs {gen_s:.2f} s)")
    params = dict(dim=str(args.dim), seed=str(args.seed), inputs=str(directory))

    if args.consumers_only:
        compare_consumers(params, args.seconds, args.repeats)
        return
    rows, load_s = measure_fast(args, params, worker_counts)
    compare_layouts(str(directory), args.dim, args.seconds, args.repeats)
    compare_consumers(params, args.seconds, args.repeats)

    if args.skip_article:
        return
    article_rows = []
    max_workers = max(worker_counts)
    plan = [
        ("naive", 1, args.naive_cubes),
        ("dataframes", 1, args.article_cubes),
        ("numpy", 1, args.article_cubes),
        ("threads", max_workers, args.article_cubes),
    ]
    rates: dict[str, float] = {}
    for strategy, workers, cubes in plan:
        work = CubeWorkload(strategy=strategy, **params)
        (prep,) = timed(work.prepare)
        (secs,) = timed(
            lambda work=work, workers=workers, cubes=cubes: work.produce(cubes, workers)
        )
        rates[strategy] = cubes / secs
        article_rows.append(
            [strategy, workers, cubes, prep, rates[strategy], ARTICLE_RATES[strategy]]
        )
        del work
        gc.collect()
    article_rows.append(["fast", 1, "(above)", load_s, rows[0][2], "-"])
    article_rows.append(["fast", rows[-1][0], "(above)", load_s, rows[-1][2], "-"])
    for row in article_rows:
        row.append(f"{row[4] / rates['naive']:,.0f}x")
    print_table(
        ["strategy", "workers", "cubes", "load s", "cubes/s", "article cubes/s", "vs naive"],
        article_rows,
        title="the article's steps here (article: 12-core desktop, its threads = 12 workers)",
    )


if __name__ == "__main__":
    main()
