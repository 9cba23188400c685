"""One trial through the engine's trial runner (orchestrator.engine.trial_runner): run with
retries on the same host, collected, recorded — on a local host whose executor drops
its session where each test says, with the real runner (the ``sleep`` workload)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest

from orchestrator.engine.context import SweepContext
from orchestrator.engine.host_session import HostSession
from orchestrator.engine.trial_runner import SUMMARIES_DIR, TRIAL_ATTEMPTS, TrialRunner
from orchestrator.engine.warm_runner import is_trial_command
from orchestrator.errors import ConnectionLostError
from orchestrator.plan.planner import slug
from orchestrator.providers.base import CommandResult, Executor, Instance
from orchestrator.providers.local import LocalBucket, LocalExecutor, LocalProvider
from tests.fixtures.engine_rooms import logged, sweep_context


class DroppingHost(LocalExecutor):
    """A host whose session drops on the trial commands the test names: ``before`` the
    runner starts, or ``after`` it finished (its results left on the host)."""

    drops: ClassVar[list[str]] = []  # one of "before" / "after" / "exit3" per trial command
    trial_commands: ClassVar[list[list[str]]] = []

    def run(self, argv: Any, **kw: Any) -> CommandResult:
        if not is_trial_command(list(argv)):
            return super().run(argv, **kw)
        DroppingHost.trial_commands.append(list(argv))
        what = DroppingHost.drops.pop(0) if DroppingHost.drops else "run"
        if what == "before":
            raise ConnectionLostError("connection reset by peer (injected)")
        if what == "exit3":
            return CommandResult(exit_code=3, stdout_tail="", stderr_tail="boom (injected)")
        result = super().run(argv, **kw)
        if what == "after":
            raise ConnectionLostError("connection reset by peer (injected)")
        return result


class DroppingProvider(LocalProvider):
    def connect(self, inst: Instance) -> Executor:
        return DroppingHost(Path(str(inst.address)))


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("orchestrator.engine.trial_runner.RETRY_BACKOFF_S", 0.01)
    monkeypatch.setattr(DroppingHost, "drops", [])
    monkeypatch.setattr(DroppingHost, "trial_commands", [])


def ready_host(ctx: SweepContext) -> HostSession:
    host = HostSession(ctx, ctx.plan.vms[0], ctx.providers["local"])
    host.bring_up()
    host.connect()
    return host


def only_row(ctx: SweepContext) -> dict[str, Any]:
    (row,) = ctx.store.trial_rows()
    return row


def test_a_trial_is_run_collected_and_recorded(tmp_path: Path) -> None:
    ctx = sweep_context(tmp_path, DroppingProvider)
    host, trial = ready_host(ctx), ctx.plan.vms[0].trials[0]
    TrialRunner(ctx).run(host, trial)
    row = only_row(ctx)
    assert row["trial_id"] == trial.trial_id and row["status"] == "ok", row["error"]
    assert row["units"] > 0 and row["ran_on"] == "local"
    kept = json.loads((ctx.store.run_dir / SUMMARIES_DIR / f"{trial.trial_id}.json").read_text())
    assert kept["status"] == "ok"
    assert not (ctx.store.run_dir / ".incoming" / trial.trial_id).exists()


def test_a_trial_whose_session_keeps_dropping_is_recorded_as_failed(tmp_path: Path) -> None:
    ctx = sweep_context(tmp_path, DroppingProvider)
    DroppingHost.drops = ["before"] * TRIAL_ATTEMPTS
    host, trial = ready_host(ctx), ctx.plan.vms[0].trials[0]
    TrialRunner(ctx).run(host, trial)
    row = only_row(ctx)
    assert row["status"] == "failed"
    assert row["error"].startswith(f"gave up after {TRIAL_ATTEMPTS} attempts: connection lost")
    assert len(DroppingHost.trial_commands) == TRIAL_ATTEMPTS


@pytest.mark.parametrize(("drop", "runs", "said"), [
    ("before", 2, f"retrying on the same machine (2/{TRIAL_ATTEMPTS})"),
    # a result left on the host by a dropped session is collected, not run again
    ("after", 1, "result fetched from the machine"),
])
def test_a_dropped_session_is_retried_on_the_same_host(tmp_path: Path, drop: str, runs: int,
                                                       said: str) -> None:
    ctx = sweep_context(tmp_path, DroppingProvider)
    DroppingHost.drops = [drop]
    host, trial = ready_host(ctx), ctx.plan.vms[0].trials[0]
    TrialRunner(ctx).run(host, trial)
    assert only_row(ctx)["status"] == "ok"
    assert len(DroppingHost.trial_commands) == runs
    # each attempt writes its results in a directory of its own
    outs = {argv[argv.index("--out") + 1] for argv in DroppingHost.trial_commands}
    assert len(outs) == runs
    assert said in logged(ctx)


def test_a_runner_that_exits_without_a_summary_fails_its_trial_with_its_last_words(
        tmp_path: Path) -> None:
    ctx = sweep_context(tmp_path, DroppingProvider)
    DroppingHost.drops = ["exit3"]
    host, trial = ready_host(ctx), ctx.plan.vms[0].trials[0]
    TrialRunner(ctx).run(host, trial)
    row = only_row(ctx)
    assert row["status"] == "failed" and row["exit_code"] == 3
    assert row["error"] == "runner exited 3 without a summary: boom (injected)"


def test_a_resumed_trial_already_in_the_bucket_is_collected_from_it(tmp_path: Path) -> None:
    bucket = LocalBucket(tmp_path / "bucket")
    ctx = sweep_context(tmp_path, DroppingProvider, bucket=bucket, resuming=True)
    host, trial = ready_host(ctx), ctx.plan.vms[0].trials[0]
    summary = {"status": "ok", "units": 42, "seconds": 1.0, "units_per_s": 42.0}
    bucket.put_bytes(f"results/{slug(ctx.plan.sweep_id)}/{trial.trial_id}/summary.json",
                     json.dumps(summary).encode())
    TrialRunner(ctx).run(host, trial)
    row = only_row(ctx)
    assert row["status"] == "ok" and row["units"] == 42
    assert DroppingHost.trial_commands == []
    assert f"{trial.trial_id}: result fetched from the bucket" in logged(ctx)
