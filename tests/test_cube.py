"""The cube workload: strategies vs the reference, buffer safety, run-until-stop, params."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from workloads.base import UnitCounter, WorkloadInputError, load_workload
from workloads.cube import CONSUMERS, KEEP, Checksum, CubeWorkload, reference_cube
from workloads.cube_strategies import STRATEGIES
from workloads.inputs import InputSpec, ensure_inputs, load_frames

SMALL = {"frames": "6", "rows": "40", "cols": "50", "dim": "10"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cube-cache")


def _workload(cache: Path, **params: str) -> CubeWorkload:
    return CubeWorkload(**{**SMALL, "cache": str(cache), **params})


def _frames(cache: Path, seed: int = 0) -> np.ndarray:
    return load_frames(ensure_inputs(InputSpec(frames=6, rows=40, cols=50, seed=seed), cache))


class Keeper:
    """A consumer that keeps every cube it receives (no copy) with its columns, and says so."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.kept: list[tuple[np.ndarray, np.ndarray]] = []

    def __call__(self, cube: np.ndarray, cols: np.ndarray) -> object:
        with self.lock:
            self.kept.append((cube, cols))
        return KEEP


def test_reference_cube_is_the_articles_definition() -> None:
    frames = np.arange(2 * 4 * 5, dtype=float).reshape(2, 4, 5)
    cube = reference_cube(frames, [4, 0])
    assert cube.shape == (2, 2, 2)
    assert cube[1, 0, 0] == frames[1, 0, 4] and cube[0, 1, 1] == frames[0, 1, 0]


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_every_strategy_matches_the_reference(cache: Path, strategy: str, seed: int) -> None:
    work = _workload(cache, strategy=strategy, seed=str(seed))
    keeper = Keeper()
    assert work.produce(4, workers=1, consumer=keeper) == 4
    frames = _frames(cache, seed)
    assert len(keeper.kept) == 4
    for cube, cols in keeper.kept:
        assert cube.shape == (6, 10, 10)
        assert len(set(cols.tolist())) == 10 and cols.min() >= 0 and cols.max() < 50
        assert np.array_equal(cube, reference_cube(frames, cols))
    # A fresh sample per cube.
    assert len({tuple(cols) for _, cols in keeper.kept}) == 4


def test_column_samples_are_reproducible_per_seed(cache: Path) -> None:
    def columns(seed: str) -> list[tuple[int, ...]]:
        keeper = Keeper()
        _workload(cache, seed=seed).produce(5, consumer=keeper)
        return [tuple(cols) for _, cols in keeper.kept]

    assert columns("1") == columns("1") != columns("2")


@pytest.mark.parametrize("strategy", ["fast", "threads", "numpy"])
def test_kept_cubes_are_never_overwritten_with_two_workers(cache: Path, strategy: str) -> None:
    work = _workload(cache, strategy=strategy)
    keeper = Keeper()
    assert work.produce(40, workers=2, consumer=keeper) == 40
    frames = _frames(cache)
    for cube, cols in keeper.kept:
        assert np.array_equal(cube, reference_cube(frames, cols))
    addresses = {cube.__array_interface__["data"][0] for cube, _ in keeper.kept}
    assert len(addresses) == 40


def test_fast_reuses_a_buffer_nobody_kept(cache: Path) -> None:
    work = _workload(cache)
    addresses: set[int] = set()
    kept: list[tuple[np.ndarray, np.ndarray]] = []
    lock = threading.Lock()
    seen = [0]

    def keep_every_third(cube: np.ndarray, cols: np.ndarray) -> None:
        with lock:
            addresses.add(cube.__array_interface__["data"][0])
            seen[0] += 1
            if seen[0] % 3 == 0:
                kept.append((cube, cols))
                return KEEP
            return None

    work.produce(30, workers=2, consumer=keep_every_third)
    # One buffer per worker, plus one fresh buffer per kept cube.
    assert len(addresses) <= 2 + len(kept)
    frames = _frames(cache)
    assert len(kept) == 10
    for cube, cols in kept:
        assert np.array_equal(cube, reference_cube(frames, cols))


def test_fast_without_keeping_allocates_one_buffer_per_worker(cache: Path) -> None:
    work = _workload(cache)
    addresses: set[int] = set()
    work.produce(
        50, workers=2, consumer=lambda c, _: addresses.add(c.__array_interface__["data"][0])
    )
    assert 1 <= len(addresses) <= 2


def test_a_kept_cube_is_never_overwritten_when_reference_counts_miss_the_consumers_hold(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CPython 3.14 borrows references on the interpreter stack (gh-130704), so a count
    can miss a holder. Here every count says "nobody else": the declared ``KEEP`` still
    protects each cube (a rule built on ``sys.getrefcount`` overwrote them)."""
    import sys

    monkeypatch.setattr(sys, "getrefcount", lambda obj: 1)
    work = _workload(cache)
    keeper = Keeper()
    work.produce(12, workers=1, consumer=keeper)
    monkeypatch.undo()
    frames = _frames(cache)
    for cube, cols in keeper.kept:
        assert np.array_equal(cube, reference_cube(frames, cols))
    assert len({c.__array_interface__["data"][0] for c, _ in keeper.kept}) == 12


def test_buffer_reuse_does_not_depend_on_reference_counts(cache: Path) -> None:
    """Holding a cube without declaring it gets no new buffer: ownership is declared."""
    work = _workload(cache)
    work.prepare()
    assert work.strategy is not None
    held: list[np.ndarray] = []
    make = work.strategy.maker()
    sample = work.column_sampler(0)
    for _ in range(5):
        held.append(make(sample()))  # referenced, not declared kept
    assert make.buffers == 1
    assert len({c.__array_interface__["data"][0] for c in held}) == 1
    make.keep()
    make(sample())
    assert make.buffers == 2


@pytest.mark.parametrize("strategy", ["fast", "numpy", "threads"])
def test_the_keep_consumer_keeps_two_intact_cubes_per_thread(cache: Path, strategy: str) -> None:
    work = _workload(cache, strategy=strategy, consumer="keep")
    consumer = CONSUMERS["keep"]()
    seen: list[tuple[np.ndarray, np.ndarray]] = []
    real = consumer.__call__

    def spy(cube: np.ndarray, cols: np.ndarray) -> object:
        seen.append((cube, cols))
        return real(cube, cols)

    assert work.produce(9, workers=1, consumer=spy) == 9
    frames = _frames(cache)
    for cube, cols in seen:  # every cube given to it, kept or since dropped, is intact
        assert np.array_equal(cube, reference_cube(frames, cols))
    assert consumer.cubes == 9


def test_the_keep_consumer_holds_exactly_the_last_two_cubes_of_its_thread() -> None:
    keep = CONSUMERS["keep"]()
    cubes = [np.full((2, 2, 2), float(i)) for i in range(4)]
    assert all(keep(c, np.arange(2)) is KEEP for c in cubes)
    assert [c[0, 0, 0] for c in keep._mine.cubes] == [2.0, 3.0]
    other: list[int] = []
    t = threading.Thread(target=lambda: (keep(cubes[0], np.arange(2)),
                                         other.append(len(keep._mine.cubes))))
    t.start()
    t.join()
    assert other == [1] and len(keep._mine.cubes) == 2  # one list per thread


@pytest.mark.parametrize("consumer", ["view", "contiguous", "keep"])
def test_every_consumer_sums_the_same_cubes(cache: Path, consumer: str) -> None:
    checksums = {}
    for name in ("view", consumer):
        c = CONSUMERS[name]()
        _workload(cache, seed="3").produce(6, workers=1, consumer=c)
        checksums[name] = (c.cubes, round(c.value, 9))
    assert checksums[consumer] == checksums["view"] and checksums["view"][0] == 6


def test_the_contiguous_consumer_receives_a_c_contiguous_copy(cache: Path) -> None:
    work = _workload(cache, consumer="contiguous")
    got: list[bool] = []

    class Spy(CONSUMERS["contiguous"]):  # type: ignore[misc,valid-type]
        def add(self, cube: np.ndarray) -> None:
            got.append(bool(cube.flags.c_contiguous))
            super().add(cube)

    work.produce(3, consumer=Spy())
    assert got == [True, True, True]
    views: list[bool] = []
    work.produce(3, consumer=lambda c, _: views.append(bool(c.flags.c_contiguous)))
    assert views == [False, False, False]  # what the fast kernel delivers is a strided view


@pytest.mark.parametrize(
    ("strategy", "on_caller"), [("fast", False), ("numpy", False), ("threads", True)]
)
def test_the_consumer_runs_on_the_worker_thread_except_in_the_articles_thread_pool(
    cache: Path, strategy: str, on_caller: bool
) -> None:
    names: set[str] = set()
    _workload(cache, strategy=strategy).produce(
        12, workers=2, consumer=lambda c, _: names.add(threading.current_thread().name)
    )
    caller = threading.current_thread().name
    assert (names == {caller}) is on_caller
    if not on_caller:
        assert names and all(n.startswith("cube-worker") for n in names)


@pytest.mark.parametrize(
    ("consumer", "delivered"),
    [("view", "a strided view"), ("contiguous", "a C-contiguous array"), ("keep", "kept")],
)
def test_what_one_unit_delivered_is_recorded(cache: Path, consumer: str, delivered: str) -> None:
    work = _workload(cache, consumer=consumer)
    work.prepare()
    info = work.describe()
    assert info["consumer"] == consumer
    assert info["unit_detail"].startswith("one cube of 6×10×10 float64 (0.0048 MB) delivered as ")
    assert delivered in info["unit_detail"]
    numpy = _workload(cache, strategy="numpy")
    numpy.prepare()
    assert numpy.describe()["unit_detail"].endswith("delivered as a fresh array")


@pytest.mark.parametrize("strategy", ["fast", "threads"])
def test_run_until_stop_counts_units(cache: Path, strategy: str) -> None:
    work = _workload(cache, strategy=strategy)
    work.prepare()
    stop, counter, checksum = threading.Event(), UnitCounter(), Checksum()
    runner = threading.Thread(target=work.run, args=(2, stop, counter, checksum))
    runner.start()
    time.sleep(0.3)
    stop.set()
    runner.join(timeout=10)
    assert not runner.is_alive()
    assert counter.value > 0
    assert checksum.cubes == counter.value
    assert checksum.value > 0.0  # uniform values in [0, 1): a positive sum


def test_a_failing_consumer_stops_all_workers_and_raises(cache: Path) -> None:
    work = _workload(cache)

    def fails(cube: np.ndarray, cols: np.ndarray) -> None:
        raise RuntimeError("consumer broke")

    with pytest.raises(RuntimeError, match="consumer broke"):
        work.run(2, threading.Event(), UnitCounter(), fails)


def test_every_worker_runs_before_the_first_cube_is_built(cache: Path) -> None:
    """With many workers, none starts building while others are still being started.

    ``Thread.start()`` waits for the new thread to get the GIL; started one by one
    between busy workers, a 64-worker trial used to spend seconds with a fraction of
    its workers. The first cube now sees them all alive.
    """
    workers = 48
    alive_at_first_cube: list[int] = []
    names = lambda: sum(t.name.startswith("cube-worker") for t in threading.enumerate())  # noqa: E731

    def consumer(cube: np.ndarray, cols: np.ndarray) -> None:
        if not alive_at_first_cube:
            alive_at_first_cube.append(names())

    _workload(cache).run(workers, threading.Event(), UnitCounter(), consumer, limit=200)
    assert alive_at_first_cube == [workers]


def test_a_worker_that_cannot_be_started_stops_the_others(monkeypatch) -> None:
    from workloads.base import run_threads

    stop = threading.Event()
    real_start, calls = threading.Thread.start, []

    def start(self: threading.Thread) -> None:
        calls.append(self.name)
        if len(calls) == 3:
            raise RuntimeError("can't start new thread")
        real_start(self)

    def target(k: int) -> None:
        stop.wait(5)  # the two that started end only when told to stop

    monkeypatch.setattr(threading.Thread, "start", start)
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match="can't start new thread"):
        run_threads(4, target, stop=stop)
    assert stop.is_set() and time.perf_counter() - t0 < 2


def test_registered_and_reports_what_it_ran(cache: Path) -> None:
    assert load_workload("cube") is CubeWorkload
    work = _workload(cache)
    work.prepare()
    info = work.describe()
    assert info["strategy"] == "fast"
    assert info["cube_shape"] == [6, 10, 10]
    assert info["cube_bytes"] == 6 * 10 * 10 * 8
    assert Path(info["inputs_dir"]).name == InputSpec(frames=6, rows=40, cols=50).hash


def test_explicit_inputs_directory(cache: Path, tmp_path: Path) -> None:
    directory = ensure_inputs(InputSpec(frames=3, rows=12, cols=15, seed=5), tmp_path)
    work = CubeWorkload(inputs=str(directory), dim="12", seed="5")
    keeper = Keeper()
    work.produce(2, consumer=keeper)
    frames = load_frames(directory)
    for cube, cols in keeper.kept:
        assert cube.shape == (3, 12, 12)
        assert np.array_equal(cube, reference_cube(frames, cols))
    for strategy in STRATEGIES:
        with pytest.raises(WorkloadInputError, match="dim 13 exceeds the 12 rows"):
            CubeWorkload(inputs=str(directory), dim="13", strategy=strategy).prepare()
    with pytest.raises(WorkloadInputError, match="missing"):
        (directory / "frame_0001.parquet").unlink()
        CubeWorkload(inputs=str(directory), dim="5").prepare()


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"dim": "abc"}, "dim must be an integer"),
        ({"dim": "0"}, "dim must be at least 1"),
        ({"dim": "55", "rows": "60"}, "dim 55 exceeds cols 50"),
        ({"dim": "41", "cols": "60"}, "dim 41 exceeds rows 40"),
        ({"strategy": "gpu"}, "unknown strategy 'gpu'"),
        ({"consumer": "torch"}, "unknown consumer 'torch'"),
        ({"format": "xlsx"}, "format must be one of"),
        ({"colour": "blue"}, "unknown parameter(s) colour"),
        ({"frames": "-1"}, "frames must be at least 1"),
    ],
)
def test_bad_parameters_are_one_line_errors(cache: Path, params: dict, needle: str) -> None:
    with pytest.raises(WorkloadInputError) as excinfo:
        _workload(cache, **params)
    assert needle in str(excinfo.value) and "\n" not in str(excinfo.value)


def test_bad_worker_count(cache: Path) -> None:
    with pytest.raises(WorkloadInputError, match="workers must be at least 1"):
        _workload(cache).run(0, threading.Event(), UnitCounter())


@pytest.mark.parametrize("strategy", ["fast", "naive", "numpy"])
def test_csv_inputs_give_the_same_cubes(cache: Path, strategy: str) -> None:
    work = _workload(cache, strategy=strategy, format="csv", seed="2")
    keeper = Keeper()
    work.produce(3, consumer=keeper)
    frames = _frames(cache, seed=2)  # the Parquet copy: same seed, same values
    for cube, cols in keeper.kept:
        assert np.array_equal(cube, reference_cube(frames, cols))
