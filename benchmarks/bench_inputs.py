"""Loading the cube workload's inputs: our row-group loader vs pandas, and CSV vs Parquet.

    python benchmarks/bench_inputs.py                 # defaults: the article's sizes

Three comparisons, each measured side by side in this run (warm page cache for
both sides: the files were just generated or read):

1. Generation of the default inputs (100 frames of 1000x1000) into a scratch
   directory: how long ``ensure_inputs`` takes the first time on this machine.
2. What the cube workload needs (the first ``dim`` rows of every frame, loaded
   by ``load_rows``) vs the article's way, every file read whole with
   ``pd.read_parquet``. Target: 5x faster or better. Interleaved rounds, medians
   of wall and of CPU seconds: when other processes share the machine, wall
   time is stretched by descheduling and the CPU-seconds ratio is the fairer one.
3. The article's Table 2: ``pd.read_csv`` vs ``pd.read_parquet`` on the same
   frames (same seed, so the same values), whole files. The article saw 3.2x.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from _common import (
    add_input_args,
    input_spec,
    machine_line,
    median,
    print_table,
    timed,
    wall_and_cpu,
)

from workloads.inputs import InputSpec, ensure_inputs, frame_paths, load_frames, load_rows


def read_all_with_pandas(paths: list[Path], fmt: str) -> None:
    import pandas as pd

    read = pd.read_csv if fmt == "csv" else pd.read_parquet
    for path in paths:
        read(path)


def compare(
    contenders: dict[str, Callable[[], object]], rounds: int
) -> dict[str, tuple[float, float]]:
    """Median (wall s, CPU s) of each contender over ``rounds`` interleaved rounds."""
    seen: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            seen[name].append(wall_and_cpu(fn))
    return {
        name: (median([w for w, _ in v]), median([c for _, c in v])) for name, v in seen.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_input_args(ap)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (median)")
    ap.add_argument("--csv-frames", type=int, default=20, help="frames in the CSV vs Parquet test")
    ap.add_argument("--skip-generate", action="store_true", help="skip timing a fresh generation")
    ap.add_argument(
        "--cache", default=None, help="inputs cache (default: $CLOUDPROF_CACHE or ~/.cache)"
    )
    args = ap.parse_args()
    print(f"machine: {machine_line()}")
    spec = input_spec(args)

    if not args.skip_generate:
        scratch = Path(tempfile.mkdtemp(prefix="cloudprof-bench-"))
        try:
            (gen_s,) = timed(lambda: ensure_inputs(spec, scratch))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        mb = spec.nbytes / 1e6
        print(
            f"\ngenerating {spec.frames} frames of {spec.rows}x{spec.cols} ({mb:.0f} MB of "
            f"float64, Parquet): {gen_s:.2f} s"
        )

    directory = ensure_inputs(spec, args.cache)
    paths = list(frame_paths(directory))
    print(f"inputs: {directory}")

    def load_ours() -> None:
        load_rows(directory, args.dim, layout="columns")

    def load_ours_pyarrow() -> None:
        load_rows(directory, args.dim, layout="columns", index=False)

    def load_pandas() -> None:
        read_all_with_pandas(paths, "parquet")

    def load_arrow() -> None:
        load_frames(directory)

    figures = compare(
        {
            "ours": load_ours,
            "ours-pyarrow": load_ours_pyarrow,
            "pandas": load_pandas,
            "arrow": load_arrow,
        },
        args.rounds,
    )
    base = figures["pandas"]
    print_table(
        ["what", "reads", "wall s", "CPU s", "files/s", "vs pandas (wall)", "vs pandas (CPU)"],
        [
            [name, reads, w, c, len(paths) / w, f"{base[0] / w:.1f}x", f"{base[1] / c:.1f}x"]
            for name, reads, (w, c) in (
                ("load_rows (ours)", f"first {args.dim} rows", figures["ours"]),
                ("load_rows, index=False", f"first {args.dim} rows", figures["ours-pyarrow"]),
                ("pd.read_parquet", "whole files", base),
                ("load_frames (ours)", "whole files", figures["arrow"]),
            )
        ],
        title=f"loading the cube inputs ({len(paths)} frames; medians of {args.rounds} "
        "interleaved rounds)",
    )

    n = min(args.csv_frames, spec.frames)
    csv_dir = ensure_inputs(
        InputSpec(frames=n, rows=args.rows, cols=args.cols, seed=args.seed, fmt="csv"), args.cache
    )
    csv_paths, pq_paths = list(frame_paths(csv_dir)), paths[:n]
    csv = compare(
        {
            "csv": lambda: read_all_with_pandas(csv_paths, "csv"),
            "parquet": lambda: read_all_with_pandas(pq_paths, "parquet"),
        },
        args.rounds,
    )
    (csv_s, csv_cpu), (pq_s, pq_cpu) = csv["csv"], csv["parquet"]
    csv_mb = sum(p.stat().st_size for p in csv_paths) / n / 1e6
    pq_mb = sum(p.stat().st_size for p in pq_paths) / n / 1e6
    print_table(
        [
            "format",
            "MB/file",
            "wall s",
            "CPU s",
            "files/s",
            "article files/s",
            "speed-up (wall)",
            "speed-up (CPU)",
        ],
        [
            ["CSV (pd.read_csv)", csv_mb, csv_s, csv_cpu, n / csv_s, 4.79, "1.0x", "1.0x"],
            [
                "Parquet (pd.read_parquet)",
                pq_mb,
                pq_s,
                pq_cpu,
                n / pq_s,
                15.21,
                f"{csv_s / pq_s:.1f}x",
                f"{csv_cpu / pq_cpu:.1f}x",
            ],
        ],
        title=f"the article's Table 2: {n} whole frames (article: 3.2x)",
    )


if __name__ == "__main__":
    main()
