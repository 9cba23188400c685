"""A command run detached over SSH (orchestrator/providers/detached.py), against the real
loopback sshd: its lines, its exit status, a runner killed outright, a drop mid-run."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from orchestrator.providers import detached
from orchestrator.providers.base import CommandResult
from orchestrator.providers.remote import SshExecutor, SshTarget, open_ssh


def _target(sshd) -> SshTarget:
    return SshTarget(sshd.host, sshd.port, sshd.user, sshd.client_key, [sshd.host_public])


def _run(ex: SshExecutor, script: str, out_dir: Path, timeout: float = 60,
         reconnect=None) -> tuple[CommandResult, list[str], list[str]]:
    lines: list[str] = []
    logged: list[str] = []
    result = detached.run(ex, ["sh", "-c", script], str(out_dir), timeout=timeout,
                          on_line=lines.append, stop=threading.Event(), log=logged.append,
                          reconnect=reconnect or (lambda: pytest.fail("no reconnect expected")))
    return result, lines, logged


def test_lines_and_exit_status_come_back_once(sshd, tmp_path: Path) -> None:
    ex = open_ssh(_target(sshd), timeout=20)
    try:
        result, lines, _ = _run(ex, "echo one; echo two >&2; printf three; exit 5",
                                tmp_path / "trial")
    finally:
        ex.close()
    assert result.exit_code == 5
    assert lines == ["one", "two", "three"]  # the last line had no newline: still whole
    assert (tmp_path / "trial.session" / "status").read_text().strip() == "5"


def test_a_runner_killed_outright_ends_the_follow_without_a_status(sshd, tmp_path: Path) -> None:
    """Its whole process group SIGKILLed (the session's shell too): no status, no end mark;
    the follow still ends, within the watchdog's look, not at the time limit."""
    ex = open_ssh(_target(sshd), timeout=20)
    started = time.monotonic()
    try:
        result, lines, _ = _run(ex, "echo before; sleep 1; kill -KILL 0", tmp_path / "trial")
    finally:
        ex.close()
    assert result.exit_code == -1 and lines == ["before"]
    assert time.monotonic() - started < 30


def test_a_drop_mid_run_reattaches_and_passes_each_line_once(private_sshd, tmp_path: Path) -> None:
    holder: dict[str, SshExecutor] = {}

    def reconnect() -> SshExecutor:
        holder["ex"] = open_ssh(_target(private_sshd), timeout=20)
        return holder["ex"]

    ex = open_ssh(_target(private_sshd), timeout=20)
    killer = threading.Timer(2.0, private_sshd.kill_sessions)
    killer.start()
    try:
        result, lines, logged = _run(ex, "for i in 1 2 3 4 5 6; do echo line $i; sleep 0.7; "
                                         "done; exit 0", tmp_path / "trial", reconnect=reconnect)
    finally:
        killer.cancel()
        ex.close()
        if "ex" in holder:
            holder["ex"].close()
    assert result.exit_code == 0
    assert lines == [f"line {i}" for i in range(1, 7)]  # none lost, none twice
    assert any("reattached to the trial" in line for line in logged), logged


def test_a_host_that_stays_gone_is_given_up_after_the_patience_not_the_time_limit(
        private_sshd, tmp_path: Path) -> None:
    """sshd dies for good mid-run: reconnecting stops once ``patience`` has passed since the
    drop, with the last login error, however long the command's own limit still runs."""
    from orchestrator.errors import UnreachableError

    tries: list[float] = []

    def reconnect() -> SshExecutor:
        tries.append(time.monotonic())
        return open_ssh(_target(private_sshd), timeout=0.5)  # refused: unreachable at once

    def on_line(line: str) -> None:  # the command runs: sshd goes, for good
        lines.append(line)
        threading.Thread(target=private_sshd.stop).start()

    ex = open_ssh(_target(private_sshd), timeout=20)
    lines: list[str] = []
    try:
        with pytest.raises(UnreachableError, match="cannot reach"):
            detached.run(ex, ["sh", "-c", "echo started; sleep 30"], str(tmp_path / "trial"),
                         timeout=300, on_line=on_line, stop=threading.Event(),
                         log=lambda line: None, reconnect=reconnect, patience=3)
    finally:
        ex.close()
    assert lines == ["started"]
    assert len(tries) >= 2  # retried with backoff within the patience...
    assert tries[-1] - tries[0] < 3  # ...and none after it, though 300 s were left
