"""A batch scoring job on a multiprocessing pool: the shape of many nightly jobs.

It makes ``--records`` synthetic text records (phase ``generate``), scores them
in batches of ``--batch`` on a pool of ``--workers`` processes (phase ``score``;
each worker is a fresh interpreter that imports numpy itself, so a trial
measures a process tree, not one process), then merges the scores (phase
``merge``). It reports no units: each trial is one complete run (a fixed-work
job), and the report gives its time to complete and cost per run.

The work is in functions of their own (``make_records``, ``score_batch``,
``score_record``, ``merge_scores``), so a CPU or memory profile names them.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import random
import zlib

import numpy as np

WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
         "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon", "phi",
         "chi", "psi", "omega")
DIM = 256  # hashed features per record
_weights: np.ndarray | None = None  # each worker's copy, made once by init_worker


def phase(name: str) -> None:
    print(f"cloudprof:phase {name}", flush=True)


def make_records(count: int, seed: int) -> list[str]:
    """Synthetic records of 10 to 40 words, the same for a given seed."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(10, 40))) + f" id{i}"
            for i in range(count)]


def init_worker(seed: int) -> None:
    """Runs once in each worker process: the model's weights, as a real scorer loads them."""
    global _weights
    _weights = np.random.default_rng(seed).standard_normal(DIM)


def score_record(text: str, weights: np.ndarray) -> float:
    """Hash each word (and each pair of words) into a feature vector; score it linearly."""
    features = np.zeros(DIM)
    words = text.split()
    for word in words:
        features[zlib.crc32(word.encode()) % DIM] += 1.0
    for left, right in itertools.pairwise(words):
        features[zlib.crc32(f"{left} {right}".encode()) % DIM] += 0.5
    return float(features @ weights) / max(len(words), 1)


def score_batch(batch: list[str]) -> np.ndarray:
    assert _weights is not None, "init_worker did not run"
    return np.array([score_record(text, _weights) for text in batch])


def merge_scores(parts: list[np.ndarray]) -> dict[str, float]:
    scores = np.concatenate(parts)
    return {"records": float(scores.size), "mean": float(scores.mean()),
            "p99": float(np.percentile(scores, 99))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=1_000)
    p.add_argument("--workers", type=int, default=int(os.environ.get("CLOUDPROF_WORKERS", "1")))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    phase("generate")
    records = make_records(args.records, args.seed)
    batches = [records[i:i + args.batch] for i in range(0, len(records), args.batch)]
    phase("score")
    # spawn: every worker a fresh interpreter (as on macOS and Windows), whatever the default
    context = multiprocessing.get_context("spawn")
    with context.Pool(args.workers, initializer=init_worker, initargs=(args.seed,)) as pool:
        parts = pool.map(score_batch, batches, chunksize=1)
    phase("merge")
    summary = merge_scores(parts)
    print(f"scored {summary['records']:.0f} records in {len(batches)} batches on "
          f"{args.workers} processes: mean {summary['mean']:.4f}, p99 {summary['p99']:.4f}")


if __name__ == "__main__":
    main()
