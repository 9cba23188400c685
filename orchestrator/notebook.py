"""An IPython extension: profile a notebook cell across machines and worker counts.

    %load_ext orchestrator.notebook
    %%cloudprof sweep --machine n2-highcpu-8 --workers 1,2 --dry-run
    import numpy as np
    ...

The cell becomes a ``--command`` job of an ordinary sweep: it is written as
``cell.py`` into a directory of its own that is shipped as the job's
``--workdir`` (so the cell's ``cloudprof:`` protocol lines, its phases and
``CLOUDPROF_WORKERS`` work as for any job), and ``cloudprof sweep`` runs as a
subprocess with the options on the magic's line. The summary table is shown
inline and the run directory is the cell's value.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

CELL_FILE = "cell.py"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NOT_WITH_A_CELL = ("--workdir", "--command", "--shell", "--resume")


class MagicError(Exception):
    """A bad magic line or a sweep that failed; shown as one line."""


def sweep_argv(line: str, workdir: Path) -> list[str]:
    """``cloudprof sweep`` argv for the magic's line, with the cell as the command."""
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise MagicError(f"%%cloudprof: cannot read the options: {exc}") from None
    if not words or words[0] != "sweep":
        raise MagicError("%%cloudprof: use %%cloudprof sweep --machine NAME [options]")
    for word in words[1:]:
        if word.split("=", 1)[0] in _NOT_WITH_A_CELL:
            raise MagicError(f"%%cloudprof: {word.split('=', 1)[0]} is set by the magic "
                             "(the cell is the command)")
    return [sys.executable, "-m", "orchestrator", *words, "--workdir", str(workdir),
            "--command", f"python {CELL_FILE}"]


def run_cell(line: str, cell: str) -> tuple[Path | None, str, int]:
    """Run the sweep; (run directory or None, what it printed, exit code)."""
    with tempfile.TemporaryDirectory(prefix="cloudprof-cell-") as tmp:
        workdir = Path(tmp)
        (workdir / CELL_FILE).write_text(cell, encoding="utf-8")
        # Wide: rich must not wrap the "Report: PATH" line this reads.
        env = {**os.environ, "COLUMNS": "100000"}
        proc = subprocess.run(sweep_argv(line, workdir), capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, env=env)
    # A kernel's environment makes rich colour its output (FORCE_COLOR...): read it plain.
    output = _ANSI.sub("", proc.stdout + proc.stderr)
    run = None
    for text in output.splitlines():
        if text.startswith("Results store: "):
            run = Path(text.removeprefix("Results store: ").strip())
        elif text.startswith("Report: ") and text.endswith(" (report.md beside it)"):
            run = Path(text.removeprefix("Report: ").removesuffix(" (report.md beside it)")).parent
    return run, output, proc.returncode


def summary_table(run: Path) -> Any:
    """The per machine × workers table of the run, as the report computes it, as a pandas
    frame (what a notebook displays and works on; the report itself does without pandas)."""
    from orchestrator.results.report import load_run, summarise

    return summarise(load_run(run).trials).to_pandas()


def cloudprof(line: str, cell: str) -> Path | None:
    """``%%cloudprof sweep OPTIONS``: profile this cell as a job; its value is the run dir."""
    from IPython.display import display

    try:
        run, output, code = run_cell(line, cell)
    except MagicError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    errors = [ln for ln in output.splitlines() if ln.startswith("error:")]
    if run is None:
        print(errors[-1] if errors else output[-2000:], file=sys.stderr)
        return None
    if code != 0 and errors:
        print(errors[-1], file=sys.stderr)
    display(summary_table(run))
    return run


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magic_function(cloudprof, magic_kind="cell", magic_name="cloudprof")
