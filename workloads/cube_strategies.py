"""How a cube is built: the article's successive steps, and ours.

Each strategy loads what it needs once (``load``), then hands every worker
thread its own cube maker (``maker``): a callable from the sampled column
indices to the cube. Makers of a worker are never shared between threads, so
they may keep buffers.

Who owns a cube is explicit, never guessed from reference counts (CPython 3.14
borrows references on the interpreter stack, gh-130704, so ``sys.getrefcount``
can make a kept cube look free): a cube is valid until the maker's next call,
unless the worker calls ``maker.keep()`` for it (because its consumer declared
that it keeps the cube); then the maker never writes to that cube's memory again.

The article's steps, for reproducing its table on your machine:

- ``naive``: re-read every file with pandas for every cube (its first attempt);
- ``dataframes``: a dict of DataFrames read once, ``head``/``iloc`` per cube;
- ``numpy``: one (frames, rows, cols) array, ``arr[:, :dim, cols]``;
- ``threads``: the ``numpy`` kernel in a ``multiprocessing.pool.ThreadPool``
  with ``imap_unordered``; the pool's threads build cubes and the caller's
  thread consumes them (see ``CubeWorkload``).

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
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from workloads.base import WorkloadInputError
from workloads.inputs import frame_paths, load_frames, load_rows, read_frame_pandas

if TYPE_CHECKING:
    import numpy as np



class CubeMaker:
    """Builds one worker's cubes; ``keep()`` hands the last cube's memory to the consumer.

    This base class suits strategies whose every cube is a fresh array: nothing
    is ever reused, so ``keep`` has nothing to do.
    """

    def __init__(self, make: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        self._make = make

    def __call__(self, cols: np.ndarray) -> np.ndarray:
        assert self._make is not None
        return self._make(cols)

    def keep(self) -> None:
        """The cube returned last belongs to its consumer now: never overwrite it."""


class BufferedMaker(CubeMaker):
    """``fast``'s maker: gathers every cube into one buffer, which it reuses.

    The buffer is reused unless ``keep()`` gave the last cube away, in which
    case the next cube goes into a new buffer. No reference counting: a view the
    consumer holds without declaring it (``keep``) sees the next cube.
    """

    def __init__(self, src: np.ndarray, dim: int) -> None:
        super().__init__()
        self.src, self.dim = src, dim
        self.frames = src.shape[1]
        self.buf: np.ndarray | None = None
        self.buffers = 0  # allocated so far (a test checks reuse)

    def __call__(self, cols: np.ndarray) -> np.ndarray:
        import numpy as np

        if self.buf is None:
            self.buf = np.empty((self.dim, self.frames, self.dim))
            self.buffers += 1
        # buf[k, f, r] = src[cols[k], f, r]; indices are validated by the sampler.
        np.take(self.src, cols, axis=0, out=self.buf, mode="clip")
        return self.buf.transpose(1, 2, 0)  # [f, r, k] = frame f, row r, column cols[k]

    def keep(self) -> None:
        self.buf = None


class Strategy(abc.ABC):
    name: ClassVar[str]
    delivers: ClassVar[str] = "a fresh array"  # what a cube is, as the report says it

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
    delivers = "a strided view"  # of the per-worker buffer

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
        return BufferedMaker(self.src, self.dim)


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

        return CubeMaker(make)


class ThreadsStrategy(NumpyStrategy):
    """The article's step 3: the ``numpy`` kernel run by a ``ThreadPool`` (see CubeWorkload).

    As in the article, the pool's threads only build cubes; ``imap_unordered``
    hands them to the caller's thread, which runs the consumer.
    """

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
        return CubeMaker(
            lambda cols: _cube_from_frames(self.df_dict.values(), len(self.df_dict), self.dim, cols)
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

        return CubeMaker(make)


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
