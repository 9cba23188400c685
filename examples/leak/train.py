"""A training loop with a memory leak, and its fix.

``--variant leaky`` keeps every batch in a list "for debugging" (the classic
leak: a growing list of batches); ``--variant fixed`` keeps only a running
loss. cloudprof's leak verdict flags the first and not the second. The loop
runs until the trial's ``--duration`` stops it; each batch is one unit.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", choices=("leaky", "fixed"), required=True)
    p.add_argument("--batch-mb", type=float, default=2.0)
    args = p.parse_args()
    rows = int(args.batch_mb * 2**20 / 8 / 64)
    rng = np.random.default_rng(int(os.environ.get("CLOUDPROF_REPEAT", "0")))
    weights = rng.standard_normal(64)
    seen: list[np.ndarray] = []
    running_loss = 0.0
    print("cloudprof:unit batch", flush=True)
    while True:
        batch = rng.standard_normal((rows, 64))
        loss = float(np.mean((batch @ weights) ** 2))
        running_loss = 0.9 * running_loss + 0.1 * loss
        if args.variant == "leaky":
            seen.append(batch)  # the leak: every batch stays alive
        print("cloudprof:units 1", flush=True)
        time.sleep(0.02)


if __name__ == "__main__":
    main()
