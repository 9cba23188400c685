"""The trial runner as the orchestrator sees it: a command line, an exit code, stderr, files."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.fixtures.processes import samplers
from workloads import protocol

MIB = 1024 * 1024


def run(out: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "workloads.run", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def summary(out: Path) -> dict:
    return json.loads((out / protocol.SUMMARY_FILE).read_text())


def error_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def steady(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("steady")
    proc = run(
        out, "--workload", "memory-steady", "--param", "mb=32", "--workers", "2",
        "--duration", "2.2", "--sample-hz", "20",
    )  # fmt: skip
    return out, proc


def test_summary_has_every_key_with_the_right_types(steady):
    out, proc = steady
    assert proc.returncode == protocol.EXIT_OK, proc.stderr
    s = summary(out)
    assert set(protocol.SUMMARY_KEYS) <= set(s)
    assert s["schema"] == protocol.SCHEMA and s["status"] == "ok" and s["error"] is None
    assert s["params"]["workers"] == 2 and s["params"]["workload"] == "memory-steady"
    assert s["params"]["workload_params"] == {"mb": "32"}
    assert s["unit"] == "pass"
    assert isinstance(s["units"], int) and s["units"] > 0
    assert 2.0 <= s["seconds"] < 4.0
    assert s["units_per_s"] == pytest.approx(s["units"] / s["seconds"])
    assert isinstance(s["peak_rss_bytes"], int) and s["peak_rss_bytes"] > 32 * MIB
    assert s["peak_rss_bytes"] >= s["peak_rss_sampled_bytes"] > 32 * MIB
    assert 0 <= s["cpu_utilisation"] <= 1 and s["cpu_percent_mean"] >= 0
    assert s["leak"]["verdict"] == "ok" and isinstance(s["leak"]["slope_mb_per_s"], float)
    assert s["spikes"] == []
    assert s["memory_budget"] == {
        "limit_bytes": None, "breached": False, "breach_t": None, "breach_rss_bytes": None,
        "stopped_trial": False,
    }  # fmt: skip
    assert s["gpu"] is None or isinstance(s["gpu"], dict)
    agent = s["agent"]
    assert agent["samples"] >= 30 and agent["rate_hz_target"] == 20.0
    assert 10 <= agent["rate_hz_achieved"] <= 22  # loose: not a timing test
    assert 0 < agent["cpu_seconds"] < s["seconds"]
    assert agent["sched_policy"] == "batch" and agent["samples_missed"] >= 0
    assert 0 <= agent["lag_ms"]["p50"] <= agent["lag_ms"]["p99"] <= agent["lag_ms"]["max"]
    host = s["host"]
    for key in ("cpu_model", "cores_logical", "cores_physical", "memory_bytes", "platform"):
        assert host[key], key
    assert set(host["libraries"]) == {"numpy", "pyarrow", "psutil"}
    assert s["started_at"] < s["finished_at"]


def test_timeseries_has_the_protocol_columns(steady):
    out, _proc = steady
    table = pq.read_table(out / protocol.TIMESERIES_FILE)
    assert tuple(table.column_names) == protocol.TIMESERIES_COLUMNS
    rows = table.to_pylist()
    assert len(rows) == summary(out)["agent"]["samples"]
    ts = [r["t"] for r in rows]
    assert ts == sorted(ts) and 0.0 <= ts[0] < 0.1  # the first sample as the trial starts
    assert all(r["rss_bytes"] > 32 * MIB for r in rows)
    assert rows[-1]["units"] == summary(out)["units"]
    assert any(r["uss_bytes"] is not None for r in rows)  # the once-a-second reads
    assert sum(r["uss_bytes"] is not None for r in rows) <= 4  # ... and only those


def test_progress_lines_parse(steady):
    _out, proc = steady
    lines = proc.stderr.strip().splitlines()
    parsed = [protocol.parse_progress(line) for line in lines]
    assert len(parsed) >= 2 and all(p is not None for p in parsed), proc.stderr
    assert [p["t"] for p in parsed] == sorted(p["t"] for p in parsed)
    assert all(p["rss_bytes"] > 32 * MIB and p["units"] >= 0 for p in parsed)


def test_units_mode_stops_after_the_units(tmp_path):
    proc = run(
        tmp_path, "--workload", "sleep", "--param", "unit_ms=5", "--workers", "2",
        "--units", "40", "--quiet",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    s = summary(tmp_path)
    assert 40 <= s["units"] < 60 and s["params"]["units_target"] == 40
    assert s["seconds"] < 2
    assert proc.stderr == ""


def test_leaking_workload_is_flagged(tmp_path):
    proc = run(
        tmp_path, "--workload", "memory-leak", "--param", "mb_per_s=40", "--duration", "2.5",
        "--sample-hz", "20", "--quiet",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert summary(tmp_path)["leak"]["verdict"] == "leak"


def test_spike_between_samples_is_caught_by_the_kernel_peak(tmp_path):
    proc = run(
        tmp_path, "--workload", "memory-spike", "--param", "mb=96", "--param", "at_s=0.2",
        "--duration", "1.5", "--sample-hz", "1", "--quiet",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    s = summary(tmp_path)
    first = pq.read_table(tmp_path / protocol.TIMESERIES_FILE).column("rss_bytes")[0].as_py()
    assert s["peak_rss_source"] == "vmhwm"
    assert s["peak_rss_bytes"] >= first + 90 * MIB
    if s["peak_rss_sampled_bytes"] < first + 32 * MIB:  # the 1 Hz samples missed the spike
        assert [x["between_samples"] for x in s["spikes"]] == [True]


def test_memory_budget_breach_stops_the_trial(tmp_path):
    started = time.perf_counter()
    proc = run(
        tmp_path, "--workload", "memory-leak", "--param", "mb_per_s=150", "--duration", "20",
        "--memory-budget", "160M", "--sample-hz", "20", "--quiet",
    )  # fmt: skip
    assert proc.returncode == protocol.EXIT_MEMORY_BUDGET, proc.stderr
    assert time.perf_counter() - started < 10  # stopped long before the 20 s
    s = summary(tmp_path)
    assert s["status"] == "memory_budget_exceeded"
    budget = s["memory_budget"]
    assert budget["limit_bytes"] == 160 * MIB and budget["breached"] and budget["stopped_trial"]
    assert budget["breach_rss_bytes"] > 160 * MIB
    assert s["peak_rss_bytes"] < 400 * MIB  # stopped promptly, not after growing for 20 s
    error_line(proc)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--workload", "no-such-workload"], "unknown workload"),
        (["--workload", "nosuchmodule:Thing"], "cannot load workload"),
        (["--workload", "memory-leak", "--param", "mb_per_s=fast"], "not a number"),
        (["--workload", "memory-leak", "--param", "colour=blue"], "unknown parameter"),
        (["--workload", "sleep", "--param", "novalue"], "KEY=VALUE"),
        (["--workers", "0"], "must be positive"),
        (["--memory-budget", "lots"], "not a size"),
        (["--sample-hz", "500"], "between 0 and 100"),
        (["--sample-hz", "nan"], "between 0 and 100"),
        (["--duration", "99999999999"], "longer than the 7 days"),
        (["--memory-budget", "0"], "size must be positive"),
        (["--duration", "1", "--units", "5"], "not allowed with"),
        (["--command"], "needs the command"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, args, fragment):
    proc = run(tmp_path, *args, timeout=30)
    assert proc.returncode == protocol.EXIT_USAGE
    assert fragment in error_line(proc)
    s = summary(tmp_path)
    assert s["status"] == "failed" and fragment in s["error"]
    assert set(protocol.SUMMARY_KEYS) <= set(s)


def test_missing_out_is_a_usage_error():
    proc = subprocess.run(
        [sys.executable, "-m", "workloads.run", "--workload", "sleep"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == protocol.EXIT_USAGE
    assert "--out" in error_line(proc)


TREE = """
import subprocess, sys, time
child = "import time; b = bytearray(48 * 1024 * 1024); time.sleep(1.5)"
procs = [subprocess.Popen([sys.executable, "-c", child]) for _ in range(2)]
sys.exit(max(p.wait() for p in procs))
"""


def test_command_mode_accounts_for_the_whole_tree(tmp_path):
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    out = tmp_path / "out"
    proc = run(out, "--sample-hz", "20", "--command", "--", sys.executable, str(script))
    assert proc.returncode == 0, proc.stderr
    s = summary(out)
    assert s["status"] == "ok" and s["units"] == 0 and s["unit"] is None
    assert s["command"]["exit_code"] == 0
    assert s["command"]["argv"] == [sys.executable, str(script)]
    assert 1.5 <= s["seconds"] < 10
    # both 48 MiB children at once, plus two Python interpreters and the parent
    assert s["peak_rss_bytes"] > 2 * 48 * MIB
    assert s["peak_rss_upper_bound_bytes"] >= s["peak_rss_bytes"]
    table = pq.read_table(out / protocol.TIMESERIES_FILE).to_pylist()
    assert max(r["children"] or 0 for r in table) == 2
    assert all(r["units"] is None for r in table)
    assert s["cpu_seconds"] > 0


BURST = """
import subprocess, sys
child = "b = bytearray(b'x') * ({mb} << 20); import time; time.sleep(0.3)"
procs = [subprocess.Popen([sys.executable, "-c", child]) for _ in range(3)]
sys.exit(max(p.wait() for p in procs))
"""


def _burst(tmp_path: Path, mb: int, name: str, **env: str) -> tuple[dict, str]:
    """Three children at once, each holding ``mb`` MiB of anonymous memory for 0.3 s."""
    script = tmp_path / f"{name}.py"
    script.write_text(BURST.format(mb=mb))
    proc = subprocess.run(
        [sys.executable, "-m", "workloads.run", "--out", str(tmp_path / name), "--sample-hz",
         "1", "--command", "--", sys.executable, str(script)],
        capture_output=True, text=True, timeout=60, env={**os.environ, **env},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return summary(tmp_path / name), proc.stderr


def test_a_burst_of_three_children_is_exact_with_a_memory_cgroup(tmp_path):
    s, _ = _burst(tmp_path, 100, "burst", CLOUDPROF_NO_CGROUP="0")
    if s.get("cgroup") is None:
        pytest.skip(f"no memory cgroup on this host: {s.get('peak_rss_note')}")
    # sampled once a second, the 0.3 s burst mostly falls between samples: then the cgroup's
    # high-water mark less what it held besides the tree's memory gives it
    assert s["peak_rss_source"] in ("held_cgroup", "held")
    base, _ = _burst(tmp_path, 0, "base", CLOUDPROF_NO_CGROUP="0")  # the three interpreters
    burst = s["peak_rss_bytes"] - base["peak_rss_bytes"]
    assert burst == pytest.approx(300 * MIB, rel=0.03)  # the three at once, not one of them
    assert "peak_rss_note" not in s
    assert not Path(s["cgroup"]["path"]).exists()  # removed once the tree was reaped
    assert s["peak_rss_upper_bound_bytes"] >= s["peak_rss_bytes"]


def test_without_a_memory_cgroup_a_tree_peak_is_flagged_in_one_line(tmp_path):
    s, stderr = _burst(tmp_path, 100, "burst", CLOUDPROF_NO_CGROUP="1")
    # sampled per process (anonymous memory summed from statm); the burst may fall between
    # samples, and the note says the peak is not the cgroup's
    assert s["peak_rss_source"] in ("held", "vmhwm", "ru_maxrss")
    assert s["peak_basis"]["anon_from"] == "statm sum"
    assert "no memory cgroup (CLOUDPROF_NO_CGROUP is set)" in s["peak_rss_note"]
    notes = [line for line in stderr.splitlines() if line.startswith("note: ")]
    # and, where the samples missed the burst, that the sampled sum is far below the peak
    assert notes == [f"note: {s['peak_rss_note']}"] + (
        [f"note: {s['peak_bases_note']}"] if s["peak_bases_note"] else [])
    assert s["peak_rss_upper_bound_bytes"] >= s["peak_rss_bytes"]


def test_a_memory_limit_without_a_tree_or_a_cgroup_is_a_usage_error(tmp_path):
    proc = run(tmp_path / "a", "--memory-limit", "1G", "--duration", "1")
    assert proc.returncode == protocol.EXIT_USAGE
    assert "--memory-limit goes with --command" in error_line(proc)
    proc = subprocess.run(
        [sys.executable, "-m", "workloads.run", "--out", str(tmp_path / "b"), "--memory-limit",
         "1G", "--command", "--", sys.executable, "-c", "pass"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "CLOUDPROF_NO_CGROUP": "1"},
    )  # fmt: skip
    assert proc.returncode == protocol.EXIT_USAGE
    assert "--memory-limit needs a memory cgroup: no memory cgroup (CLOUDPROF_NO_CGROUP is " \
        "set)" in error_line(proc)
    assert summary(tmp_path / "b")["status"] == "failed"


def test_command_failure_mirrors_in_exit_code(tmp_path):
    proc = run(tmp_path, "--quiet", "--command", "--", sys.executable, "-c", "raise SystemExit(3)")
    assert proc.returncode == protocol.EXIT_FAILED
    s = summary(tmp_path)
    assert s["status"] == "failed" and s["command"]["exit_code"] == 3
    assert "code 3" in s["error"]


def test_command_not_found_is_a_usage_error(tmp_path):
    proc = run(tmp_path, "--command", "--", "/no/such/program")
    assert proc.returncode == protocol.EXIT_USAGE
    assert "/no/such/program" in error_line(proc)


def test_command_over_budget_is_killed(tmp_path):
    hog = "import time; b = bytearray(200 * 1024 * 1024); time.sleep(30)"
    started = time.perf_counter()
    proc = run(
        tmp_path, "--quiet", "--memory-budget", "100M", "--sample-hz", "20",
        "--command", "--", sys.executable, "-c", hog,
    )  # fmt: skip
    assert proc.returncode == protocol.EXIT_MEMORY_BUDGET, proc.stderr
    assert time.perf_counter() - started < 15
    s = summary(tmp_path)
    assert s["status"] == "memory_budget_exceeded"
    assert s["command"]["stopped_by"] == "memory_budget"


def test_a_budget_crossed_before_the_trial_begins_stops_it_with_the_budget_exit_code(tmp_path):
    proc = run(
        tmp_path, "--quiet", "--memory-budget", "1K", "--sample-hz", "20",
        "--command", "--", sys.executable, "-c", "import time; time.sleep(30)",
    )  # fmt: skip
    assert proc.returncode == protocol.EXIT_MEMORY_BUDGET, proc.stderr
    s = summary(tmp_path)
    assert s["status"] == "memory_budget_exceeded"
    assert s["command"]["stopped_by"] == "memory_budget"
    # the error names sizes a person reads, with the exact bytes beside them
    assert "memory budget of 1 KiB (1024 bytes) exceeded" in error_line(proc)


def _running_trial(out, *args, **popen) -> subprocess.Popen:
    """``python -m workloads.run`` started and past its first progress line (the trial runs)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "workloads.run", "--out", str(out), *args],
        stderr=subprocess.PIPE, text=True, **popen,
    )  # fmt: skip
    assert proc.stderr is not None
    first = proc.stderr.readline()
    assert protocol.parse_progress(first) is not None, first
    return proc


def test_sigterm_stops_cleanly_with_an_interrupted_summary(tmp_path):
    proc = _running_trial(tmp_path, "--workload", "sleep", "--duration", "60")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == protocol.EXIT_INTERRUPTED
    s = summary(tmp_path)
    assert s["status"] == "interrupted" and s["seconds"] < 30 and s["units"] > 0
    assert (tmp_path / protocol.TIMESERIES_FILE).exists()


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2G", 2 * 1024**3), ("2GiB", 2 * 1024**3), ("2GB", 2 * 10**9), ("512M", 512 * MIB),
     ("1.5GiB", int(1.5 * 1024**3)), ("4294967296", 4 * 1024**3)],
)
def test_a_size_means_the_same_to_the_runner_and_to_the_sweep(tmp_path, text, expected):
    from orchestrator.spec.values import parse_size

    assert parse_size(text) == expected  # cloudprof sweep --max-peak-memory
    proc = run(tmp_path, "--workload", "sleep", "--units", "1", "--sample-hz", "0",
               "--memory-budget", text, "--quiet")
    assert proc.returncode == protocol.EXIT_OK, proc.stderr
    assert summary(tmp_path)["memory_budget"]["limit_bytes"] == expected


@pytest.mark.slow
def test_default_cube_trial_works_with_nothing_else(tmp_path):
    proc = run(tmp_path, "--workers", "2", "--duration", "2", timeout=240)
    assert proc.returncode == 0, proc.stderr
    s = summary(tmp_path)
    assert s["params"]["workload"] == "cube" and s["unit"] == "cube"
    assert s["units"] > 0 and s["units_per_s"] > 0 and s["peak_rss_bytes"] > 0


def test_warmup_is_untimed_and_recorded(tmp_path):
    proc = run(
        tmp_path, "--workload", "sleep", "--warmup", "0.5", "--duration", "0.5", "--quiet"
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    s = summary(tmp_path)
    assert s["params"]["warmup_s"] == 0.5
    assert s["seconds"] < 0.9  # the warm-up is not part of the trial
    table = pq.read_table(tmp_path / protocol.TIMESERIES_FILE).to_pylist()
    assert table[0]["units"] == 0  # nor are its units
    # the load phase (interpreter start, imports, warm-up) is timed for the report's plot
    assert s["load_s"] >= 0.5 and s["peak_rss_before_trial_bytes"] > 0


def test_a_fresh_trials_load_phase_is_what_its_parent_saw_before_the_clock_to_one_tick(tmp_path):
    """load_s from the process's start on the kernel's own clock, not the wall clock less the
    boot time (whole seconds: 48 ms too long on the machine where it was found)."""
    spawned = time.time()
    proc = run(tmp_path, "--workload", "sleep", "--warmup", "0.3", "--duration", "0.2",
               "--sample-hz", "0", "--quiet")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    s = summary(tmp_path)
    # started_at is read after load_s, to the millisecond below; the process started after
    # `spawned`; load_s is rounded to the millisecond and its start truncated to a 10 ms tick
    clock_started = datetime.fromisoformat(s["started_at"]).timestamp() + 0.001
    assert s["runner_start"] == "fresh interpreter"
    assert 0.3 <= s["load_s"] <= clock_started - spawned + 0.01 + 0.0005, (
        s["load_s"], clock_started - spawned)


def test_a_trial_times_its_workloads_prepare_apart_from_the_start_up_before_it(tmp_path):
    proc = run(
        tmp_path, "--workload", "memory-steady", "--param", "load_mb=300", "--param", "mb=16",
        "--duration", "0.3", "--quiet",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    s = summary(tmp_path)
    # touching 316 MiB takes measurable time, and it is part of the load phase, not all of it:
    # the interpreter's start and the imports come before prepare()
    assert 0 < s["prepare_s"] < s["load_s"]


@pytest.mark.skipif(not Path("/usr/bin/time").exists(), reason="GNU time is not installed")
@pytest.mark.parametrize("hz", ["0", "10"])
def test_gnu_time_sees_the_load_peak_unless_sampling_is_off(tmp_path, hz):
    # README: the sampler is forked before the trial resets the runner's high-water mark
    # and inherits it; at --sample-hz 0 there is no sampler and the reset hides the load.
    proc = subprocess.run(
        ["/usr/bin/time", "-v", sys.executable, "-m", "workloads.run", "--out", str(tmp_path),
         "--workload", "memory-steady", "--param", "load_mb=300", "--param", "mb=16",
         "--duration", "0.5", "--sample-hz", hz, "--quiet"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    kb = int(proc.stderr.split("Maximum resident set size (kbytes):")[1].split()[0])
    s = summary(tmp_path)
    assert s["peak_phase"] == "load" and s["peak_rss_bytes"] >= 300 * MIB
    assert s["peak_rss_bytes"] == s["peak_rss_before_trial_bytes"]
    if hz == "0":
        assert kb * 1024 < s["peak_rss_bytes"] - 200 * MIB  # only the trial's peak
    else:
        assert kb * 1024 == pytest.approx(s["peak_rss_bytes"], rel=0.02)  # the whole lifetime


def test_command_duration_is_a_time_limit(tmp_path):
    started = time.perf_counter()
    proc = run(tmp_path, "--duration", "1", "--quiet", "--command", "--", "sleep", "30")
    assert proc.returncode == 0, proc.stderr
    assert time.perf_counter() - started < 10
    s = summary(tmp_path)
    assert s["status"] == "ok" and s["command"]["stopped_by"] == "duration"
    assert 1 <= s["seconds"] < 5


def test_sigint_in_command_mode_stops_the_tree(tmp_path):
    proc = _running_trial(tmp_path, "--command", "--", "sleep", "60")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=15) == protocol.EXIT_INTERRUPTED
    s = summary(tmp_path)
    assert s["status"] == "interrupted" and s["command"]["stopped_by"] == "signal"
    assert s["command"]["exit_code"] == -signal.SIGTERM  # we stopped it, it did not linger
    assert s["seconds"] < 30


def test_ctrl_c_to_the_process_group_keeps_the_samplers_series(tmp_path):
    """A terminal's Ctrl-C reaches the sampler process too: it must outlive it to report."""
    proc = _running_trial(tmp_path, "--workload", "sleep", "--duration", "60", "--sample-hz",
                          "50", start_new_session=True)  # a group of its own, as in a terminal
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=15) == protocol.EXIT_INTERRUPTED
    s = summary(tmp_path)
    assert s["status"] == "interrupted"
    assert "error" not in s["agent"], s["agent"]
    assert s["agent"]["samples"] >= 0.8 * 50 * s["seconds"], s["agent"]


def _tiny_cube_trial_imported(tmp_path, module: str) -> bool:
    """Run a tiny cube trial in a fresh interpreter; whether it ever imported ``module``."""
    code = (
        "import runpy, sys\n"
        "sys.argv = ['workloads.run', '--param', 'frames=4', '--param', 'rows=40', '--param',"
        " 'cols=50', '--param', 'dim=10', '--duration', '0.3', '--quiet', '--out', sys.argv[1]]\n"
        "try:\n    runpy.run_module('workloads.run', run_name='__main__')\n"
        "except SystemExit as exc:\n    code = exc.code\n"
        f"print('exit', code, {module!r} in sys.modules)\n"
    )
    env = {**os.environ, "CLOUDPROF_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out")], capture_output=True,
                          text=True, timeout=120, env=env)  # fmt: skip
    assert proc.stdout.split()[:2] == ["exit", "0"], proc.stderr
    return proc.stdout.split()[2] == "True"


def test_a_cube_trial_never_imports_pandas(tmp_path):
    """pandas costs a trial's start-up 0.27 s; pyarrow's pa.array imported it via its shim."""
    assert not _tiny_cube_trial_imported(tmp_path, "pandas")
    table = pq.read_table(tmp_path / "out" / protocol.TIMESERIES_FILE)
    assert table.num_rows > 0 and table.column("uss_bytes").null_count >= 0


def test_a_trial_records_the_installed_library_versions_without_importing_importlib_metadata(
    tmp_path,
):
    """importlib.metadata's import and sys.path scan cost ~0.1 s of every runner's start-up."""
    from importlib import metadata

    assert not _tiny_cube_trial_imported(tmp_path, "importlib.metadata")
    libraries = summary(tmp_path / "out")["host"]["libraries"]
    assert libraries == {name: metadata.version(name) for name in ("numpy", "pyarrow", "psutil")}


def test_arrow_columns_built_from_buffers_equal_what_pa_array_builds():
    import numpy as np
    import pyarrow as pa

    from workloads.arrow import from_numpy, nullable

    cases = [([1.5, None, -2.0], pa.float64()), ([None, None], pa.int64()),
             ([3, 4, None, 5, 6, 7, 8, 9, None], pa.int32()), ([], pa.int64()),
             ([10**12, 2], pa.int64())]  # fmt: skip
    for values, typ in cases:
        built = nullable(values, typ)
        built.validate(full=True)
        assert built.equals(pa.array(values, type=typ)), (values, typ)
    column = np.arange(5, dtype=np.float64)[::-1]  # not contiguous: copied
    assert from_numpy(column, pa.float64()).equals(pa.array(column))


def test_the_load_peak_is_the_runners_own_not_its_parents(tmp_path):
    """A runner started by a big process (the sweep, a pytest worker) must not report that
    process's memory as its own load peak: Python starts children with vfork, and the kernel
    then folds the parent's high-water mark into the child's ru_maxrss at exec."""
    parent = (
        "import subprocess, sys\n"
        "held = bytearray(700 * 2**20)\n"
        "held[::4096] = b'x' * len(held[::4096])  # resident, not just reserved\n"
        "sys.exit(subprocess.run([sys.executable, '-m', 'workloads.run', '--out', sys.argv[1],"
        " '--workload', 'sleep', '--duration', '0.3', '--quiet']).returncode)\n"
    )
    proc = subprocess.run([sys.executable, "-c", parent, str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    s = summary(tmp_path)
    assert s["peak_rss_bytes"] < 400 * MIB, s["peak_rss_bytes"] / MIB
    assert s["peak_rss_before_trial_bytes"] < 400 * MIB


def test_a_trial_whose_sampler_got_no_core_says_so_on_stderr_and_in_the_summary(tmp_path):
    # SIGSTOP on the runner's sampler process stands for a host too busy to run it.
    proc = subprocess.Popen(
        [sys.executable, "-m", "workloads.run", "--out", str(tmp_path), "--workload",
         "memory-steady", "--param", "mb=16", "--duration", "2.5", "--sample-hz", "50"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        sampler = None
        while sampler is None and time.monotonic() < deadline:
            sampler = next(iter(samplers(proc.pid)), None)
            time.sleep(0.05)
        assert sampler is not None
        # It lowers its priority on "go", as the trial begins: then it is in its loop.
        while os.sched_getscheduler(sampler.pid) != os.SCHED_BATCH:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.2)
        sampler.suspend()
        time.sleep(1.0)
        sampler.resume()
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    agent = summary(tmp_path)["agent"]
    assert agent["samples_missed"] >= 30  # ~50 slots passed while it was stopped
    assert agent["rate_hz_achieved"] < 40 and agent["lag_ms"]["max"] >= 500
    assert agent["rate_note"].startswith(f"sampled at {agent['rate_hz_achieved']:.1f} Hz")
    assert f"note: {agent['rate_note']}" in stderr


# -- --put: the runner puts its own result files in the bucket ------------------------------


def put_manifest(tmp_path: Path, out: Path, urls: dict[str, str]) -> Path:
    """A ``workloads.transfer put`` manifest for the result files in ``out``, as the sweep
    writes it: every file optional (output.log exists only for a job)."""
    manifest = tmp_path / "put.json"
    manifest.write_text(json.dumps([{"path": str(out / name), "url": url, "optional": True}
                                    for name, url in urls.items()]))
    return manifest


def put_line(stderr: str) -> str:
    (line,) = [ln for ln in stderr.splitlines() if ln.startswith(protocol.PUT_PREFIX)]
    return line


@pytest.fixture(params=["s3", "gcs"])
def real_bucket(request: pytest.FixtureRequest) -> object:
    """An empty bucket on moto's S3 server or on the GCS emulator."""
    import uuid

    from orchestrator.providers import open_bucket

    name = f"cp-put-{uuid.uuid4().hex[:12]}"
    if request.param == "s3":
        request.getfixturevalue("moto_env")
        import boto3

        boto3.client("s3").create_bucket(Bucket=name)
        return open_bucket(f"s3://{name}")
    request.getfixturevalue("gcs_emulator")
    from google.cloud import storage

    storage.Client().create_bucket(name)
    return open_bucket(f"gs://{name}")


def test_put_uploads_the_result_files_through_a_real_buckets_signed_urls(tmp_path, real_bucket):
    out = tmp_path / "out"
    names = (protocol.SUMMARY_FILE, protocol.TIMESERIES_FILE, "output.log")
    urls = {n: real_bucket.signed_url(f"results/t1/{n}", "PUT", expires_s=600) for n in names}
    manifest = put_manifest(tmp_path, out, urls)
    proc = run(out, "--workload", "sleep", "--units", "2", "--sample-hz", "20", "--quiet",
               "--put", str(manifest))
    assert proc.returncode == protocol.EXIT_OK, proc.stderr
    assert put_line(proc.stderr) == f"{protocol.PUT_PREFIX} ok {manifest}"
    assert protocol.put_succeeded(put_line(proc.stderr), str(manifest))
    for name in names[:2]:  # byte for byte what the runner wrote
        assert real_bucket.get_bytes(f"results/t1/{name}") == (out / name).read_bytes()
    assert sorted(real_bucket.list("results/t1/")) == [f"results/t1/{n}" for n in names[:2]]


def test_a_failing_put_says_why_in_one_line_and_keeps_the_trials_exit_code(tmp_path):
    out, blocker = tmp_path / "out", tmp_path / "not-a-directory"
    blocker.write_text("a file where the bucket's directory should be")
    manifest = put_manifest(tmp_path, out, {protocol.SUMMARY_FILE: (blocker / "s.json").as_uri()})
    proc = run(out, "--workload", "sleep", "--units", "1", "--sample-hz", "0", "--quiet",
               "--put", str(manifest))
    assert proc.returncode == protocol.EXIT_OK, proc.stderr  # the trial itself went well
    line = put_line(proc.stderr)
    assert line.startswith(f"{protocol.PUT_PREFIX} failed {manifest}: put summary.json")
    assert not protocol.put_succeeded(line, str(manifest))
    assert summary(out)["status"] == "ok" and "Traceback" not in proc.stderr


def test_an_interrupted_trial_puts_nothing_and_says_so(tmp_path):
    out, bucket = tmp_path / "out", tmp_path / "bucket"
    manifest = put_manifest(tmp_path, out, {protocol.SUMMARY_FILE: (bucket / "s.json").as_uri()})
    proc = _running_trial(out, "--workload", "sleep", "--duration", "60", "--put", str(manifest))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == protocol.EXIT_INTERRUPTED
    assert proc.stderr is not None
    assert put_line(proc.stderr.read()).startswith(f"{protocol.PUT_PREFIX} skipped {manifest}")
    assert summary(out)["status"] == "interrupted" and not bucket.exists()


def imported_modules(importtime_stderr: str) -> set[str]:
    """The modules named by ``-X importtime`` lines (PYTHONPROFILEIMPORTTIME=1), any process."""
    return {line.rsplit("|", 1)[1].strip() for line in importtime_stderr.splitlines()
            if line.startswith("import time:") and line.count("|") == 2}


# What a plain trial never needs: --command --job, --profile, psutil (its figures come from
# /proc), an HTTP client (a file:// put copies); each costs a fresh process 10-60 ms.
NOT_IN_A_PLAIN_TRIAL = ("workloads.job", "workloads.profilers.base", "psutil",
                        "urllib.request", "http.client")


def test_a_plain_trials_runner_and_sampler_import_only_what_a_plain_trial_needs(tmp_path):
    out = tmp_path / "out"
    manifest = put_manifest(tmp_path, out, {protocol.SUMMARY_FILE:
                                            (tmp_path / "bucket" / "s.json").as_uri()})
    proc = subprocess.run(
        [sys.executable, "-m", "workloads.run", "--out", str(out), "--workload", "sleep",
         "--units", "2", "--sample-hz", "20", "--quiet", "--put", str(manifest)],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"},  # the sampler inherits it
    )  # fmt: skip
    assert proc.returncode == protocol.EXIT_OK, proc.stderr[-3000:]
    assert put_line(proc.stderr).startswith(f"{protocol.PUT_PREFIX} ok")
    modules = imported_modules(proc.stderr)
    assert {"workloads.agent", "workloads.transfer"} <= modules  # the runner's were seen
    # the sampler's too (``-m`` runs each one's own module as __main__: not listed)
    assert len(re.findall(r"\| +workloads\.procfs$", proc.stderr, re.MULTILINE)) == 2
    assert not modules & set(NOT_IN_A_PLAIN_TRIAL)
    host = summary(out)["host"]  # what psutil gave before, from /proc
    assert host["cores_physical"] >= 1 and host["memory_bytes"] > 0
    assert summary(out)["load_s"] > 0
