"""How a cube is built: the article's successive steps, and ours.

Each strategy loads what it needs once (``load``), then hands every worker
thread its own cube maker (``maker``): a callable from the sampled column
indices to the cube. Makers of a worker are never shared between threads, so
they may keep buffers.

The article's steps, for reproducing its table on your machine:

- ``naive``: re-read every file with pandas for every cube (its first attempt);
- ``dataframes``: a dict of DataFrames read once, ``head``/``iloc`` per cube;
- ``numpy``: one (frames, rows, cols) array, ``arr[:, :dim, cols]``;
- ``threads``: the ``numpy`` kernel in a ``multiprocessing.pool.ThreadPool``
  with ``imap_unordered`` (the worker pool itself differs; see ``CubeWorkload``).

Ours, ``fast``: keep only the first ``dim`` rows, stored as a C-contiguous
(cols, frames, dim) array, so one sampled column of all frames is a single
contiguous run of ``frames*dim`` doubles (80 KB by default). A cube is then
``dim`` large memcpys (``np.take(axis=0, out=buf)``) into a per-worker buffer,
and the consumer receives a transposed view of that buffer with the article's
shape and indexing. The article's ``numpy`` kernel instead gathers ``dim``
scattered doubles from each of ``frames*dim`` rows.
"""

from __future__ import annotations

import abc
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from workloads.base import WorkloadInputError
from workloads.inputs import frame_paths, load_frames, load_rows, read_frame_pandas

if TYPE_CHECKING:
    import numpy as np

CubeMaker = Callable[["np.ndarray"], "np.ndarray"]


class Strategy(abc.ABC):
    name: ClassVar[str]

    def __init__(self, directory: Path, dim: int) -> None:
        self.directory, self.dim = directory, dim
        self.frames = self.cols = 0
        self.rows: int | None = None  # None: not known, the loader checked ``dim`` itself

    @abc.abstractmethod
    def load(self) -> None:
        """Read what the strategy needs, once; set ``frames``, ``cols`` and ``rows``."""

    @abc.abstractmethod
    def maker(self) -> CubeMaker:
        """A cube maker for one worker thread."""

    @property
    def resident_bytes(self) -> int:
        """Bytes of input data the strategy keeps in memory."""
        return 0


class FastStrategy(Strategy):
    name = "fast"

    def load(self) -> None:
        rows = load_rows(self.directory, self.dim, layout="columns")
        # (frames, dim, cols) view of a C-contiguous (cols, frames, dim) array.
        self.src = rows.transpose(2, 0, 1)
        assert self.src.flags.c_contiguous
        self.cols, self.frames = self.src.shape[0], self.src.shape[1]

    @property
    def resident_bytes(self) -> int:
        return int(self.src.nbytes)

    def maker(self) -> CubeMaker:
        import numpy as np

        src, dim, frames = self.src, self.dim, self.frames
        holder: list[np.ndarray] = [np.empty((dim, frames, dim))]

        def make(cols: np.ndarray) -> np.ndarray:
            # References to the buffer: holder, ``buf`` and getrefcount's argument.
            # Any more means a consumer kept the previous cube (or a view of it):
            # leave that buffer to it and gather into a new one.
            buf = holder[0]
            if sys.getrefcount(buf) > 3:
                buf = holder[0] = np.empty((dim, frames, dim))
            # buf[k, f, r] = src[cols[k], f, r]; indices are validated by the sampler.
            np.take(src, cols, axis=0, out=buf, mode="clip")
            return buf.transpose(1, 2, 0)  # [f, r, k] = frame f, row r, column cols[k]

        return make


class NumpyStrategy(Strategy):
    """The article's step 2: one array of all frames, fancy indexing per cube."""

    name = "numpy"

    def load(self) -> None:
        self.arr = load_frames(self.directory)
        self.frames, self.rows, self.cols = self.arr.shape

    @property
    def resident_bytes(self) -> int:
        return int(self.arr.nbytes)

    def maker(self) -> CubeMaker:
        arr, dim = self.arr, self.dim

        def make(cols: np.ndarray) -> np.ndarray:
            return arr[:, :dim, cols]  # a fresh array every time

        return make


class ThreadsStrategy(NumpyStrategy):
    """The article's step 3: the ``numpy`` kernel run by a ``ThreadPool`` (see CubeWorkload)."""

    name = "threads"


class DataFramesStrategy(Strategy):
    """The article's step 1: a dict of DataFrames read once, ``head``/``iloc`` per cube."""

    name = "dataframes"

    def load(self) -> None:
        self.df_dict = {p.name: read_frame_pandas(p) for p in frame_paths(self.directory)}
        first = next(iter(self.df_dict.values()))
        self.frames, (self.rows, self.cols) = len(self.df_dict), first.shape

    @property
    def resident_bytes(self) -> int:
        return sum(int(df.memory_usage(index=False).sum()) for df in self.df_dict.values())

    def maker(self) -> CubeMaker:
        return lambda cols: _cube_from_frames(
            self.df_dict.values(), len(self.df_dict), self.dim, cols
        )


class NaiveStrategy(Strategy):
    """The article's first attempt: every file re-read with pandas for every cube."""

    name = "naive"

    def load(self) -> None:
        self.paths = frame_paths(self.directory)
        first = read_frame_pandas(self.paths[0])
        self.frames, (self.rows, self.cols) = len(self.paths), first.shape

    def maker(self) -> CubeMaker:
        def make(cols: np.ndarray) -> np.ndarray:
            frames = (read_frame_pandas(p) for p in self.paths)
            return _cube_from_frames(frames, len(self.paths), self.dim, cols)

        return make


def _cube_from_frames(frames: Iterable[Any], n: int, dim: int, cols: np.ndarray) -> np.ndarray:
    """The article's ``create_cube``: head, iloc, to_numpy, one layer per DataFrame."""
    import numpy as np

    cube = np.zeros((n, dim, dim))
    for i, df in enumerate(frames):
        layer = df.head(dim).iloc[:, cols].to_numpy()
        if layer.shape != (dim, dim):
            raise WorkloadInputError(
                f"cube: frame {i} gave a {layer.shape} layer, not {(dim, dim)}"
            )
        cube[i, :, :] = layer
    return cube


STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls
    for cls in (NaiveStrategy, DataFramesStrategy, NumpyStrategy, ThreadsStrategy, FastStrategy)
}
