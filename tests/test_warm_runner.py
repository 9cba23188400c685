"""The warm runner (workloads.warm): trials forked from one server per host must measure,
signal and exit exactly as trials started as fresh interpreters."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from workloads import procfs, protocol, warm, warm_client

MIB = 1024 * 1024


class Server(str):
    """A warm runner's name (what a client is given), with its process."""

    proc: subprocess.Popen


@pytest.fixture
def server() -> Iterator[Server]:
    """A warm runner on an abstract socket of its own; stopped (and checked gone) after."""
    name = Server(secrets.token_hex(6))
    name.proc = subprocess.Popen([sys.executable, "-m", "workloads.warm", "serve", name],
                                 stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert name.proc.stdout is not None and name.proc.stdout.readline().split()[0] == "ready"
    try:
        yield name
    finally:
        assert warm_client.stop(name) == 0
        assert name.proc.wait(timeout=30) == 0


def trial(out: Path, *args: str, via: str | None, **popen) -> subprocess.Popen:
    """The runner's command line, as a fresh interpreter or through the warm runner."""
    own = ["--out", str(out), *args]
    argv = ([sys.executable, "-m", "workloads.warm", "run", via, "--", *own] if via
            else [sys.executable, "-m", "workloads.run", *own])  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **popen)  # fmt: skip


def finished(proc: subprocess.Popen, timeout: float = 60) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def summary(out: Path) -> dict:
    return json.loads((out / protocol.SUMMARY_FILE).read_text())


_FORK_PROBE = """
import json, os, sys
import numpy, pyarrow.parquet  # what a cube server holds
import workloads.run
from workloads import warm

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

populate = warm.page_populator() if sys.argv[1] == "madvise" else None
assert (populate is not None) == (sys.argv[1] == "madvise")  # Linux >= 5.14 here
runs = warm.resident_file_pages()
page = os.sysconf("SC_PAGE_SIZE")
assert runs and all(length > 0 and addr % page == 0 for addr, length in runs)
r, w = os.pipe()
parent = rss()
pid = os.fork()
if pid == 0:
    untouched = rss()
    warm.touch_pages(runs, populate)
    os.write(w, json.dumps([untouched, rss()]).encode())
    os._exit(0)
os.close(w)
untouched, touched = json.loads(os.read(r, 4096))
os.waitpid(pid, 0)
print(json.dumps([parent, untouched, touched]))
"""


@pytest.mark.parametrize("how", ["madvise", "proc-mem"])
def test_a_forked_child_holds_exactly_the_servers_resident_pages(how):
    """The kernel does not copy a library's page-table entries into a forked child; the child
    maps them again (``MADV_POPULATE_READ``, or reads through /proc/self/mem where the kernel
    has no such advice), so its RSS (where a fresh process's peak starts) is the server's.
    In a process of its own, single-threaded like a server: a test worker's other threads
    move its RSS while the child measures."""
    proc = subprocess.run([sys.executable, "-c", _FORK_PROBE, how], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    parent, untouched, touched = json.loads(proc.stdout.strip().splitlines()[-1])
    assert untouched < parent - 4096, (parent, untouched, touched)  # kB: megabytes short
    # touched: all of the parent's, plus what the child itself allocated to measure (0.1-0.7 MB
    # seen: its buffer and reads; more where the heap grows by a huge page), never much less
    assert parent - 256 <= touched <= parent + 4096, (parent, untouched, touched)


def test_a_forked_trial_reports_the_peaks_and_the_units_of_a_fresh_one(tmp_path, server):
    """A load peak (300 MiB in prepare) and a trial peak (100 MiB held) measured both ways."""
    args = ("--workload", "memory-steady", "--param", "load_mb=300", "--param", "mb=100",
            "--workers", "2", "--duration", "0.6", "--sample-hz", "20", "--quiet")
    got = {}
    for via in (None, server, None, server):  # alternating: the page cache is warm for both
        out = tmp_path / f"{via or 'fresh'}-{len(got)}"
        code, _, err = finished(trial(out, *args, via=via))
        assert code == protocol.EXIT_OK, err
        got[out.name] = (via, summary(out))
    fresh = [s for via, s in got.values() if via is None]
    forked = [s for via, s in got.values() if via is not None]
    assert {s["runner_start"] for s in fresh} == {"fresh interpreter"}
    assert {s["runner_start"] for s in forked} == {"forked from a warm runner"}
    for key in ("peak_rss_bytes", "peak_rss_before_trial_bytes", "peak_rss_trial_bytes"):
        lo = min(s[key] for s in fresh) - 2 * MIB
        hi = max(s[key] for s in fresh) + 2 * MIB
        assert all(lo <= s[key] <= hi for s in forked), (key, [s[key] for s in fresh + forked])
    assert all(s["peak_phase"] == "load" and s["peak_rss_bytes"] >= 300 * MIB
               for s in forked)  # fmt: skip
    assert all(s["status"] == "ok" and s["units"] > 0 and s["agent"]["samples"] > 5
               for s in forked)  # fmt: skip
    # the host's facts, read once by the server (the static ones), are a fresh runner's
    assert all(s["host"] == fresh[0]["host"] for s in fresh + forked)


def _nofile_1024() -> None:
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))


def test_a_forked_sampler_starts_under_an_ssh_sessions_limit_of_1024_open_files(tmp_path):
    """A cloud VM's SSH session has a soft limit of 1024 open files (pam_limits); the forked
    sampler once parked its pipes at fd 1024, which fails there, and every trial with it."""
    name = secrets.token_hex(6)
    proc = subprocess.Popen([sys.executable, "-m", "workloads.warm", "serve", name],
                            stdout=subprocess.PIPE, text=True, preexec_fn=_nofile_1024)
    try:
        assert proc.stdout is not None and proc.stdout.readline().split()[0] == "ready"
        out = tmp_path / "trial"
        code, _, err = finished(trial(out, "--workload", "sleep", "--workers", "1",
                                      "--duration", "0.3", "--quiet", via=name,
                                      preexec_fn=_nofile_1024))
        assert code == protocol.EXIT_OK, err
        got = summary(out)
        assert got["runner_start"] == "forked from a warm runner" and got["status"] == "ok"
        assert got["agent"]["samples"] > 0
    finally:
        assert warm_client.stop(name) == 0
        assert proc.wait(timeout=30) == 0


def test_a_forked_trials_load_phase_starts_at_its_fork_exactly(tmp_path, server):
    """The server reads the monotonic clock just before the fork: load_s has no 10 ms tick
    of /proc in it, nor the wall clock less the boot time's whole second."""
    out = tmp_path / "out"
    argv = ["--out", str(out), "--workload", "sleep", "--warmup", "0.3", "--duration", "0.2",
            "--sample-hz", "0", "--quiet"]  # fmt: skip
    sock = warm._connect(server)
    assert sock is not None
    with sock, open(os.devnull, "rb") as stdin, open(tmp_path / "streams", "wb") as streams:
        asked = time.time()  # the server forks after this, once it has read the request
        warm.send(sock, {"op": "run", "argv": argv, "cwd": str(tmp_path),
                         "env": dict(os.environ)}, [stdin.fileno(), streams.fileno(),
                                                    streams.fileno()])  # fmt: skip
        lines = sock.makefile("r", encoding="utf-8").read().split("\n")
    assert lines[0].startswith("pid ") and lines[1] == "exit 0", lines
    s = summary(out)
    # started_at is read after load_s, to the millisecond below; load_s is rounded to it
    clock_started = datetime.fromisoformat(s["started_at"]).timestamp() + 0.001
    assert s["runner_start"] == "forked from a warm runner"
    assert 0.3 <= s["load_s"] <= clock_started - asked + 0.0005, (
        s["load_s"], clock_started - asked)


def test_a_forked_trial_gets_the_clients_arguments_directory_environment_and_streams(
    tmp_path, server,
):
    job = tmp_path / "job"
    job.mkdir()
    out = tmp_path / "out"
    script = 'echo "out $PWD $CLOUDPROF_TEST_VAR"; echo "err line" >&2; exit 3'
    proc = trial(out, "--duration", "5", "--command", "--", "sh", "-c", script, via=server,
                 cwd=job, env={**os.environ, "CLOUDPROF_TEST_VAR": "from-the-client"})
    code, stdout, stderr = finished(proc)
    fresh_out = tmp_path / "fresh"
    fresh_code, fresh_stdout, _ = finished(trial(
        fresh_out, "--duration", "5", "--command", "--", "sh", "-c", script, via=None, cwd=job,
        env={**os.environ, "CLOUDPROF_TEST_VAR": "from-the-client"}))  # fmt: skip
    assert code == fresh_code != 0
    assert f"out {job} from-the-client" in stdout and stdout == fresh_stdout
    assert "err line" in stderr
    assert summary(out)["runner_start"] == "forked from a warm runner"
    assert summary(out)["status"] == summary(fresh_out)["status"]


def test_ctrl_c_to_the_client_stops_the_forked_trial_with_an_interrupted_summary(
    tmp_path, server,
):
    proc = trial(tmp_path, "--workload", "sleep", "--duration", "60", "--sample-hz", "50",
                 via=server, start_new_session=True)  # a group of its own, as in a terminal
    _wait_for(server, proc)
    os.killpg(proc.pid, signal.SIGINT)
    code, _, err = finished(proc, timeout=20)
    assert code == protocol.EXIT_INTERRUPTED, err
    s = summary(tmp_path)
    assert s["status"] == "interrupted" and s["runner_start"] == "forked from a warm runner"
    assert s["agent"]["samples"] >= 0.8 * 50 * s["seconds"], s["agent"]


def test_a_killed_client_takes_its_forked_trial_and_the_trials_sampler_with_it(
    tmp_path, server,
):
    proc = trial(tmp_path, "--workload", "sleep", "--duration", "60", "--sample-hz", "50",
                 via=server)
    _wait_for(server, proc)
    # the forked runner and its sampler, both the server's children (no interpreter started)
    import psutil

    assert len(psutil.Process(server.proc.pid).children()) == 2
    proc.kill()
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while procfs.descendants(server.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not procfs.descendants(server.proc.pid)
    assert server.proc.poll() is None  # the server itself serves on


def test_without_a_server_the_client_starts_a_fresh_runner(tmp_path):
    code, _, err = finished(trial(tmp_path, "--workload", "sleep", "--duration", "0.2",
                                  "--quiet", via="no-such-server-" + secrets.token_hex(4)))
    assert code == protocol.EXIT_OK, err
    assert summary(tmp_path)["runner_start"] == "fresh interpreter"


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to connect as another user")
def test_a_server_runs_nothing_for_another_user(tmp_path, server):
    """Its abstract socket is reachable by every user of the host: the peer's uid decides."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - reports through the pipe
        answer = b"no connection"
        try:
            os.setgid(65534)
            os.setuid(65534)
            sock = warm._connect(server)
            if sock is not None:
                warm.send(sock, {"op": "run", "argv": ["--out", str(tmp_path / "x")],
                                 "cwd": "/", "env": {}}, [0, 1, 2])  # fmt: skip
                answer = sock.recv(64) or b"closed"
        except (BrokenPipeError, ConnectionResetError):  # closed before it read the request
            answer = b"closed"
        finally:
            os.write(w, answer)
            os._exit(0)
    os.close(w)
    answer = os.read(r, 64)
    os.waitpid(pid, 0)
    assert answer == b"closed"  # connected, refused: no pid, nothing forked
    assert not (tmp_path / "x").exists() and not procfs.descendants(server.proc.pid)


def _wait_for(server: Server, proc: subprocess.Popen) -> None:
    """Until the forked trial runs its sampler, then a little longer (its clock has started)."""
    deadline = time.monotonic() + 30
    while len(procfs.descendants(server.proc.pid)) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "the trial never started"
        time.sleep(0.1)
    time.sleep(0.5)


def test_a_server_whose_sweep_stopped_reading_its_output_exits():
    """An SSH session that died leaves the server's parent alive (its shell) but closes the
    session's end of the server's stdout: that is how the server knows it is on its own."""
    name = secrets.token_hex(6)
    proc = subprocess.Popen([sys.executable, "-m", "workloads.warm", "serve", name],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().split()[0] == "ready"
    proc.stdout.close()
    assert proc.wait(timeout=20) == 0
    assert warm._connect(name) is None


def test_the_engines_client_starts_without_site_and_runs_the_trial_in_the_servers_fork(tmp_path):
    """The sweep's trial command (``python -S -c CLIENT ROOT run ...``), as a host runs it
    (here by hand: a local host serves it without a process), from the server the engine
    launched; then stopped through the executor."""
    from orchestrator.engine.warm_runner import WarmRunner, is_trial_command
    from orchestrator.providers.local import LocalExecutor

    ex = LocalExecutor(tmp_path)
    lines: list[str] = []
    warm_runner = WarmRunner(ex, "sleep", lines.append)
    warm_runner.launch()
    try:
        assert warm_runner.wait_ready(timeout=60), lines
        assert warm_runner.root and (Path(warm_runner.root) / "workloads" / "warm.py").is_file()
        out = tmp_path / "out"
        argv = warm_runner.argv(["--workload", "sleep", "--duration", "0.2", "--quiet",
                                 "--out", str(out)])  # fmt: skip
        assert argv[1:3] == ["-S", "-c"] and is_trial_command(argv)
        env = {**os.environ, "PYTHONPATH": str(Path(warm_runner.root))}
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        assert proc.returncode == protocol.EXIT_OK, proc.stderr
        assert summary(out)["runner_start"] == "forked from a warm runner"
    finally:
        warm_runner.stop(ex)
    assert warm_runner.ended.is_set() and lines == []
    assert not is_trial_command([sys.executable, "-m", "workloads.warm", "serve", "x"])


# -- a local host: the engine is the client ------------------------------------------------


def _client_argv(name: str, *runner_args: str) -> list[str]:
    """What ``WarmRunner.argv`` gives the engine for a trial (the client's command line)."""
    root = str(Path(warm_client.__file__).resolve().parent.parent)
    return [sys.executable, "-S", "-c", warm_client.CLIENT, root, "run", name, "--",
            *runner_args]  # fmt: skip


def _running(ex, argv: list[str], **kw) -> tuple[threading.Thread, dict]:  # type: ignore[no-untyped-def]
    """``ex.run(argv)`` in a thread (as a machine thread runs it); its result lands in the dict."""
    got: dict = {"lines": []}

    def run() -> None:
        got["result"] = ex.run(argv, on_line=got["lines"].append, **kw)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, got


def _trial_started(server: Server, thread: threading.Thread) -> list[int]:
    """The forked trial and its sampler's pids, once both run and the clock has started."""
    deadline = time.monotonic() + 30
    while len(procfs.descendants(server.proc.pid)) < 2:
        assert thread.is_alive() and time.monotonic() < deadline, "the trial never started"
        time.sleep(0.1)
    time.sleep(0.5)
    return procfs.descendants(server.proc.pid)


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _gone(pids: list[int], timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(_alive(pid) for pid in pids)


def _reaped(server: Server, timeout: float = 10) -> bool:
    """The server has no child left, zombies included (it reaps an exiting trial as soon as
    it is gone; its client may have had the exit code a moment before)."""
    deadline = time.monotonic() + timeout
    while procfs.descendants(server.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not procfs.descendants(server.proc.pid)


def test_a_local_host_runs_a_warm_trial_in_the_servers_fork_without_a_client_process(
    tmp_path, server, monkeypatch,
):
    """Same directory, environment, streams, output lines and exit code as a fresh runner's
    through the same executor; the only process is the server's fork."""
    from orchestrator.providers.local import LocalExecutor

    monkeypatch.setenv("CLOUDPROF_TEST_VAR", "from-the-engine")
    script = 'echo "out $PWD $CLOUDPROF_TEST_VAR"; echo "err line" >&2; exit 3'
    args = ["--duration", "5", "--quiet", "--command", "--", "sh", "-c", script]
    ex = LocalExecutor(tmp_path)
    fresh_lines: list[str] = []
    fresh = ex.run([sys.executable, "-m", "workloads.run", "--out", str(tmp_path / "fresh"),
                    *args], on_line=fresh_lines.append, timeout=60)  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(subprocess, "Popen", _refuse_processes)
        lines: list[str] = []
        forked = ex.run(_client_argv(server, "--out", str(tmp_path / "forked"), *args),
                        on_line=lines.append, timeout=60)  # fmt: skip
    assert forked.exit_code == fresh.exit_code != protocol.EXIT_OK
    assert f"out {tmp_path} from-the-engine" in lines and "err line" in lines
    assert sorted(lines) == sorted(fresh_lines), (lines, fresh_lines)
    assert forked.stdout_tail.splitlines()[-1] == lines[-1]
    assert summary(tmp_path / "forked")["runner_start"] == "forked from a warm runner"
    assert summary(tmp_path / "forked")["status"] == summary(tmp_path / "fresh")["status"]


def _refuse_processes(*_a, **_kw):  # type: ignore[no-untyped-def]
    raise AssertionError("a process was started for a warm trial")


@pytest.mark.parametrize("how", ["close", "timeout"])
def test_a_local_hosts_forked_trial_stops_as_interrupted_on_close_or_timeout_leaving_nothing(
    tmp_path, server, how,
):
    """The sweep's teardown (``close``) and the trial's timeout SIGINT the trial's group, as
    they did the client's: an interrupted summary, exit 130, no process left."""
    from orchestrator.providers.local import LocalExecutor

    ex = LocalExecutor(tmp_path)
    argv = _client_argv(server, "--out", str(tmp_path / "out"), "--workload", "sleep",
                        "--duration", "60", "--sample-hz", "50")  # fmt: skip
    thread, got = _running(ex, argv, timeout=60 if how == "close" else 3)
    pids = _trial_started(server, thread)
    if how == "close":
        ex.close()
    thread.join(30)
    assert not thread.is_alive()
    assert got["result"].exit_code == protocol.EXIT_INTERRUPTED, got["lines"]
    s = summary(tmp_path / "out")
    assert s["status"] == "interrupted" and s["runner_start"] == "forked from a warm runner"
    assert _gone(pids) and _reaped(server)
    assert server.proc.poll() is None  # the server itself serves on


def test_a_warm_runner_that_dies_under_a_local_trial_is_reported_and_the_trial_killed(tmp_path):
    from orchestrator.providers.local import LocalExecutor

    name = Server(secrets.token_hex(6))
    name.proc = subprocess.Popen([sys.executable, "-m", "workloads.warm", "serve", name],
                                 stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert name.proc.stdout is not None and name.proc.stdout.readline().startswith("ready")
        ex = LocalExecutor(tmp_path)
        thread, got = _running(ex, _client_argv(name, "--out", str(tmp_path / "out"),
                                                "--workload", "sleep", "--duration", "60"))
        pids = _trial_started(name, thread)
        name.proc.kill()
        thread.join(30)
        assert not thread.is_alive()
        assert got["result"].exit_code == 1
        assert got["lines"][-1] == warm_client.LOST == got["result"].stdout_tail.splitlines()[-1]
        assert _gone(pids)  # the trial and its sampler: never left running unwatched
    finally:
        name.proc.kill()
        name.proc.wait(10)


def test_a_local_forked_trial_killed_by_a_signal_ends_as_that_signal(tmp_path, server):
    """As ``Popen`` reports a process killed by a signal (the client died of the same)."""
    from orchestrator.providers.local import LocalExecutor

    ex = LocalExecutor(tmp_path)
    thread, got = _running(ex, _client_argv(server, "--out", str(tmp_path / "out"),
                                            "--workload", "sleep", "--duration", "60"))
    pids = _trial_started(server, thread)
    runner = min(pids)  # forked before its sampler
    os.kill(runner, signal.SIGKILL)
    thread.join(30)
    assert got["result"].exit_code == -signal.SIGKILL
    assert _gone(pids)


def test_a_runner_says_its_exit_code_as_it_exits_and_the_next_trial_waits_until_it_is_gone(
    tmp_path, server,
):
    """The client has the code once the results are written (the sweep records them while
    the runner frees its memory), but nothing starts beside that exit: the server forks
    the next trial only once the last one is reaped, which the next trial sees in /proc."""
    with open(os.devnull, "rb") as stdin, open(tmp_path / "b.log", "wb") as log:
        streams = [stdin.fileno(), log.fileno(), log.fileno()]
        first = warm_client.Trial.request(server, [
            "--out", str(tmp_path / "a"), "--workload", "memory-steady", "--param", "mb=300",
            "--duration", "0.2", "--sample-hz", "0", "--quiet"], str(tmp_path),
            dict(os.environ), streams)  # fmt: skip
        assert first is not None and first.started() and first.pid is not None
        assert first.outcome() == ("exit", protocol.EXIT_OK)
        probe = f"test -e /proc/{first.pid} && echo alive || echo gone"
        second = warm_client.Trial.request(server, [
            "--out", str(tmp_path / "b"), "--duration", "5", "--quiet", "--command", "--",
            "sh", "-c", probe], str(tmp_path), dict(os.environ), streams)  # fmt: skip
        assert second is not None and second.started()
        assert second.outcome() == ("exit", protocol.EXIT_OK)
    assert (tmp_path / "b.log").read_text().split() == ["gone"]
    assert summary(tmp_path / "a")["status"] == "ok"


def test_a_local_host_without_its_warm_runner_starts_a_fresh_runner(tmp_path):
    from orchestrator.providers.local import LocalExecutor

    result = LocalExecutor(tmp_path).run(_client_argv(
        "no-such-server-" + secrets.token_hex(4), "--out", str(tmp_path / "out"),
        "--workload", "sleep", "--duration", "0.2", "--quiet"), timeout=60)  # fmt: skip
    assert result.exit_code == protocol.EXIT_OK, result.stdout_tail
    assert summary(tmp_path / "out")["runner_start"] == "fresh interpreter"


def test_a_client_command_line_is_recognised_only_as_the_client_starts_it():
    argv = _client_argv("abc", "--workload", "sleep")
    assert warm_client.client_args(argv) == ["run", "abc", "--", "--workload", "sleep"]
    assert warm_client.client_args([sys.executable, "-m", "workloads.warm", "stop", "abc"]) == [
        "stop", "abc"]
    assert warm_client.client_args([sys.executable, "-m", "workloads.warm", "serve", "a"]) is None
    assert warm_client.client_args([sys.executable, "-m", "workloads.run", "--out", "x"]) is None
    assert warm_client.client_args(["sh", "-c", warm_client.CLIENT]) is None


# -- the time series' writer (workloads.warm_writer) --------------------------------------


_WRITER_HOLDER = """
import sys, time
from workloads import warm_writer
print(warm_writer.start(sys.argv[1]), flush=True)
time.sleep(120)
"""


def test_the_writer_writes_the_bytes_a_runner_would_and_dies_with_its_server(tmp_path):
    """Rows with gaps (None) and floats that print long: the writer's file and the runner's
    own are the same bytes. Its server gone, the writer is gone and a runner is told so."""
    import psutil

    from workloads.trial_results import write_rows
    from workloads.warm_writer import write

    name = secrets.token_hex(6)
    holder = subprocess.Popen([sys.executable, "-c", _WRITER_HOLDER, name],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None
        writer = psutil.Process(int(holder.stdout.readline()))
        width = len(protocol.TIMESERIES_COLUMNS)
        rows = [tuple(None if (i + j) % 5 == 0 else (i * 0.1 + j / 3 if j % 2 else i * j)
                      for j in range(width)) for i in range(50)]
        assert write(name, tmp_path / "written.parquet", rows)
        write_rows(tmp_path / "own.parquet", rows)
        written, own = tmp_path / "written.parquet", tmp_path / "own.parquet"
        assert written.read_bytes() == own.read_bytes()
    finally:
        holder.kill()
        holder.wait()
    writer.wait(timeout=10)  # PR_SET_PDEATHSIG: it went with its server
    assert not write(name, tmp_path / "late.parquet", rows)
    assert not (tmp_path / "late.parquet").exists()


def test_a_commands_forked_trial_hands_its_time_series_to_the_writer_or_writes_it_itself(
        tmp_path, server):
    """A server without pyarrow keeps a writer (no child of its: its trials are); a command's
    forked trial gets its time series written there, and writes it itself once it is gone."""
    import psutil
    import pyarrow.parquet as pq

    assert not psutil.Process(server.proc.pid).children()
    (writer,) = [p for p in psutil.process_iter(["cmdline"]) if p.pid != server.proc.pid
                 and server in " ".join(p.info["cmdline"] or [])]
    for attempt in ("writer", "itself"):
        wrote = writer.io_counters().write_chars if attempt == "writer" else 0
        out = tmp_path / attempt
        code, _, err = finished(trial(out, "--duration", "5", "--sample-hz", "50", "--command",
                                      "--", sys.executable, "-c", "import time; time.sleep(0.3)",
                                      via=server))  # fmt: skip
        assert code == 0, err
        series = out / protocol.TIMESERIES_FILE
        table = pq.read_table(series)
        assert table.column_names == list(protocol.TIMESERIES_COLUMNS) and table.num_rows > 3
        assert not list(out.glob(".timeseries*"))  # no temporary file left beside it
        if attempt == "writer":  # it wrote the file (its bytes at least), then it is gone
            assert writer.io_counters().write_chars - wrote >= series.stat().st_size
            writer.kill()
            writer.wait(timeout=10)
