"""The speed-cubing workload: random sub-cubes of N frames, as fast as the hardware allows.

A cube (the article's definition) is, for every frame, its first ``dim`` rows
and ``dim`` randomly chosen columns (a fresh sample without replacement per
cube), stacked into shape (frames, dim, dim): ``cube[f, r, c]`` is frame ``f``,
row ``r``, column ``cols[c]``. How it is laid out in memory is the strategy's
business (see ``workloads.cube_strategies``); what a consumer receives always
equals :func:`reference_cube`.

Every cube is handed to a consumer, ``consumer(cube, cols)``: on the worker
thread that built it, except with the ``threads`` strategy (the article's
``ThreadPool``), whose pool threads only build cubes and whose caller's thread
consumes them. A cube is valid until the consumer returns; a consumer that keeps
it (or a view of it) says so by returning :data:`KEEP`, and its memory is then
never written to again. Ownership is declared, never guessed from reference
counts (see ``workloads.cube_strategies``).

What one unit is depends on the consumer (the ``consumer`` parameter), because
what the consumer needs changes the rate: ``view`` (default) reads a few values
of the cube as the strategy delivers it (``fast``: a strided view of its buffer;
the others: a fresh array); ``contiguous`` makes a C-contiguous
copy first, as torch or a GAN input pipeline needs; ``keep`` keeps the last two
cubes of every thread.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from multiprocessing.pool import ThreadPool
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workloads.base import UnitCounter, Workload, WorkloadInputError, run_threads
from workloads.cube_strategies import STRATEGIES, Strategy
from workloads.inputs import FORMATS, InputSpec, ensure_inputs

if TYPE_CHECKING:
    import numpy as np

Consumer = Callable[["np.ndarray", "np.ndarray"], Any]
"""``consumer(cube, cols)``: called once per cube; returns :data:`KEEP` if it keeps the cube."""


class _Keep:
    def __repr__(self) -> str:
        return "KEEP"


KEEP: Any = _Keep()
"""What a consumer returns to keep the cube it was given: its memory is never reused.

Anything else (``None``) lets the worker build its next cube into the same memory.
"""

_COLUMN_STREAM = 0xC0BE
"""Mixed into the seed of the column samplers so they never share a stream with the inputs."""


def reference_cube(frames: np.ndarray, cols: Any) -> np.ndarray:
    """The article's definition, written as plainly as possible, for checking the strategies.

    ``frames`` is (frames, rows, cols) — at least ``len(cols)`` rows of every frame.
    """
    import numpy as np

    cols = list(cols)
    dim = len(cols)
    layers = []
    for f in range(frames.shape[0]):
        layer = np.empty((dim, dim))
        for r in range(dim):
            for c, col in enumerate(cols):
                layer[r, c] = frames[f, r, col]
        layers.append(layer)
    return np.stack(layers)


class Checksum:
    """The default consumer: touches a few elements of every cube, so its values are used.

    Deliberately cheap (2 × frames reads): the point is to measure cube
    production, not a consumer.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0.0
        self.cubes = 0

    delivered: str | None = None  # None: as the strategy delivers it (Strategy.delivers)

    def __call__(self, cube: np.ndarray, cols: np.ndarray) -> Any:
        self.add(cube)
        return None

    def add(self, cube: np.ndarray) -> None:
        s = float(cube[:, 0, 0].sum() + cube[:, -1, -1].sum())
        with self._lock:
            self.value += s
            self.cubes += 1


class ContiguousChecksum(Checksum):
    """A consumer that needs a C-contiguous cube (torch, a GAN input pipeline): copy, then sum.

    ``np.ascontiguousarray`` copies a strided view into a fresh array, as
    ``torch.Tensor.contiguous()`` does; a cube already C-contiguous is not copied.
    """

    delivered = "a C-contiguous array"

    def __call__(self, cube: np.ndarray, cols: np.ndarray) -> Any:
        import numpy as np

        self.add(np.ascontiguousarray(cube))
        return None


class KeepLastTwo(Checksum):
    """A consumer that keeps the last two cubes of every thread (a double-buffered pipeline)."""

    delivered = "an array kept (the last two per thread)"

    def __init__(self) -> None:
        super().__init__()
        self._mine = threading.local()

    def __call__(self, cube: np.ndarray, cols: np.ndarray) -> Any:
        self.add(cube)
        kept = getattr(self._mine, "cubes", None)
        if kept is None:
            kept = self._mine.cubes = collections.deque(maxlen=2)
        kept.append(cube)
        return KEEP


CONSUMERS: dict[str, type[Checksum]] = {
    "view": Checksum,
    "contiguous": ContiguousChecksum,
    "keep": KeepLastTwo,
}


def _int_param(params: dict[str, Any], name: str, default: int, minimum: int) -> int:
    raw = params.pop(name, default)
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise WorkloadInputError(f"cube: {name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise WorkloadInputError(f"cube: {name} must be at least {minimum}, got {value}")
    return value


class CubeWorkload(Workload):
    """Parameters (strings from the command line are accepted):

    frames, rows, cols, seed, format — the generated inputs (default: the article's
    100 frames of 1000×1000, Parquet); dim — cube side (100); strategy — one of
    ``naive``, ``dataframes``, ``numpy``, ``threads``, ``fast`` (default); consumer —
    what is done with every cube: ``view`` (default), ``contiguous``, ``keep`` (see
    the module's docstring); inputs —
    a directory of frames to use instead of generated ones (default: generated
    once into the cache, see ``workloads.inputs.ensure_inputs``).
    """

    name = "cube"
    preload = ("numpy", "pyarrow", "pyarrow.parquet")
    unit = "cube"

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        p = dict(params)
        self.dim = _int_param(p, "dim", 100, 1)
        self.seed = _int_param(p, "seed", 0, 0)
        fmt = str(p.pop("format", "parquet"))
        if fmt not in FORMATS:
            raise WorkloadInputError(
                f"cube: format must be one of {', '.join(FORMATS)}, got {fmt!r}"
            )
        self.spec = InputSpec(
            frames=_int_param(p, "frames", 100, 1),
            rows=_int_param(p, "rows", 1000, 1),
            cols=_int_param(p, "cols", 1000, 1),
            seed=self.seed,
            fmt=fmt,
        )
        strategy = str(p.pop("strategy", "fast"))
        if strategy not in STRATEGIES:
            known = ", ".join(STRATEGIES)
            raise WorkloadInputError(f"cube: unknown strategy {strategy!r}: use one of {known}")
        self.strategy_name = strategy
        consumer = str(p.pop("consumer", "view"))
        if consumer not in CONSUMERS:
            known = ", ".join(CONSUMERS)
            raise WorkloadInputError(f"cube: unknown consumer {consumer!r}: use one of {known}")
        self.consumer_name = consumer
        inputs = p.pop("inputs", None)
        self.inputs_dir: Path | None = Path(inputs).expanduser() if inputs else None
        self.cache_dir = p.pop("cache", None)
        if p:
            known = "frames, rows, cols, dim, seed, format, strategy, consumer, inputs, cache"
            raise WorkloadInputError(f"cube: unknown parameter(s) {', '.join(sorted(p))} ({known})")
        if self.inputs_dir is None:
            for axis in ("rows", "cols"):
                if self.dim > getattr(self.spec, axis):
                    raise WorkloadInputError(
                        f"cube: dim {self.dim} exceeds {axis} {getattr(self.spec, axis)}"
                    )
        self.strategy: Strategy | None = None

    # ------------------------------------------------------------ preparation

    def prepare(self) -> None:
        directory = self.inputs_dir or ensure_inputs(self.spec, self.cache_dir)
        strategy = STRATEGIES[self.strategy_name](directory, self.dim)
        strategy.load()
        for axis, size in (("rows", strategy.rows), ("columns", strategy.cols)):
            if size is not None and self.dim > size:
                raise WorkloadInputError(
                    f"cube: dim {self.dim} exceeds the {size} {axis} of {directory}"
                )
        self.directory, self.strategy = directory, strategy

    def describe(self) -> dict[str, Any]:
        s = self.strategy
        out: dict[str, Any] = {
            "strategy": self.strategy_name,
            "consumer": self.consumer_name,
            "dim": self.dim,
            "seed": self.seed,
            "inputs": str(self.inputs_dir) if self.inputs_dir else None,
            "input_spec": None if self.inputs_dir else self.spec.to_dict(),
            "input_spec_hash": None if self.inputs_dir else self.spec.hash,
        }
        if s is not None:
            out.update(
                inputs_dir=str(self.directory),
                frames=s.frames,
                cube_shape=[s.frames, self.dim, self.dim],
                cube_bytes=s.frames * self.dim * self.dim * 8,
                resident_input_bytes=s.resident_bytes,
                unit_detail=self.unit_detail(),
            )
        return out

    def bytes_per_unit(self) -> int | None:
        """A cube's float64 values: each is read from a frame and written once, at least."""
        s = self.strategy
        return None if s is None else s.frames * self.dim * self.dim * 8

    def unit_detail(self) -> str:
        """ "one cube of 100×100×100 float64 (8 MB) delivered as a strided view": one unit."""
        s = self._ready()
        nbytes = s.frames * self.dim * self.dim * 8
        delivered = CONSUMERS[self.consumer_name].delivered or s.delivers
        return (
            f"one cube of {s.frames}×{self.dim}×{self.dim} float64 ({nbytes / 1e6:.3g} MB) "
            f"delivered as {delivered}"
        )

    def _ready(self) -> Strategy:
        if self.strategy is None:
            self.prepare()
        assert self.strategy is not None
        return self.strategy

    # ---------------------------------------------------------------- running

    def column_sampler(self, worker: int) -> Callable[[], np.ndarray]:
        """Worker ``worker``'s stream of column samples: reproducible, independent per worker."""
        import numpy as np

        ncols, dim = self._ready().cols, self.dim
        seq = np.random.SeedSequence([self.seed, _COLUMN_STREAM], spawn_key=(worker,))
        rng = np.random.Generator(np.random.PCG64(seq))
        return lambda: rng.choice(ncols, dim, replace=False)

    def run(
        self,
        workers: int,
        stop: threading.Event,
        counter: UnitCounter,
        consumer: Consumer | None = None,
        limit: int | None = None,
    ) -> None:
        """Build cubes on ``workers`` threads until ``stop`` is set or ``limit`` cubes are done."""
        if workers < 1:
            raise WorkloadInputError(f"cube: workers must be at least 1, got {workers}")
        strategy = self._ready()
        consumer = consumer or CONSUMERS[self.consumer_name]()
        if strategy.name == "threads":
            self._run_thread_pool(strategy, workers, stop, counter, consumer, limit)
        else:
            self._run_workers(strategy, workers, stop, counter, consumer, limit)

    def produce(self, n: int, workers: int = 1, consumer: Consumer | None = None) -> int:
        """Build exactly ``n`` cubes (for tests and benchmarks); returns the count."""
        counter = UnitCounter()
        self.run(workers, threading.Event(), counter, consumer, limit=n)
        return counter.value

    def _run_workers(
        self,
        strategy: Strategy,
        workers: int,
        stop: threading.Event,
        counter: UnitCounter,
        consumer: Consumer,
        limit: int | None,
    ) -> None:
        """Our pool: each thread samples, builds into its own buffers, consumes, repeats."""
        tickets = _Tickets(limit)

        def work(index: int) -> None:
            sample, make = self.column_sampler(index), strategy.maker()
            while not stop.is_set() and tickets.take():
                cols = sample()
                if consumer(make(cols), cols) is KEEP:
                    make.keep()
                counter.add()

        run_threads(workers, work, stop=stop, name="cube-worker")

    def _run_thread_pool(
        self,
        strategy: Strategy,
        workers: int,
        stop: threading.Event,
        counter: UnitCounter,
        consumer: Consumer,
        limit: int | None,
    ) -> None:
        """The article's step 3: ``ThreadPool.imap_unordered``, cubes retrieved by the caller.

        The pool's threads build the cubes; the consumer runs on the caller's
        thread, as in the article, so consuming is serialised. Every cube is a
        fresh array (the ``numpy`` kernel), so a consumer may keep any. Tasks
        are submitted in batches (the article's batches were 100 cubes) so that
        a stop request is honoured within one batch.
        """
        make, sample = strategy.maker(), self.column_sampler(0)
        batch = 2 * workers
        with ThreadPool(processes=workers) as pool:
            while not stop.is_set():
                n = batch if limit is None else min(batch, limit - counter.value)
                if n <= 0:
                    break
                tasks = [sample() for _ in range(n)]
                for cube, cols in pool.imap_unordered(lambda c: (make(c), c), tasks):
                    consumer(cube, cols)
                    counter.add()


class _Tickets:
    """Shares a cube budget among worker threads; unlimited when ``limit`` is None."""

    def __init__(self, limit: int | None) -> None:
        self._left = limit
        self._lock = threading.Lock()

    def take(self) -> bool:
        if self._left is None:
            return True
        with self._lock:
            if self._left <= 0:
                return False
            self._left -= 1
            return True
