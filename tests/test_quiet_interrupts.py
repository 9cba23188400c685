"""Ctrl-C ends cloudprof's own processes quietly, whenever it lands (workloads.interrupts).

The sweep shows a host process's output as its own, so a KeyboardInterrupt traceback
from a runner or warm runner stopped while importing numpy and pyarrow (before its
own signal handling is in place) reached the user as dozens of lines. Each process
here gets SIGINT twice while it imports, as a double Ctrl-C or a sweep stopping it
would send: it must die of SIGINT without a word.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.sweeps import ctrl_c_twice


def _sigint_as_in_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("program", ["runner", "warm runner", "transfer"])
def test_sigint_twice_while_importing_ends_quietly(program: str, tmp_path: Path) -> None:
    argv = {
        "runner": ["-m", "workloads.run", "--workers", "1", "--duration", "5",
                   "--out", str(tmp_path / "out")],
        "warm runner": ["-m", "workloads.warm", "serve", f"quiet-{os.getpid()}",
                        "--preload", "cube"],
        "transfer": ["-m", "workloads.transfer", "put", str(tmp_path / "none.json")],
    }[program]
    # -X importtime writes a line to stderr as each import ends: the signal lands right
    # after the package itself was imported, while the program imports the rest.
    # Ctrl-C's default action in the child whatever the suite was started with: a suite
    # run in the background (`cmd &`, nohup) hands its children SIGINT ignored, and Python
    # then never turns SIGINT into KeyboardInterrupt at all.
    proc = subprocess.Popen([sys.executable, "-X", "importtime", *argv],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_sigint_as_in_a_terminal)
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            if line.rstrip().endswith("| workloads"):
                break
        else:
            pytest.fail(f"workloads never imported: {proc.communicate()}")
        ctrl_c_twice(proc.pid, 0.01)
        output, errors = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    said = output + "".join(line for line in errors.splitlines(True)
                            if not line.startswith("import time:"))
    assert "Traceback" not in said and "KeyboardInterrupt" not in said, said
    assert proc.returncode in (-signal.SIGINT, 130), said


def test_a_signal_landing_while_an_interrupt_is_sent_again_is_sent_instead(monkeypatch) -> None:
    """A barrage of signals as a sweep ends: one landed in the unraisable hook while its
    timer's thread started, and escaped the hook as a traceback. The hook goes on quietly
    and sends that newest signal."""
    from orchestrator import errors
    from orchestrator.engine.signals import Terminated

    started: list[tuple] = []
    landing = [Terminated(signal.SIGTERM)]  # what the handler raises, once

    class Timer:
        def __init__(self, delay: float, function, args) -> None:
            self.args = args
            self.daemon = False

        def start(self) -> None:
            if landing:
                raise landing.pop()
            started.append(self.args)

    monkeypatch.setattr(errors.threading, "Timer", Timer)
    try:
        errors.interrupt_again(signal.SIGINT)
    except KeyboardInterrupt as escaped:  # as a failure, not pytest's own Ctrl-C
        pytest.fail(f"the interrupt escaped: {escaped!r}")
    assert started == [(os.getpid(), signal.SIGTERM)]
