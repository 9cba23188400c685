"""Profiled trials: py-spy's CPU shares and memray's call sites at the peak, end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from workloads import protocol
from workloads.profilers import get_profiler
from workloads.profilers.memray import call_site, top_sites
from workloads.profilers.pyspy import classify, flamegraph_svg, summarize_speedscope

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
WORKLOADS = "tests.fixtures.profile_workloads"
MIB = 1024 * 1024


def run(out: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120):
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "workloads.run", "--out", str(out), "--quiet", *args],
        capture_output=True, text=True, timeout=timeout, env=full, check=False,
    )  # fmt: skip


def summary(out: Path) -> dict:
    return json.loads((out / protocol.SUMMARY_FILE).read_text())


def frame(name: str, file: str, line: int = 0) -> dict:
    return {"name": name, "file": file, "line": line}


PY = frame("spin", "/job/spin.py", 6)
LIBC = "/lib/x86_64-linux-gnu/libc.so.6"
LIBPY = "/usr/lib/libpython3.11.so.1.0"


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        ([], "python"),
        ([frame("pthread_cond_timedwait", LIBC), frame("0x7f00", LIBC)], "gil_wait"),
        ([frame("take_gil", LIBPY), frame("pthread_cond_timedwait", LIBC)], "gil_wait"),
        ([frame("time_sleep", LIBPY), frame("clock_nanosleep", LIBC)], "idle"),
        ([frame("lock_PyThread_acquire_lock", LIBPY), frame("0x7f00", LIBC)], "lock_wait"),
        ([frame("read", LIBC)], "idle"),
        ([frame("time_time", LIBPY), frame("clock_gettime", LIBC)], "python"),
        ([frame("dgemm_kernel_HASWELL", "/x/libopenblas.so")], "native"),
        ([frame("inner_thread", "/x/libopenblas.so")], "native"),
    ],
)
def test_a_sample_is_classed_by_the_frames_below_its_last_python_frame(tail, expected):
    assert classify([frame("<module>", "/job/main.py", 1), PY, *tail]) == expected


def test_a_lock_acquire_is_contention_in_the_jobs_code_and_idle_in_a_wait_primitive():
    acquire = [frame("lock_PyThread_acquire_lock", LIBPY),
               frame("PyThread_acquire_lock_timed", LIBPY), frame("sem_clockwait", LIBC)]
    assert classify([PY, frame("add", "/job/counter.py", 9), *acquire]) == "lock_wait"
    waiting = frame("wait", "/usr/lib/python3.11/threading.py", 327)  # Event.wait, join...
    assert classify([PY, waiting, *acquire]) == "idle"


def test_the_captured_profile_splits_gil_waiting_numpy_and_sleeping_threads():
    """Captured from py-spy 0.4 --idle --native: 2 spinning threads, one numpy matmul, one sleep."""
    doc = json.loads((FIXTURES / "profiles" / "gil_numpy_sleep.speedscope.json").read_text())
    assert doc["profiles"][0]["name"] == 'Thread 11039 ""'  # the script's main thread: joins
    s = summarize_speedscope(doc, exclude_tids={11039})
    assert s["threads"] == 4 and s["samples"] > 300
    shares = s["shares"]
    assert abs(sum(shares.values()) - 1) < 1e-3
    # Two GIL-bound threads: roughly one runs while the other waits.
    assert 0.1 < shares["gil_wait"] < 0.35 and 0.1 < shares["python"] < 0.35
    assert shares["native"] > 0.15 and shares["idle"] > 0.15  # matmul; sleep(2)
    top = {(t["function"], t["class"]) for t in s["top_functions"][:4]}
    assert ("npw", "native") in top and ("spin", "gil_wait") in top and ("spin", "python") in top
    svg = flamegraph_svg(doc)
    assert svg.startswith("<svg") and "npw (gil2.py:14)" in svg


def test_an_unknown_profile_kind_is_refused():
    with pytest.raises(ValueError, match="unknown profile"):
        get_profiler("disk")


def test_a_call_site_is_the_jobs_own_frame_below_library_code():
    stack = [
        ("ones", "/venv/lib/python3.11/site-packages/numpy/_core/numeric.py", 232),
        ("build", "/home/me/job/cube.py", 120),
        ("<module>", "/home/me/job/main.py", 3),
    ]
    assert call_site(stack) == ("ones", "cube.py:120", "build")
    # a list comprehension's own frame (before Python 3.12) is named by its function
    comp = [("join", "<string>", 0), ("<listcomp>", "/home/me/job/batch.py", 40),
            ("make_records", "/home/me/job/batch.py", 39), ("main", "/home/me/job/batch.py", 90)]
    assert call_site(comp) == ("join", "batch.py:40", "make_records")
    rows = top_sites([(100, 1, stack), (50, 2, stack), (30, 1, stack[1:])], peak_bytes=200)
    assert rows[0]["bytes"] == 150 and rows[0]["allocations"] == 3
    assert rows[0]["share_of_peak"] == 0.75
    assert rows[1]["function"] == "build" and rows[1]["bytes"] == 30


def gil_trial(out: Path, workers: int) -> dict:
    proc = run(out, "--workload", f"{WORKLOADS}:Spin", "--workers", str(workers),
               "--duration", "3", "--profile", "gil")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    s = summary(out)
    assert s["profiled"] is True and s["profile"]["status"] == "ok", s["profile"]
    assert (out / "profile.speedscope.json").stat().st_size > 0
    assert (out / "profile.flamegraph.svg").read_text().startswith("<svg")
    return s["profile"]


@pytest.fixture(scope="module")
def gil_profiles(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict]:
    """The Spin workload's --profile gil at 1 and 2 workers, read by the tests below (3 s
    each: over 100 samples at 1 worker even where a loaded host halves py-spy's rate)."""
    tmp = tmp_path_factory.mktemp("gil")
    return {w: gil_trial(tmp / f"spin{w}", w) for w in (1, 2)}


def test_gil_wait_share_grows_from_one_to_two_pure_python_workers(gil_profiles):
    one, two = gil_profiles[1], gil_profiles[2]
    assert (one["threads"], two["threads"]) == (1, 2), (one, two)  # cloudprof's threads left out
    assert one["samples"] > 100
    assert one["shares"]["gil_wait"] < 0.1 and one["shares"]["python"] > 0.8
    assert two["shares"]["gil_wait"] > one["shares"]["gil_wait"] + 0.25
    assert two["top_functions"][0]["function"].endswith("Spin.run.<locals>.worker")


def test_cloudprofs_own_unit_counter_is_left_out_of_the_jobs_profile(tmp_path):
    out = tmp_path / "tally"
    proc = run(out, "--workload", f"{WORKLOADS}:Tally", "--workers", "2", "--duration", "1.5",
               "--profile", "gil")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    prof = summary(out)["profile"]
    assert prof["status"] == "ok", prof
    assert prof["cloudprof_samples"] > 0 and prof["samples"] > 0  # measured, and set apart
    sites = [t["site"] for t in prof["top_functions"]]
    assert sites and not any(s.startswith("base.py:") for s in sites), sites
    assert abs(sum(prof["shares"].values()) - 1) < 1e-3


def test_the_knee_of_a_gil_bound_workload_is_annotated_with_waiting_for_the_gil(gil_profiles):
    from orchestrator.results.profiles import scaling_section

    records = [{"machine": "here", "workers": w, "trial_id": f"here-w{w}-prof-gil",
                "profile": gil_profiles[w]} for w in (1, 2)]  # fmt: skip
    section = scaling_section(records, {"here": 1})
    assert section is not None
    sentence = next(n for n in section.notes if n.startswith("here:"))
    assert sentence.startswith("here: Above 1 worker, ") and "waits for the GIL" in sentence
    share = int(sentence.split("Above 1 worker, ")[1].split("%")[0])
    assert share >= 25, sentence


def test_profile_cpu_by_default_never_pauses_the_job_and_names_its_top_function(tmp_path):
    out = tmp_path / "cpu"
    proc = run(out, "--workload", f"{WORKLOADS}:Spin", "--workers", "1", "--duration", "2",
               "--profile", "cpu")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    prof = summary(out)["profile"]
    assert prof["status"] == "ok" and prof["mode"] == "nonblocking", prof
    assert prof["native_frames"] is False and prof["shares"] is None
    assert "--profile gil" in prof["note"]
    assert prof["samples"] > 100
    top = prof["top_functions"][0]
    assert top["function"].endswith("Spin.run.<locals>.worker") and top["class"] == "running"


def _memray_top_site(out: Path, workload: str, mb: int, marker: str) -> tuple[dict, dict]:
    """Profile ``workload`` (``mb`` MiB) with memray; its profile and top site, which must be
    the fixture's line marked ``marker``."""
    proc = run(out, "--workload", f"{WORKLOADS}:{workload}", "--param", f"mb={mb}",
               "--workers", "2", "--duration", "1", "--profile", "memory")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    prof = summary(out)["profile"]
    assert prof["status"] == "ok" and prof["tool"] == "memray", prof
    source = (FIXTURES / "profile_workloads.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if marker in text)
    top = prof["top_sites"][0]
    assert top["site"] == f"profile_workloads.py:{line}", prof["top_sites"]
    return prof, top


def test_memray_names_the_line_that_holds_the_peak_within_ten_percent(tmp_path):
    out = tmp_path / "hold"
    prof, top = _memray_top_site(out, "Hold", 48, "HOLD-LINE")
    assert abs(top["bytes"] - 2 * 48 * MIB) <= 0.1 * 2 * 48 * MIB
    assert top["bytes"] <= prof["peak_bytes"]
    assert (out / "memray.flamegraph.html").stat().st_size > 1000


def test_memray_names_a_peak_reached_while_loading_in_prepare_within_ten_percent(tmp_path):
    prof, top = _memray_top_site(tmp_path / "load", "LoadPeak", 96, "LOAD-LINE")
    assert abs(top["bytes"] - 96 * MIB) <= 0.1 * 96 * MIB
    assert prof["peak_bytes"] >= 96 * MIB
    assert prof["covers"] == "whole process (prepare() included)"


def test_without_memray_tracemalloc_names_the_line_and_says_it_is_a_fallback(tmp_path):
    blocker = tmp_path / "no_memray"
    blocker.mkdir()
    (blocker / "memray.py").write_text("raise ImportError('memray blocked for this test')\n")
    out = tmp_path / "hold"
    env = {"PYTHONPATH": f"{blocker}{os.pathsep}{ROOT}"}
    proc = run(out, "--workload", f"{WORKLOADS}:Hold", "--param", "mb=16", "--duration", "1",
               "--profile", "memory", env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    prof = summary(out)["profile"]
    assert prof["tool"] == "tracemalloc" and "fallback" in prof["note"]
    top = prof["top_sites"][0]
    assert top["site"].startswith("profile_workloads.py:")
    assert abs(top["bytes"] - 16 * MIB) <= 0.1 * 16 * MIB


def test_a_command_job_is_sampled_from_outside_its_process(tmp_path):
    out = tmp_path / "cmd"
    code = "import time\nend = time.time() + 1.5\nwhile time.time() < end:\n    sum(range(1000))\n"
    proc = run(out, "--profile", "gil", "--command", "--", sys.executable, "-c", code)
    assert proc.returncode == 0, proc.stderr
    prof = summary(out)["profile"]
    assert prof["status"] == "ok", prof
    assert prof["samples"] > 50 and prof["shares"]["python"] > 0.5
    assert any(t["function"] == "<module>" for t in prof["top_functions"])


def test_py_spy_missing_gives_one_line_and_a_trial_without_profile(tmp_path):
    out = tmp_path / "missing"
    proc = run(out, "--workload", "sleep", "--duration", "0.5", "--profile", "cpu",
               env={"CLOUDPROF_PYSPY": str(tmp_path / "nowhere" / "py-spy")})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (
        proc.stderr.strip()
        == "warning: no cpu profile: py-spy is not installed (pip install py-spy)"
    )
    s = summary(out)
    assert s["status"] == "ok" and s["units"] > 0
    assert s["profile"]["status"] == "unavailable" and s["profiled"] is True


def test_py_spy_denied_ptrace_gives_one_line_and_a_trial_without_profile(tmp_path):
    """A py-spy running as nobody may not trace the runner (root): a real EPERM."""
    if os.geteuid() != 0:
        pytest.skip("needs root to start py-spy as another user")
    pyspy = get_profiler("cpu")
    from workloads.profilers.pyspy import find_pyspy

    real = find_pyspy()
    assert real is not None, pyspy
    wrapper = tmp_path / "py-spy-as-nobody"
    wrapper.write_text(
        f'#!/bin/sh\nexec setpriv --reuid=65534 --regid=65534 --clear-groups {real} "$@"\n'
    )
    wrapper.chmod(0o755)
    out = tmp_path / "denied"
    proc = run(out, "--workload", "sleep", "--duration", "0.5", "--profile", "cpu",
               env={"CLOUDPROF_PYSPY": str(wrapper)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: no cpu profile: py-spy cannot sample")
    assert "Traceback" not in proc.stderr
    s = summary(out)
    assert s["status"] == "ok" and s["profile"]["status"] == "unavailable"
    assert s["profile"]["reason"] in lines[0]


def test_cli_refuses_an_unknown_profile_in_one_line(tmp_path):
    from tests.fixtures.in_process import cloudprof

    proc = cloudprof("sweep", "--repeats", "1", "--dry-run", "--machine", "n2-highcpu-8",
                     "--profile", "disk", "--out", str(tmp_path / "runs"), cwd=tmp_path,
                     env={"CLOUDPROF_CACHE": str(tmp_path / "cache")})
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "'disk' is not one of 'cpu', 'gil', 'memory'" in lines[0], proc.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_profiled_sweep_keeps_profiles_out_of_the_tables_and_reports_them(tmp_path, monkeypatch):
    import io

    import pandas as pd
    from rich.console import Console

    from orchestrator.engine.sweep import run_sweep
    from tests.test_sweep_local import spec_for

    monkeypatch.setenv("CLOUDPROF_CACHE", str(tmp_path / "cache"))
    spec = spec_for(tmp_path / "runs", workers=[1, 2], profile="gil")
    run_dir = run_sweep(spec, console=Console(file=io.StringIO(), width=200))
    trials = pd.read_parquet(run_dir / "trials.parquet")
    assert sorted(trials["trial_id"]) == ["n2-highcpu-8-w1-r0", "n2-highcpu-8-w2-r0"]
    for w in (1, 2):
        folder = run_dir / "profiles" / f"n2-highcpu-8-w{w}-prof-gil"
        record = json.loads((folder / "record.json").read_text())
        assert record["profiled"] is True and record["workers"] == w
        assert record["profile"]["status"] == "ok", record["profile"]
        assert record["profile"]["threads"] == w  # the cube workers, not cloudprof's threads
        assert (folder / "profile.speedscope.json").is_file()
        assert (folder / "profile.flamegraph.svg").is_file()
    report = (run_dir / "report.md").read_text()
    assert "## Why scaling stops" in report and "Top function" in report
    sentence = next(line for line in report.splitlines() if "n2-highcpu-8: " in line)
    assert "of thread time" in sentence  # the knee (or top count) annotated with its cause
    assert (run_dir / "plots" / "why-scaling-stops-n2-highcpu-8.svg").stat().st_size > 1000


def test_the_report_names_the_dominant_cause_above_the_knee_and_the_peak_sites():
    from orchestrator.results.profiles import dominant_cause, memory_section, scaling_section

    def cpu(workers, gil, idle):
        shares = {"python": 1 - gil - idle, "native": 0.0, "gil_wait": gil, "idle": idle}
        top = [{"function": "work", "site": "job.py:3", "class": "python", "share": 0.5}]
        return {"machine": "m", "workers": workers, "trial_id": f"m-w{workers}-prof-cpu",
                "profile": {"kind": "cpu", "status": "ok", "shares": shares,
                            "top_functions": top}}  # fmt: skip

    records = [cpu(1, 0.0, 0.05), cpu(2, 0.5, 0.0), cpu(4, 0.7, 0.05)]
    assert (
        dominant_cause(records, knee=1) == "above 1 worker, 60% of thread time waits for the GIL"
    )
    assert (
        dominant_cause(records, knee=None) == "at 4 workers, 70% of thread time waits for the GIL"
    )
    section = scaling_section(records, {"m": 1})
    assert section is not None and [r[4] for r in section.rows] == ["0%", "50%", "70%"]
    denied = {
        "machine": "m",
        "workers": 8,
        "trial_id": "m-w8-prof-cpu",
        "profile": {"kind": "cpu", "status": "unavailable", "reason": "ptrace: EPERM"},
    }
    section = scaling_section([*records, denied], {"m": 1})
    assert section.rows[-1][-1] == "no profile: ptrace: EPERM"

    mem = {"machine": "m", "workers": 2, "trial_id": "m-w2-prof-memory",
           "profile": {"kind": "memory", "tool": "memray", "status": "ok",
                       "peak_bytes": 3 * 2**30,
                       "top_sites": [{"function": "empty", "site": "cube.py:10",
                                      "bytes": int(1.25 * 2**30)}]}}  # fmt: skip
    leak = {**mem, "leak_verdict": "leak", "profile": {**mem["profile"], "grown_sites": [
        {"function": "append", "site": "job.py:9", "bytes": 300 * 2**20}]}}  # fmt: skip
    assert memory_section([leak]).rows[0][3].endswith("(leak): 300 MiB: append at job.py:9")
    section = memory_section([mem])
    assert section is not None
    assert (
        section.rows[0][2] == "3 GiB" and section.rows[0][3] == "1.25 GiB: empty at cube.py:10"
    )


def test_a_leaking_trial_names_the_call_site_that_grew(tmp_path):
    out = tmp_path / "leak"
    proc = run(out, "--workload", "memory-leak", "--param", "mb_per_s=40", "--duration", "1.5",
               "--profile", "memory")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    s = summary(out)
    prof = s["profile"]
    assert prof["status"] == "ok", prof
    grown = prof["grown_sites"][0]
    assert grown["function"] == "ones" and grown["site"].startswith("synthetic.py:")
    leaked = s["units"] * MIB  # one 1 MiB chunk per unit, never freed
    assert abs(grown["bytes"] - leaked) <= 0.1 * leaked


def test_a_thread_py_spy_wrote_twice_is_excluded_and_counted_once():
    frames = [frame("worker", "/job/w.py", 3)]
    doc = {"shared": {"frames": frames}, "profiles": [
        {"name": 'Thread 7 "workload"', "samples": [[0]]},
        {"name": "Thread 7", "samples": [[0], [0]]},
        {"name": 'Thread 8 "worker-0"', "samples": [[0]] * 3},
        {"name": "Thread 8", "samples": [[0]]},
    ]}  # fmt: skip
    s = summarize_speedscope(doc, exclude_thread_names={"workload"})
    assert s["threads"] == 1 and s["samples"] == 4


def test_profile_in_sweep_toml_plans_one_extra_profiled_trial_per_worker_count(tmp_path):
    from orchestrator.plan.planner import make_plan
    from orchestrator.spec.config import build_spec
    from tests.test_planner import machine

    toml = tmp_path / "sweep.toml"
    toml.write_text('machines = ["n2-highcpu-8"]\nworkers = [1, 2]\nrepeats = 2\n'
                    'profile = "memory"\ndry_run = true\n')  # fmt: skip
    spec = build_spec({}, toml)
    assert spec.profile == "memory"
    trials = make_plan(spec, "s", [machine()]).vms[0].trials
    plain = [t for t in trials if not t.profiled]
    profiled = [t for t in trials if t.profiled]
    assert len(plain) == 4 and all("--profile" not in t.request.argv() for t in plain)
    assert [t.trial_id for t in profiled] == ["n2-highcpu-8-w1-prof-memory",
                                              "n2-highcpu-8-w2-prof-memory"]  # fmt: skip
    assert all(t.request.profile == "memory" for t in profiled)
    # the same trial as repeat 0 at its worker count, the profiler attached
    for t in profiled:
        twin = next(p for p in plain if p.workers == t.workers and p.repeat == 0)
        assert t.request == replace(twin.request, profile="memory")


def test_a_python_command_job_gets_its_peak_call_site_from_memray(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("import time\nblock = bytearray(32 * 1024 * 1024)\ntime.sleep(0.5)\n")
    out = tmp_path / "cmdmem"
    proc = run(out, "--profile", "memory", "--command", "--", sys.executable, str(script))
    assert proc.returncode == 0, proc.stderr
    s = summary(out)
    assert s["command"]["argv"] == [sys.executable, str(script)]  # as the user gave it
    prof = s["profile"]
    assert prof["status"] == "ok", prof
    top = prof["top_sites"][0]
    assert top["site"] == "job.py:2" and abs(top["bytes"] - 32 * MIB) <= 0.1 * 32 * MIB


def test_a_non_python_command_job_runs_and_says_why_it_has_no_memory_profile(tmp_path):
    out = tmp_path / "sleep"
    proc = run(out, "--profile", "memory", "--command", "--", "sleep", "0.2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().startswith("warning: no memory profile: memory profiles of")
    assert len(proc.stderr.strip().splitlines()) == 1
    s = summary(out)
    assert s["status"] == "ok" and s["profile"]["status"] == "unavailable"


def test_a_command_jobs_profiled_trial_passes_profile_to_the_runner_not_the_command(tmp_path):
    from orchestrator.plan.planner import make_plan
    from orchestrator.spec.config import build_spec
    from tests.test_planner import machine

    toml = tmp_path / "sweep.toml"
    toml.write_text('machines = ["n2-highcpu-8"]\nworkers = [1]\nprofile = "memory"\n'
                    'command = "python job.py {workers}"\ndry_run = true\n')  # fmt: skip
    spec = build_spec({}, toml)
    (profiled,) = [t for t in make_plan(spec, "s", [machine()]).vms[0].trials if t.profiled]
    args = profiled.request.argv()
    separator = args.index("--")
    assert args[separator + 1:] == ["python", "job.py", "{workers}"]  # as the user gave it
    assert args[separator - 2:separator] == ["--profile", "memory"]


def test_a_jobs_python_is_found_for_memray_on_the_jobs_path_not_the_runners(tmp_path):
    """On a host the job's ``python`` is the trial env's, first on the job's PATH only (a
    fresh VM has no other): the memray probe looks there too, or it never wraps the job."""
    script = tmp_path / "job.py"
    script.write_text("import time\nblock = bytearray(32 * 1024 * 1024)\ntime.sleep(0.3)\n"
                      "print('cloudprof:units 1')\n")
    out = tmp_path / "jobmem"
    proc = run(out, "--profile", "memory", "--command", "--job", "--workers", "1", "--",
               "python", str(script), env={"PATH": "/usr/bin:/bin"})  # no `python` there
    assert proc.returncode == 0, proc.stderr
    prof = summary(out)["profile"]
    assert prof["status"] == "ok", prof
    assert prof["top_sites"][0]["site"] == "job.py:2"


def test_the_driver_thread_is_left_out_of_a_profile_by_its_id_not_only_its_name():
    """On a busy host py-spy may write a thread without its name: the driver thread, which
    only waits on the workers, would then count as an idle thread of the job."""
    import threading

    from tests.fixtures.profile_workloads import Spin
    from workloads import run as runner

    seen: list[int] = []

    class Watched(Spin):
        def run(self, workers, stop, counter):
            seen.append(threading.get_native_id())
            stop.set()

    own: set[int] = set()
    runner._drive(Watched(), 1, 5.0, None, runner._Signals(threading.Event()), None, None,
                  own_tids=own)  # fmt: skip
    assert own == set(seen) and threading.get_native_id() not in own
