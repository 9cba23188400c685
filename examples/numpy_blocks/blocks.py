"""A numpy job that reports its own units: megapixels of an image smoothed per second.

It makes a ``--size`` x ``--size`` image (phase ``prepare``), then ``--workers``
threads take ``--block``-pixel tiles from it in turn and smooth each one
(``smooth_block``: a few passes of a 5-point stencil, numpy slicing, which
releases the GIL) and summarise it (``summarise_block``), printing
``cloudprof:units <megapixels>`` after every tile (phase ``blocks``). The units
make it a throughput job: the report shows megapixels/s per worker count, and
tiles of any size compare. It runs until the sweep's ``--duration`` stops it,
or until ``--tiles`` tiles are done.

BLAS and OpenMP are held to one thread each, so the worker count is the only
parallelism.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import threading

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402 - after the thread caps, which numpy reads once at import

_print_lock = threading.Lock()


def say(line: str) -> None:
    with _print_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def make_image(size: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((size, size))


def smooth_block(block: np.ndarray, passes: int) -> np.ndarray:
    """``passes`` rounds of out = (4 x centre + the 4 neighbours) / 8, edges kept."""
    out = block.copy()
    scratch = np.empty_like(out)
    for _ in range(passes):
        scratch[:] = out
        inner = scratch[1:-1, 1:-1] * 4.0
        inner += scratch[:-2, 1:-1]
        inner += scratch[2:, 1:-1]
        inner += scratch[1:-1, :-2]
        inner += scratch[1:-1, 2:]
        out[1:-1, 1:-1] = inner / 8.0
    return out


def summarise_block(block: np.ndarray) -> tuple[float, float]:
    return float(block.mean()), float(np.percentile(block, 99))


class Tiles:
    """The tiles of the image, handed out in turn, round and round (thread-safe)."""

    def __init__(self, image: np.ndarray, block: int, limit: int | None) -> None:
        edge = image.shape[0] - image.shape[0] % block
        self.image, self.block = image, block
        self.corners = itertools.cycle(itertools.product(range(0, edge, block), repeat=2))
        self.left = limit
        self.lock = threading.Lock()

    def next(self) -> np.ndarray | None:
        with self.lock:
            if self.left is not None:
                if self.left <= 0:
                    return None
                self.left -= 1
            row, col = next(self.corners)
        return self.image[row:row + self.block, col:col + self.block]


def process_tiles(tiles: Tiles, passes: int) -> None:
    """One worker: smooth and summarise tiles until none are left, reporting each one."""
    while (tile := tiles.next()) is not None:
        summarise_block(smooth_block(tile, passes))
        say(f"cloudprof:units {tile.size / 1e6:.6f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=4096, help="image edge in pixels")
    p.add_argument("--block", type=int, default=256, help="tile edge in pixels")
    p.add_argument("--passes", type=int, default=8, help="smoothing passes per tile")
    p.add_argument("--tiles", type=int, help="stop after this many tiles (default: never)")
    p.add_argument("--workers", type=int, default=int(os.environ.get("CLOUDPROF_WORKERS", "1")))
    args = p.parse_args()
    if not 3 <= args.block <= args.size:
        p.error("--block must be between 3 and --size")
    say("cloudprof:unit megapixel")
    say("cloudprof:phase prepare")
    image = make_image(args.size, seed=0)
    tiles = Tiles(image, args.block, args.tiles)
    say("cloudprof:phase blocks")
    threads = [threading.Thread(target=process_tiles, args=(tiles, args.passes),
                                name=f"tiles-{i}") for i in range(args.workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()
