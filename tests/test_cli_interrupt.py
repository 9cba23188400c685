"""A Ctrl-C at any moment of the CLI's start (while it imports itself) ends it quietly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ctrl_c_while_the_cli_starts_prints_no_traceback():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "orchestrator", "catalog", "--help"]
    interrupted = 0
    for _ in range(3):  # the host's load may change between the timing and the tries
        # Delays as fractions of a whole start on this host now: fixed ones (50-600 ms) all
        # fell in the interpreter's own start or after the end once, on a loaded host.
        began = time.monotonic()
        subprocess.run(argv, env=env, capture_output=True, timeout=60, check=True)
        whole = time.monotonic() - began
        for fraction in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8):
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            time.sleep(fraction * whole)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
            if "init_import_site" in err:
                continue  # the interpreter's own start, before any of cloudprof's code runs
            assert "Traceback" not in err, (fraction, whole, err[-2000:])
            assert proc.returncode in (0, 130, -signal.SIGINT), (fraction, proc.returncode, err)
            interrupted += proc.returncode != 0
        if interrupted:
            break
    assert interrupted  # some of them landed while it was still starting
