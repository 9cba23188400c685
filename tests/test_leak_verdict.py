"""The leak verdict under load: a ramp that levels off is not a leak; a leak has a probability."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from workloads import protocol
from workloads.memory import MB, end_slope, leak_test, line_slope

MIB = 1024 * 1024
T = [i / 10 for i in range(120)]  # 12 s at 10 Hz


def noisy(values, sd_mib=1.0, seed=0):
    rng = random.Random(seed)
    return [int(v + rng.gauss(0, sd_mib) * MIB) for v in values]


def test_steady_growth_to_the_end_is_a_leak_with_its_rate_inside_the_interval():
    leak = leak_test(T, noisy([200 * MIB + t * 30 * MIB for t in T]))
    assert leak["verdict"] == "leak" and leak["probability"] >= 0.95 and not leak["ramp"]
    lo, hi = leak["slope_ci_mb_per_s"]
    assert lo < 30 * MIB / MB < hi
    assert leak["end_slope_ci_mb_per_s"][0] > leak["leak_rate_mb_per_s"]


@pytest.mark.parametrize("plateau_at", [6.0, 8.0, 10.0])
def test_buffers_allocated_past_the_warm_up_then_reused_are_a_ramp_not_a_leak(plateau_at):
    # 160 workers on a loaded host: each allocates its buffers when it first runs,
    # so RSS climbs well past the warm-up quarter, then stays flat.
    rss = noisy([300 * MIB + min(t, plateau_at) * 40 * MIB for t in T], seed=int(plateau_at))
    leak = leak_test(T, rss)
    assert leak["verdict"] == "ok", leak
    assert leak["relative_growth"] > 0.10  # the old rule's growth alone would have said leak
    assert leak["probability"] <= 0.05
    assert leak["end_slope_ci_mb_per_s"][1] < leak["leak_rate_mb_per_s"]
    assert leak["bend_t"] == pytest.approx(plateau_at, abs=1.0)


def test_flat_memory_is_ok_with_zero_probability():
    leak = leak_test(T, noisy([500 * MIB] * len(T), sd_mib=3.0))
    assert leak["verdict"] == "ok" and leak["probability"] == 0.0 and not leak["ramp"]
    lo, hi = leak["slope_ci_mb_per_s"]
    assert lo < 0 < hi


def test_growth_right_at_the_leak_rate_is_mostly_inconclusive_not_a_guess():
    # 6 MiB/s on 500 MiB over the 9 s steady window is ~11 % growth, the threshold is 10 %:
    # with 8 MiB of noise the end's slope cannot be told from the leak rate.
    leaks = [
        leak_test(T, noisy([450 * MIB + t * 6.0 * MIB for t in T], sd_mib=8.0, seed=seed))
        for seed in range(10)
    ]
    unsure = [x for x in leaks if x["verdict"] == "inconclusive"]
    assert len(unsure) >= 5
    for x in unsure:
        assert 0.05 < x["probability"] < 0.95 and "--warmup" in x["reason"]
        lo, hi = x["end_slope_ci_mb_per_s"]
        assert lo < x["leak_rate_mb_per_s"] < hi


def test_autocorrelated_samples_widen_the_slope_interval():
    # A random walk and the same values shuffled: equal spread, but the walk's
    # neighbours repeat each other, so its slope is far less certain.
    rng = random.Random(5)
    walk, level = [], 0.0
    for _ in T:
        level += rng.gauss(0, 1.0)
        walk.append(level)
    shuffled = walk[:]
    rng.shuffle(shuffled)
    assert line_slope(T, walk).stderr > 2 * line_slope(T, shuffled).stderr


def test_the_end_slope_of_a_bent_line_is_its_last_segment():
    y = [min(t, 6.0) * 10.0 for t in T]
    est, bend = end_slope(T, y)
    assert est.slope == pytest.approx(0.0, abs=0.05)
    assert bend == pytest.approx(6.0, abs=0.5)
    straight, _ = end_slope(T, [t * 10.0 for t in T])
    assert straight.slope == pytest.approx(10.0, rel=1e-6)


@pytest.fixture
def busy_cores():
    """Two spinning processes: the host is loaded as on a shared VM, for as long as the test."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.fixture(scope="module")
def cube_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One input cache for the cube trials below, as a host keeps one for a sweep's trials:
    the first generates the frames, the rest load them (half a trial's CPU is generation)."""
    return tmp_path_factory.mktemp("cube-cache")


def _cube_leak(out: Path, cache: Path, workers: int) -> dict:
    proc = subprocess.run(
        [
            sys.executable, "-m", "workloads.run", "--out", str(out), "--workload", "cube",
            "--param", "frames=20", "--param", "rows=300", "--param", "cols=300",
            "--param", "dim=100", "--param", f"cache={cache}", "--workers", str(workers),
            "--duration", "3", "--sample-hz", "10", "--quiet",
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == protocol.EXIT_OK, proc.stderr
    return json.loads((out / protocol.SUMMARY_FILE).read_text())["leak"]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 16, 160])
def test_the_cube_workload_is_never_a_leak_on_a_quiet_host(tmp_path, workers, cube_cache):
    leak = _cube_leak(tmp_path / "out", cube_cache, workers)
    assert leak["verdict"] != "leak", leak


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 16, 160])
def test_the_cube_workload_is_never_a_leak_on_a_loaded_host(tmp_path, workers, busy_cores,
                                                            cube_cache):
    leak = _cube_leak(tmp_path / "out", cube_cache, workers)
    assert leak["verdict"] != "leak", leak
