"""The sweep engine end to end on the local provider: real runner processes, real files."""

from __future__ import annotations

import calendar
import contextlib
import hashlib
import io
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from rich.console import Console

from orchestrator import providers
from orchestrator.engine.sweep import INPUTS_RETENTION_S, run_sweep
from orchestrator.engine.warm_runner import is_trial_command
from orchestrator.errors import (
    EXIT_INTERRUPTED,
    EXIT_MEMORY_GATE,
    EXIT_PARTIAL,
    BucketError,
    BudgetError,
    ConnectionLostError,
    MemoryGateError,
    PartialSweepError,
    UsageError,
)
from orchestrator.plan.planner import slug
from orchestrator.providers.base import (
    LABEL_CREATED,
    LABEL_CREATOR,
    LABEL_EXPIRES,
    LABEL_SWEEP,
    Bucket,
    Executor,
    Instance,
    creator_label,
    marker_key,
)
from orchestrator.providers.local import LocalBucket, LocalExecutor, LocalProvider
from orchestrator.results.store import RunStore
from orchestrator.spec.spec import SweepSpec
from tests.fixtures.sweeps import ctrl_c_twice, processes_with, runner_processes, trials_of
from workloads import protocol
from workloads.base import UnitCounter, Workload

SMALL = {"frames": "4", "rows": "40", "cols": "40", "dim": "8"}


def assert_inputs_labelled(bucket: Bucket, run_dir: Path) -> None:
    """After the sweep of ``run_dir``: its inputs prefix carries the sweep's labels (kept
    for the next sweeps, INPUTS_RETENTION_S past the sweep's expiry) and its results
    prefix is gone with its marker. Shared by the local, S3 and GCS end-to-end tests."""
    sweep = json.loads((run_dir / "sweep.json").read_text())
    sweep_label = slug(sweep["sweep_id"])
    started = calendar.timegm(time.strptime(sweep["started_at"], "%Y-%m-%dT%H:%M:%SZ"))
    (found,) = [p for p in bucket.labelled_prefixes() if p.id.startswith("inputs/")]
    assert any(k.startswith(found.id) and k.endswith(".parquet") for k in bucket.list("inputs/"))
    labels = found.labels
    assert labels[LABEL_SWEEP] == sweep_label and labels[LABEL_CREATOR] == creator_label()
    assert started - 1 <= int(labels[LABEL_CREATED]) <= time.time()
    sweep_expires = found.sweeps[sweep_label]
    assert sweep_expires > started  # the sweep's own expiry: when its VMs power off
    assert int(labels[LABEL_EXPIRES]) == int(sweep_expires + INPUTS_RETENTION_S)
    assert not [p for p in bucket.labelled_prefixes() if p.id.startswith("results/")]
    assert bucket.get_bytes(marker_key(f"results/{sweep_label}/")) is None


class FailAtTwoWorkers(Workload):
    """A user workload (module:Class) that fails at exactly one worker count."""

    name = "fail-at-two"

    def prepare(self) -> None:
        pass

    def run(self, workers: int, stop: threading.Event, counter: UnitCounter) -> None:
        if workers == 2:
            raise RuntimeError("boom at two workers")
        while not stop.wait(0.01):
            counter.add(workers)


class HeavyLoad(Workload):
    """Needs ~600 MiB while loading (prepare) and ~120 MiB while running: loading is the peak."""

    name = "heavy-load"

    def prepare(self) -> None:
        import numpy as np

        loaded = np.ones(600 * 2**20, dtype=np.uint8)  # every page touched: resident
        self.checksum = int(loaded[:: 2**20].sum())
        del loaded  # a large array is its own mapping: freeing it returns the memory

    def run(self, workers: int, stop: threading.Event, counter: UnitCounter) -> None:
        import numpy as np

        working = np.ones(120 * 2**20, dtype=np.uint8)
        while not stop.wait(0.01):
            counter.add(int(working[0]))


class DroppingExecutor(LocalExecutor):
    """A host whose session drops once, just after a trial put its results in the bucket."""

    drops_left = 0

    def get(self, remote: str, local: Path) -> None:
        if remote.endswith("summary.json") and DroppingExecutor.drops_left > 0:
            DroppingExecutor.drops_left -= 1
            raise ConnectionLostError("connection to the host lost (injected)")
        super().get(remote, local)


class DroppingProvider(LocalProvider):
    name = "dropping"

    def connect(self, inst: Instance) -> Executor:
        return DroppingExecutor(Path(str(inst.address)))


class VanishingExecutor(LocalExecutor):
    """The second trial finds the machine gone, the way a spot preemption looks over SSH."""

    runs = 0

    def run(self, argv, **kw):  # type: ignore[no-untyped-def,override]
        if is_trial_command(argv):
            VanishingExecutor.runs += 1
            if VanishingExecutor.runs == 2:
                VanishingProvider.gone = True
                raise ConnectionLostError("connection reset by peer (injected)")
        return super().run(argv, **kw)


class VanishingProvider(LocalProvider):
    """A provider that creates machines, one of which is preempted mid-sweep."""

    name = "vanishing"
    creates_machines = True
    gone = False
    deleted: list[str] = []  # noqa: RUF012 - shared on purpose: the test reads it

    def connect(self, inst: Instance) -> Executor:
        return VanishingExecutor(Path(str(inst.address)))

    def list(self, labels: dict[str, str]) -> list[Instance]:
        return []  # nothing to reattach; after the drop the VM is gone

    def delete(self, inst: Instance) -> None:
        VanishingProvider.deleted.append(inst.id)


class WatchingExecutor(LocalExecutor):
    """A local host that notes every command it runs, the runners' put lines, and whether the
    bucket already held a trial's summary when the engine fetched it from the host.
    ``old_runner``: the runners run without ``--put``, as a runner that ignored it would."""

    old_runner = False
    bucket: Path
    commands: list[list[str]] = []  # noqa: RUF012 - shared on purpose: the test reads it
    put_lines: list[str] = []  # noqa: RUF012
    in_bucket: dict[str, bool] = {}  # noqa: RUF012 - trial id: its summary in the bucket

    def run(self, argv, **kw):  # type: ignore[no-untyped-def,override]
        argv = list(argv)
        if WatchingExecutor.old_runner and is_trial_command(argv) and "--put" in argv:
            i = argv.index("--put")
            del argv[i:i + 2]
        WatchingExecutor.commands.append(argv)
        on_line = kw.pop("on_line", None)

        def watched(line: str) -> None:
            if line.startswith(protocol.PUT_PREFIX):
                WatchingExecutor.put_lines.append(line)
            if on_line is not None:
                on_line(line)

        return super().run(argv, on_line=watched, **kw)

    def get(self, remote: str, local: Path) -> None:
        if remote.endswith(protocol.SUMMARY_FILE):  # trials/<trial id>-<nonce>-<attempt>/
            trial_id = Path(remote).parent.name.rsplit("-", 2)[0]
            WatchingExecutor.in_bucket[trial_id] = any(
                WatchingExecutor.bucket.glob(f"results/**/{trial_id}/{protocol.SUMMARY_FILE}"))
        super().get(remote, local)


class WatchingProvider(LocalProvider):
    name = "watching"

    def connect(self, inst: Instance) -> Executor:
        return WatchingExecutor(Path(str(inst.address)))


class BootingProvider(LocalProvider):
    """A host whose creation the test sees (``created``), while the inputs upload."""

    name = "booting"
    created = threading.Event()

    def create(self, req):  # type: ignore[no-untyped-def,override]
        inst = super().create(req)
        BootingProvider.created.set()
        return inst


def spec_for(out: Path, **kw: object) -> SweepSpec:
    values: dict = {"machines": ["n2-highcpu-8"], "workers": [1, 2], "duration_s": 0.5,
                    "repeats": 1, "workload_params": dict(SMALL), "out": out, "dry_run": True,
                    "provider": "gcp", "sample_hz": 20.0}
    values.update(kw)
    return SweepSpec(**values)  # type: ignore[arg-type]


def quiet() -> Console:
    return Console(file=io.StringIO(), width=120)


def only_run(out: Path) -> Path:
    runs = [p for p in out.iterdir() if p.is_dir()]
    assert len(runs) == 1
    return runs[0]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CLOUDPROF_CACHE", str(path))
        yield path


@pytest.fixture(scope="module")
def first_run(cache: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    console = Console(file=io.StringIO(), width=200)
    # 1 s trials, not 0.5: its tests assert that each trial did units, and a 0.5 s window
    # beside a CPU hog can pass before a starved worker thread finishes its first
    run_dir = run_sweep(spec_for(tmp_path_factory.mktemp("out"), duration_s=1.0),
                        console=console)
    return run_dir, console.file.getvalue()  # type: ignore[attr-defined]


def trial_dirs(run_dir: Path, trial_id: str) -> list[Path]:
    """Each attempt of a trial runs in its own directory on the host: a run counter."""
    return [p for p in run_dir.glob(f"hosts/*/trials/{trial_id}-*") if p.is_dir()]


@pytest.mark.slow
def test_local_sweep_end_to_end(first_run: tuple[Path, str], cache: Path) -> None:
    run_dir, output = first_run
    sweep = json.loads((run_dir / "sweep.json").read_text())
    assert sweep["status"] == "done" and sweep["dry_run"] is True
    assert sweep["spec"]["workers"] == [1, 2]
    assert sweep["prices"]["n2-highcpu-8"]["price_per_hour"] > 0
    (vm,) = sweep["vms"].values()
    assert vm["id"] and vm["state"] == "released" and vm["provider"] == "local"
    assert sweep["machines"]["n2-highcpu-8"]["status"] == "done"

    trials = trials_of(run_dir).sort_values("workers")
    assert list(trials["trial_id"]) == ["n2-highcpu-8-w1-r0", "n2-highcpu-8-w2-r0"]
    assert set(trials["status"]) == {"ok"} and set(trials["ran_on"]) == {"local"}
    assert set(trials["machine"]) == {"n2-highcpu-8"} and set(trials["provider"]) == {"local"}
    assert (trials["units"] > 0).all() and (trials["peak_rss_bytes"] > 0).all()
    assert set(trials["vcpus"]) == {os.cpu_count()}
    assert trials["cost_is_estimate"].all()
    assert trials.iloc[0]["efficiency"] == pytest.approx(1.0)
    for trial_id in trials["trial_id"]:
        ts = pd.read_parquet(run_dir / "timeseries" / f"{trial_id}.parquet")
        assert len(ts) > 0 and ts["rss_bytes"].max() > 0
    assert (run_dir / "report.html").is_file() and (run_dir / "report.md").is_file()

    # Inputs went through the bucket and reached the host as hardlinks of the cache.
    bucket = cache / "bucket"
    staged = sorted(bucket.glob("inputs/*/frame_0000.parquet"))
    assert len(staged) == 1
    on_host = next(run_dir.glob("hosts/*/inputs/*/frame_0000.parquet"))
    assert on_host.stat().st_ino == staged[0].stat().st_ino
    assert not list(bucket.glob("results/*/*/summary.json"))  # the sweep's prefix is removed
    assert_inputs_labelled(LocalBucket(bucket), run_dir)

    assert "would be created" in output and "n2-highcpu-8-w2-r0" in output


def test_resume_runs_only_missing_trials(first_run: tuple[Path, str]) -> None:
    run_dir, _ = first_run
    path = run_dir / "trials.parquet"
    before = pd.read_parquet(path)
    kept = before[before["workers"] == 1]
    kept.to_parquet(path, index=False)  # lose the 2-worker trial
    assert len(trial_dirs(run_dir, "n2-highcpu-8-w2-r0")) == 1

    with RunStore.open(run_dir).running(), pytest.raises(UsageError, match="in use"):
        run_sweep(spec_for(run_dir.parent), resume=run_dir, console=quiet())  # another holds it
    run_sweep(spec_for(run_dir.parent), resume=run_dir, console=quiet())

    after = pd.read_parquet(path).set_index("trial_id")
    assert sorted(after.index) == ["n2-highcpu-8-w1-r0", "n2-highcpu-8-w2-r0"]
    assert after.loc["n2-highcpu-8-w1-r0", "started_at"] == kept.iloc[0]["started_at"]
    assert len(trial_dirs(run_dir, "n2-highcpu-8-w1-r0")) == 1  # not run again
    assert len(trial_dirs(run_dir, "n2-highcpu-8-w2-r0")) == 2  # run once more
    assert json.loads((run_dir / "sweep.json").read_text())["status"] == "done"


def test_memory_gate_fails_after_recording(cache: Path, tmp_path: Path) -> None:
    with pytest.raises(MemoryGateError, match="memory gate") as info:
        run_sweep(spec_for(tmp_path, workers=[1], max_peak_memory=1 << 20), console=quiet())
    assert info.value.exit_code == EXIT_MEMORY_GATE == 3
    run_dir = only_run(tmp_path)
    assert len(trials_of(run_dir)) == 1
    assert (run_dir / "report.html").is_file()


def test_a_load_peak_trips_the_memory_gate_and_is_the_reported_peak(
    cache: Path, tmp_path: Path
) -> None:
    gate = 300 * 2**20
    spec = spec_for(tmp_path, workload=f"{__name__}:HeavyLoad", workload_params={}, workers=[1],
                    duration_s=0.5, max_peak_memory=gate)
    with pytest.raises(MemoryGateError, match="while loading"):
        run_sweep(spec, console=quiet())
    row = trials_of(only_run(tmp_path)).iloc[0]
    assert row["peak_rss_bytes"] >= 600 * 2**20 and row["peak_phase"] == "load"
    assert row["peak_rss_trial_bytes"] < gate  # the trial alone would have passed
    assert row["peak_rss_bytes"] == row["peak_rss_before_trial_bytes"]


def test_a_trial_gate_ignores_the_load_peak(cache: Path, tmp_path: Path) -> None:
    spec = spec_for(tmp_path, workload=f"{__name__}:HeavyLoad", workload_params={}, workers=[1],
                    duration_s=0.5, max_peak_memory=300 * 2**20, peak_gate="trial")
    run_sweep(spec, console=quiet())  # no MemoryGateError
    row = trials_of(only_run(tmp_path)).iloc[0]
    assert row["status"] == "ok" and row["peak_rss_bytes"] >= 600 * 2**20


def test_max_cost_refuses_to_start(cache: Path, tmp_path: Path) -> None:
    with pytest.raises(BudgetError, match="above --max-cost"):
        run_sweep(spec_for(tmp_path, max_cost=0.0001), console=quiet())
    assert not list(tmp_path.iterdir())  # nothing was created


@pytest.mark.slow
def test_failing_trial_is_recorded_and_the_sweep_goes_on(cache: Path, tmp_path: Path) -> None:
    spec = spec_for(tmp_path, workload=f"{__name__}:FailAtTwoWorkers", workload_params={},
                    workers=[1, 2, 3], duration_s=0.5)
    with pytest.raises(PartialSweepError, match="1 trial") as info:
        run_sweep(spec, console=quiet())
    assert info.value.exit_code == EXIT_PARTIAL
    trials = trials_of(only_run(tmp_path)).set_index("workers")
    assert trials.loc[2, "status"] == "failed" and "boom at two workers" in trials.loc[2, "error"]
    assert trials.loc[1, "status"] == "ok" and trials.loc[3, "status"] == "ok"  # ran after it


def test_bad_parameter_fails_its_trials_with_the_reason(cache: Path, tmp_path: Path) -> None:
    spec = spec_for(tmp_path, workers=[1], workload_params={**SMALL, "strategy": "bogus"})
    with pytest.raises(PartialSweepError):
        run_sweep(spec, console=quiet())
    row = trials_of(only_run(tmp_path)).iloc[0]
    assert row["status"] == "failed" and "bogus" in row["error"]





def _signal_cli_sweep(out: Path) -> list[str]:
    """A dry-run sweep of three short trials, as a user types it: a signal lands after the
    first, in the second; the third is one a resume must run that never started. Three
    repeats of one worker: each trial keeps one core busy, not up to three."""
    return [sys.executable, "-m", "orchestrator.cli", "sweep", "--repeats", "3",
            "--machine", "n2-highcpu-8",
            "--dry-run", "--workers", "1", "--duration", "1.5", "--frames", "4",
            "--rows", "40", "--cols", "40", "--dim", "8", "--out", str(out)]


def _wait_mid_trial(proc: subprocess.Popen, out: Path) -> None:
    """Until one trial is recorded and the next one runs."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        recorded = len(list(out.glob("*/trials.parts/*.json")))  # appended as they end
        files = list(out.glob("*/trials.parquet"))
        if files:
            recorded += len(pd.read_parquet(files[0]))
        if recorded >= 1 and runner_processes(str(out)):
            return
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else proc.returncode
        time.sleep(0.1)
    pytest.fail("no trial finished in time")


# SIGINT is the Ctrl-C tests' below (a double one, one through a pipe to tee), SIGHUP the
# closed terminal's; each signal a sweep handles is sent at least once in this module.
@pytest.mark.slow
@pytest.mark.parametrize(("sig", "then_resume"),
                         [(signal.SIGTERM, False), (signal.SIGQUIT, False),
                          (signal.SIGKILL, True)], ids=lambda v: getattr(v, "name", str(v)))
def test_signal_mid_sweep_tears_down_and_keeps_finished_trials(
    cache: Path, tmp_path: Path, sig: signal.Signals, then_resume: bool
) -> None:
    """kill, kill -9 and Ctrl-\\ (SIGQUIT) alike: exit 130 (a kill -9 cannot: resume copes),
    no trial left running, sweep.json says interrupted, the finished trial kept."""
    out = tmp_path / "runs"
    proc = subprocess.Popen(_signal_cli_sweep(out), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        _wait_mid_trial(proc, out)
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    run_dir = only_run(out)
    if sig != signal.SIGKILL:  # a killed sweep cannot clean up: resume must cope
        assert proc.returncode == EXIT_INTERRUPTED, output
        assert "tearing down" in output and "--resume" in output
        assert "Traceback" not in output
        assert not runner_processes(str(out))  # no trial left running
        sweep = json.loads((run_dir / "sweep.json").read_text())
        assert sweep["status"] == "interrupted"
    trials = trials_of(run_dir)
    done = set(trials.loc[trials["status"] == "ok", "trial_id"])
    assert "n2-highcpu-8-w1-r0" in done
    if not then_resume:
        return

    store = RunStore.open(run_dir)
    run_sweep(spec_for(out), resume=run_dir, console=quiet())
    final = store.trials_frame()
    assert sorted(final["repeat"]) == [0, 1, 2] and set(final["status"]) == {"ok"}
    for trial_id in done:  # finished before the signal: never run twice
        assert len(trial_dirs(run_dir, trial_id)) == 1


@pytest.mark.slow
def test_a_hangup_with_the_terminal_gone_still_tears_down(cache: Path, tmp_path: Path) -> None:
    """The terminal closed: SIGHUP arrives and every later write to it fails. The writes
    vanish, the teardown runs to its end and exits 130, sweep.json says interrupted."""
    out = tmp_path / "runs"
    err = tmp_path / "stderr"
    with err.open("w") as err_file:
        proc = subprocess.Popen(_signal_cli_sweep(out), stdout=subprocess.PIPE,
                                stderr=err_file, text=True)
    try:
        proc.stdout.close()  # type: ignore[union-attr]  # nobody reads it any more
        _wait_mid_trial(proc, out)
        proc.send_signal(signal.SIGHUP)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    errors = err.read_text()
    assert proc.returncode == EXIT_INTERRUPTED, errors
    assert "Traceback" not in errors and "Exception ignored" not in errors
    assert errors.strip().splitlines()[-1].startswith("error: interrupted by SIGHUP"), errors
    assert not runner_processes(str(out))
    run_dir = only_run(out)
    assert json.loads((run_dir / "sweep.json").read_text())["status"] == "interrupted"
    trials = trials_of(run_dir)  # the trial finished before the hangup is kept
    assert "n2-highcpu-8-w1-r0" in set(trials.loc[trials["status"] == "ok", "trial_id"])


@pytest.mark.slow
def test_a_finished_sweep_piped_to_head_exits_0(cache: Path, tmp_path: Path) -> None:
    """``cloudprof sweep ... | head -1``: the reader leaves after one line; the sweep still
    runs every trial, records them and exits 0, without a word about the pipe."""
    out = tmp_path / "runs"
    cmd = _signal_cli_sweep(out)
    cmd[cmd.index("--repeats") + 1] = "2"
    errs = shlex.quote(str(tmp_path / "stderr"))
    shell = f"{shlex.join(cmd)} 2>{errs} | head -1; exit ${{PIPESTATUS[0]}}"
    proc = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=120)
    errors = (tmp_path / "stderr").read_text()
    assert proc.returncode == 0, errors
    assert len(proc.stdout.splitlines()) == 1
    assert "Traceback" not in errors and "Exception ignored" not in errors
    assert "error:" not in errors and "Broken pipe" not in errors
    run_dir = only_run(out)
    assert json.loads((run_dir / "sweep.json").read_text())["status"] == "done"
    assert set(trials_of(run_dir)["status"]) == {"ok"}


# A terminal's foreground job: the sweep and the reader of its pipe share one process group,
# which Ctrl-C signals as a whole. This launcher leads the group, reports the sweep's exit
# code to a file and ignores SIGINT itself (after starting both, which keep the default).
_PIPELINE = r"""
import os, signal, subprocess, sys
reader, rc_file, err_file = sys.argv[1], sys.argv[2], sys.argv[3]
r, w = os.pipe()
with open(err_file, "w") as err:
    sweep = subprocess.Popen(sys.argv[4:], stdout=w, stderr=err)
pipe = subprocess.Popen(reader.split(), stdin=r, stdout=subprocess.DEVNULL)
os.close(r)
os.close(w)
signal.signal(signal.SIGINT, signal.SIG_IGN)
code = sweep.wait()
pipe.wait()
with open(rc_file, "w") as fh:
    fh.write(str(code))
"""


@pytest.mark.slow
def test_ctrl_c_on_a_sweep_piped_to_tee_ends_interrupted(cache: Path, tmp_path: Path) -> None:
    """``cloudprof sweep ... | tee log`` and Ctrl-C: SIGINT reaches tee too, so the sweep's
    stdout becomes a closed pipe mid-teardown. Still interrupted, exit 130, results kept."""
    out = tmp_path / "runs"
    rc_file, err_file = tmp_path / "rc", tmp_path / "stderr"
    group = subprocess.Popen([sys.executable, "-c", _PIPELINE, f"tee {tmp_path / 'log'}",
                              str(rc_file), str(err_file), *_signal_cli_sweep(out)],
                             start_new_session=True)
    try:
        _wait_mid_trial(group, out)
        os.killpg(group.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        group.wait(timeout=180)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group.pid, signal.SIGKILL)
    errors = err_file.read_text()
    assert int(rc_file.read_text()) == EXIT_INTERRUPTED, errors
    assert "Traceback" not in errors and "Exception ignored" not in errors
    assert errors.strip().splitlines()[-1].startswith("error: interrupted"), errors
    assert not runner_processes(str(out))
    run_dir = only_run(out)
    assert json.loads((run_dir / "sweep.json").read_text())["status"] == "interrupted"
    trials = trials_of(run_dir)
    assert "ok" in set(trials["status"])  # the trial finished before Ctrl-C is kept


@pytest.mark.slow
def test_a_double_ctrl_c_mid_trial_is_quiet(cache: Path, tmp_path: Path) -> None:
    """Ctrl-C twice in quick succession to the sweep's process group, a trial running: the
    second only hurries the teardown. No traceback from the sweep or any process it
    started, exit 130, nothing left running."""
    out = tmp_path / "runs"
    proc = subprocess.Popen(_signal_cli_sweep(out), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _wait_mid_trial(proc, out)
        ctrl_c_twice(proc.pid, 0.05)
        output, errors = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_INTERRUPTED, errors
    assert "Traceback" not in output + errors and "Exception ignored" not in output + errors
    deadline = time.monotonic() + 30  # a loaded host reaps them late
    while runner_processes(str(out)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not runner_processes(str(out))
    assert not processes_with(str(out))  # no sampler, warm runner or job either
    assert json.loads((only_run(out) / "sweep.json").read_text())["status"] == "interrupted"


@pytest.mark.slow
def test_dropped_session_fetches_the_result_from_the_bucket(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(providers.PROVIDERS, "dropping", lambda: DroppingProvider)
    DroppingExecutor.drops_left = 1
    console = Console(file=io.StringIO(), width=200)
    spec = spec_for(tmp_path / "runs", provider="dropping", dry_run=False,
                    bucket=str(tmp_path / "bucket"))
    run_dir = run_sweep(spec, console=console)
    assert DroppingExecutor.drops_left == 0
    trials = trials_of(run_dir)
    (vm_name,) = json.loads((run_dir / "sweep.json").read_text())["vms"]
    assert set(trials["status"]) == {"ok"} and set(trials["ran_on"]) == {vm_name}  # its host
    for trial_id in trials["trial_id"]:
        assert len(trial_dirs(run_dir, trial_id)) == 1  # fetched, never run again
    assert "result fetched from the bucket" in console.file.getvalue()  # type: ignore[attr-defined]
    assert not list((tmp_path / "bucket").glob("results/*/*/*"))  # the prefix is cleaned up


def watched_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                  old_runner: bool) -> tuple[pd.DataFrame, list[list[str]]]:
    """A sweep on WatchingProvider with a bucket; its trials and the put commands it ran."""
    monkeypatch.setitem(providers.PROVIDERS, "watching", lambda: WatchingProvider)
    WatchingExecutor.old_runner, WatchingExecutor.bucket = old_runner, tmp_path / "bucket"
    WatchingExecutor.commands, WatchingExecutor.put_lines = [], []
    WatchingExecutor.in_bucket = {}
    spec = spec_for(tmp_path / "runs", provider="watching", dry_run=False,
                    bucket=str(tmp_path / "bucket"))
    trials = pd.read_parquet(run_sweep(spec, console=quiet()) / "trials.parquet")
    assert set(trials["status"]) == {"ok"}
    # every result was in the bucket before the engine fetched it from the host
    assert WatchingExecutor.in_bucket == {t: True for t in trials["trial_id"]}
    puts = [c for c in WatchingExecutor.commands if c[1:4] == ["-m", "workloads.transfer", "put"]]
    return trials, puts


@pytest.mark.slow
def test_the_runner_puts_its_results_in_the_bucket_without_a_put_process(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trials, puts = watched_sweep(tmp_path, monkeypatch, old_runner=False)
    assert puts == []  # no `transfer put` process: each runner said it put its files
    assert len(WatchingExecutor.put_lines) == len(trials) == 2
    assert all(line.startswith(f"{protocol.PUT_PREFIX} ok ") for line in WatchingExecutor.put_lines)


@pytest.mark.slow
def test_a_runner_that_did_not_put_its_results_is_followed_by_a_put_process(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trials, puts = watched_sweep(tmp_path, monkeypatch, old_runner=True)
    assert WatchingExecutor.put_lines == []  # runners without --put say nothing
    assert len(puts) == len(trials) == 2  # and the engine put their files itself


def test_preempted_machine_is_recorded_and_torn_down(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(providers.PROVIDERS, "vanishing", lambda: VanishingProvider)
    monkeypatch.setattr("orchestrator.engine.trial_runner.RETRY_BACKOFF_S", 0.01)
    VanishingExecutor.runs, VanishingProvider.deleted = 0, []
    spec = spec_for(tmp_path / "runs", provider="vanishing", dry_run=False, workers=[1, 2, 3],
                    bucket=str(tmp_path / "bucket"))
    with pytest.raises(PartialSweepError, match="preempted"):
        run_sweep(spec, console=quiet())
    run_dir = only_run(tmp_path / "runs")
    sweep = json.loads((run_dir / "sweep.json").read_text())
    assert sweep["machines"]["n2-highcpu-8"]["status"] == "preempted"
    (vm,) = sweep["vms"].values()
    assert vm["state"] == "deleted" and VanishingProvider.deleted == [vm["id"]]
    assert vm["labels"]["cloudprof-creator"] and int(vm["labels"]["cloudprof-expires"]) > \
        int(vm["labels"]["cloudprof-created"])
    trials = trials_of(run_dir)
    assert list(trials["trial_id"]) == ["n2-highcpu-8-w1-r0"]  # the rest are left to --resume
    assert not (run_dir / "keys").exists() or not list((run_dir / "keys").iterdir())


def test_local_bucket_upload_skips_identical_and_round_trips(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(b"alpha")
    (src / "sub" / "b.bin").write_bytes(b"beta")
    bucket = providers.open_bucket((tmp_path / "bucket").as_uri())
    assert isinstance(bucket, LocalBucket)
    assert sorted(bucket.upload_dir(src, "inputs/h")) == ["inputs/h/a.bin", "inputs/h/sub/b.bin"]
    assert bucket.upload_dir(src, "inputs/h") == []  # same content: nothing uploaded again
    listing = bucket.list("inputs/h/")
    assert listing["inputs/h/a.bin"] == hashlib.md5(b"alpha").hexdigest()
    assert (tmp_path / "bucket/inputs/h/a.bin").stat().st_ino == (src / "a.bin").stat().st_ino
    url = bucket.signed_url("inputs/h/sub/b.bin")
    assert url.startswith("file://") and Path(url[7:]).read_bytes() == b"beta"
    got = bucket.download_dir("inputs/h", tmp_path / "down")
    assert sorted(p.relative_to(tmp_path / "down").as_posix() for p in got) == \
        ["a.bin", "sub/b.bin"]
    assert bucket.delete_prefix("inputs/h/") == 2 and bucket.list("inputs/") == {}
    with pytest.raises(BucketError, match="escapes"):
        bucket.signed_url("../outside")


def test_prefix_labels_are_refreshed_by_each_sweep_that_uses_the_prefix(tmp_path: Path) -> None:
    """The inputs cache: first creation time kept, latest sweep named, expiry only later,
    sweeps that expired forgotten; the marker is outside the prefix and deleted last."""
    bucket = LocalBucket(tmp_path / "bucket")
    now = time.time()
    first = bucket.label_prefix("inputs/h", "s-old", now - 60, 0)  # already expired
    bucket.put_bytes("inputs/h/a.parquet", b"data")
    assert bucket.list("inputs/h/") == {"inputs/h/a.parquet": hashlib.md5(b"data").hexdigest()}
    second = bucket.label_prefix("inputs/h/", "s-new", now + 600, 3600)
    third = bucket.label_prefix("inputs/h/", "s-short", now + 60, 0)

    (stored,) = bucket.labelled_prefixes()
    assert stored.id == "inputs/h/" and stored.region == bucket.url
    assert stored.labels == third.labels and stored.sweep_id == "s-short"
    assert stored.created_at == first.created_at <= now + 1
    assert stored.expires_at == second.expires_at == int(now + 600 + 3600)  # never earlier
    assert set(stored.sweeps) == {"s-new", "s-short"}  # s-old had expired: forgotten
    assert stored.users_alive(time.time(), besides="s-new") == ["s-short"]

    assert bucket.delete_labelled("inputs/h") == 1
    assert bucket.labelled_prefixes() == [] and bucket.prefix_labels("inputs/h/") is None
    assert not (tmp_path / "bucket" / "inputs").exists()  # no empty directories left


def test_an_unreadable_marker_is_listed_without_labels(tmp_path: Path) -> None:
    bucket = LocalBucket(tmp_path / "bucket")
    bucket.put_bytes(marker_key("results/s1"), b"{not json")
    (found,) = bucket.labelled_prefixes()
    assert found.id == "results/s1/" and found.labels == {} and found.expires_at is None


def test_local_executor_runs_argv_without_a_shell(tmp_path: Path) -> None:
    ex = LocalExecutor(tmp_path)
    lines: list[str] = []
    result = ex.run([ex.python, "-c", "import sys; print(sys.argv[1]); sys.exit(3)",
                     "$(touch pwned); `id`"], on_line=lines.append)
    assert result.exit_code == 3 and lines == ["$(touch pwned); `id`"]
    assert not (tmp_path / "pwned").exists()
    (tmp_path / "f.txt").write_text("x")
    ex.get("f.txt", tmp_path / "copy" / "f.txt")
    assert (tmp_path / "copy" / "f.txt").read_text() == "x"
    with pytest.raises(FileNotFoundError):
        ex.get("absent", tmp_path / "nope")


def test_users_own_inputs_directory_is_staged_and_used(cache: Path, tmp_path: Path) -> None:
    from workloads.inputs import InputSpec, generate

    own = generate(InputSpec(frames=3, rows=30, cols=30, seed=7), tmp_path / "my-frames")
    # 1.5 s: a 0.5 s trial beside a CPU hog once ended "ok" with 0 units (its one worker
    # thread starved for the whole window), and this test asserts units
    spec = spec_for(tmp_path / "runs", workers=[1], duration_s=1.5,
                    workload_params={"inputs": str(own), "dim": "8"})
    run_dir = run_sweep(spec, console=quiet())
    row = trials_of(run_dir).iloc[0]
    assert row["status"] == "ok" and row["units"] > 0
    staged = json.loads((run_dir / "sweep.json").read_text())["inputs"]
    assert staged["local_dir"] == str(own)
    on_host = run_dir.glob(f"hosts/*/inputs/{staged['hash']}/frame_0002.parquet")
    assert next(on_host).read_bytes() == (own / "frame_0002.parquet").read_bytes()
    # the laptop's path never reaches the runner's command line
    plan = json.loads((run_dir / "sweep.json").read_text())["plan"]
    assert str(own) not in json.dumps(plan["vms"][0]["trials"])


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda d: None, "no .parquet or .csv frames"),
        (lambda d: (d / "frame_0.parquet").write_bytes(b"not parquet at all"), "cannot read"),
        (lambda d: (d / "notes.txt").write_text("no frames here"), "no .parquet or .csv frames"),
    ],
    ids=["empty", "not parquet", "no frame files"],
)
def test_an_inputs_directory_without_valid_frames_is_refused_before_anything_starts(
    cache: Path, tmp_path: Path, make: Any, fragment: str
) -> None:
    own = tmp_path / "my-frames"
    own.mkdir()
    make(own)
    out = tmp_path / "runs"
    with pytest.raises(UsageError, match=f"^inputs: {fragment}") as info:
        run_sweep(spec_for(out, workload_params={"inputs": str(own), "dim": "8"}),
                  console=quiet())
    assert "\n" not in str(info.value)
    assert not out.exists()  # no store, no host, no trial


def test_inputs_narrower_than_the_cube_are_refused_before_anything_starts(
    cache: Path, tmp_path: Path
) -> None:
    from workloads.inputs import InputSpec, generate

    own = generate(InputSpec(frames=2, rows=30, cols=20, seed=7), tmp_path / "my-frames")
    with pytest.raises(UsageError, match="cube: dim 25 exceeds the 20 columns of"):
        run_sweep(spec_for(tmp_path / "runs", workload_params={"inputs": str(own), "dim": "25"}),
                  console=quiet())
    assert not (tmp_path / "runs").exists()


def test_a_relative_out_gives_one_store_with_absolute_paths_for_the_trials(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    run_dir = run_sweep(spec_for(Path("rel-runs"), workers=[1], duration_s=0.5), console=quiet())
    assert run_dir.is_absolute() and run_dir.parent == tmp_path / "rel-runs"
    assert trials_of(run_dir).iloc[0]["status"] == "ok"
    # the trial wrote into the store, not into a second runs/<id>/ below its host's workdir
    assert not [p for p in run_dir.rglob("rel-runs")], sorted(run_dir.rglob("*"))
    assert [p.name for p in (tmp_path / "rel-runs").iterdir()] == [run_dir.name]


def test_dry_run_never_touches_a_cloud_bucket(cache: Path, tmp_path: Path) -> None:
    # No emulator and no credentials: any call to GCS would fail the sweep.
    spec = spec_for(tmp_path, workers=[1], bucket="gs://cp-never-called")
    run_dir = run_sweep(spec, console=quiet())
    sweep = json.loads((run_dir / "sweep.json").read_text())
    assert sweep["bucket"] == str(cache / "bucket") and sweep["status"] == "done"


def test_a_local_bucket_hashes_a_large_file_once_across_sweeps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The MD5 of unchanged inputs is trusted from the bucket's cache while size and mtime
    match (a sweep re-hashed 763 MiB every time); a changed file is hashed again."""
    from orchestrator.providers import local

    big = tmp_path / "src" / "frame.parquet"
    big.parent.mkdir()
    big.write_bytes(b"x" * (2 << 20))
    hashed: list[Path] = []
    real = local.file_md5
    monkeypatch.setattr(local, "file_md5", lambda p: hashed.append(p) or real(p))
    root = (tmp_path / "bucket").as_uri()
    providers.open_bucket(root).upload_dir(big.parent, "inputs/h")
    first = providers.open_bucket(root).list("inputs/h/")
    assert first == {"inputs/h/frame.parquet": hashlib.md5(b"x" * (2 << 20)).hexdigest()}
    assert len(hashed) == 1
    assert providers.open_bucket(root).list("inputs/h/") == first  # a new process: the cache
    assert len(hashed) == 1
    big.write_bytes(b"y" * (2 << 20 + 1))  # same inode (hard link), new size and mtime
    assert providers.open_bucket(root).list("inputs/h/") == {
        "inputs/h/frame.parquet": hashlib.md5(b"y" * (2 << 20 + 1)).hexdigest()
    }
    assert len(hashed) == 2


_WARM_UP_PROBE = """
import json, subprocess, sys, threading
from pathlib import Path

MODULE = %r
events = []


class FirstImport:
    '''Notes which thread imports MODULE first, and which threads were alive then.'''

    def find_spec(self, name, path, target=None):
        if name == MODULE:
            events.append(("import", threading.current_thread().name,
                           [t.name for t in threading.enumerate()]))
        return None


sys.meta_path.insert(0, FirstImport())
from orchestrator.engine.warm_runner import is_trial_command
from orchestrator.providers.local import LocalExecutor
launch = LocalExecutor.run  # every trial's way onto its host (a process, or a warm fork)


def noting(self, argv, **kw):
    if is_trial_command(list(argv)):
        events.append(("trial", MODULE in sys.modules))
    return launch(self, argv, **kw)


LocalExecutor.run = noting
from rich.console import Console
from orchestrator.engine.sweep import run_sweep
from orchestrator.spec.spec import SweepSpec

spec = SweepSpec(machines=["n2-highcpu-8"], workers=[1, 2], duration_s=0.5, repeats=1,
                 workload_params=%r, out=Path(sys.argv[1]), dry_run=True, provider="gcp",
                 adaptive=%r)
run_sweep(spec, console=Console(file=open("/dev/null", "w")))
print(json.dumps(events + [("pandas at exit", "pandas" in sys.modules)]))
"""


def _warm_up_events(tmp_path: Path, module: str, adaptive: bool) -> list[Any]:
    out = subprocess.run([sys.executable, "-c", _WARM_UP_PROBE % (module, SMALL, adaptive),
                          str(tmp_path)], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_an_adaptive_sweep_imports_pandas_while_its_machine_stages_and_before_its_first_trial(
        cache: Path, tmp_path: Path) -> None:
    """--adaptive reads the trials as a pandas frame between trials (~0.3-1 s to import):
    the main thread imports it while the machine threads provision and stage, not as a
    pause of its own before them, and no trial's runner starts before it is imported (it
    would compete with the trial)."""
    events = _warm_up_events(tmp_path, "pandas", adaptive=True)
    imports = [e for e in events if e[0] == "import"]
    assert imports and imports[0][1] == "MainThread"
    assert any(name.startswith("machine-") for name in imports[0][2]), imports[0]
    trials = [e for e in events if e[0] == "trial"]
    assert len(trials) >= 2 and all(seen for _, seen in trials), events


@pytest.mark.slow
def test_a_plain_sweep_starts_no_trial_before_the_stores_pyarrow(
        cache: Path, first_run: tuple[Path, str], tmp_path: Path) -> None:
    """A sweep's trials wait for the main thread's import of pyarrow (the trials table),
    which never runs beside one. (``first_run`` has generated the inputs in ``cache``:
    generating them imports pyarrow in the generator's threads, before any machine starts.)
    The report at the end draws its figures with Altair, on pandas: that import is the
    report's few seconds, after every trial."""
    events = _warm_up_events(tmp_path, "pyarrow", adaptive=False)
    assert events[-1][0] == "pandas at exit", events
    imports = [e for e in events if e[0] == "import"]
    assert imports and imports[0][1] == "MainThread", events
    trials = [e for e in events if e[0] == "trial"]
    assert len(trials) == 2 and all(seen for _, seen in trials), events


@pytest.mark.slow
def test_the_machines_are_created_while_the_inputs_upload_and_fetch_them_once_staged(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The upload waits until a machine exists: an engine that still created its machines
    only after the upload would stop here (BucketError after 30 s) instead of finishing."""
    monkeypatch.setitem(providers.PROVIDERS, "booting", lambda: BootingProvider)
    BootingProvider.created.clear()
    upload = LocalBucket.upload_dir
    uploaded_at: list[str] = []

    def upload_once_a_machine_exists(self, *a, **kw):  # type: ignore[no-untyped-def]
        if not BootingProvider.created.wait(30):
            raise BucketError("the upload waited 30 s for a machine that was never created")
        keys = upload(self, *a, **kw)
        uploaded_at.append(time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()))
        return keys

    monkeypatch.setattr(LocalBucket, "upload_dir", upload_once_a_machine_exists)
    spec = spec_for(tmp_path / "runs", provider="booting", dry_run=False, workers=[1],
                    bucket=str(tmp_path / "bucket"))
    run_dir = run_sweep(spec, console=quiet())
    trials = trials_of(run_dir)
    assert list(trials["status"]) == ["ok"]
    (vm,) = json.loads((run_dir / "sweep.json").read_text())["vms"].values()
    assert uploaded_at and vm["inputs_staged_at"][:19] >= uploaded_at[0]  # fetched once staged


@pytest.mark.slow
def test_an_upload_that_fails_is_one_line_and_the_machine_started_meanwhile_is_released(
    cache: Path, tmp_path: Path
) -> None:
    bucket = tmp_path / "bucket"
    spec = spec_for(tmp_path / "runs", workers=[1], bucket=str(bucket))
    run_sweep(spec, console=quiet())  # the inputs are in the bucket: now one is in the way
    victim = sorted(bucket.glob("inputs/*/*.parquet"))[0]
    victim.unlink()
    (victim / "in-the-way").mkdir(parents=True)
    with pytest.raises(BucketError, match=f"cannot upload to .*{victim.name}"):
        run_sweep(spec_for(tmp_path / "runs2", workers=[1], bucket=str(bucket)),
                  console=quiet())
    data = json.loads((only_run(tmp_path / "runs2") / "sweep.json").read_text())
    assert data["status"] == "failed"
    assert [vm["state"] for vm in data["vms"].values()] == ["released"]


@pytest.mark.slow
def test_the_machines_start_before_the_store_writes_its_empty_trials_table(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writing the empty trials table imports pyarrow (~0.15-0.35 s of CPU): a sweep starts its
    machine threads first (their provisioning needs sweep.json only) and writes it while
    they provision, on the main thread, before any trial is recorded into it."""
    events: list[tuple[str, str, list[str]]] = []
    ensure = RunStore.ensure_trials_table

    def noting_ensure(self):  # type: ignore[no-untyped-def]
        machines = [t.name for t in threading.enumerate() if t.name.startswith("machine-")]
        events.append(("table" if not self.trials_path.exists() else "table again",
                       threading.current_thread().name, machines))
        return ensure(self)

    monkeypatch.setattr(RunStore, "ensure_trials_table", noting_ensure)
    run_dir = run_sweep(spec_for(tmp_path / "runs", workers=[1]), console=quiet())
    first = events[0]  # the machine thread waits for the main thread's pandas, imported after
    assert first[:2] == ("table", "MainThread") and first[2], events
    assert list(trials_of(run_dir)["status"]) == ["ok"]
