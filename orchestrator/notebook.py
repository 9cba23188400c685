"""An IPython extension: profile a notebook cell across machines and worker counts.

    %load_ext orchestrator.notebook
    %%cloudprof sweep --machine n2-highcpu-8 --workers 1,2 --dry-run
    import numpy as np
    ...

The cell becomes a ``--command`` job of an ordinary sweep: it is written as
``cell.py`` into a directory of its own that is shipped as the job's
``--workdir`` (so the cell's ``cloudprof:`` protocol lines, its phases and
``CLOUDPROF_WORKERS`` work as for any job), and ``cloudprof sweep`` runs as a
subprocess with the options on the magic's line. While it runs, the cell lists
each trial as it ends (its units/s and peak memory, or why it failed), so a
long sweep is visibly alive; then the summary table is shown inline and the
run directory is the cell's value.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
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


def _progress_line(text: str) -> bool:
    """The sweep's per-trial lines (``✓ trial: 12.3 units/s, peak 40 MiB``, ``✗ ...``) and
    its errors and warnings: what the cell shows while the sweep runs."""
    word = text.lstrip()[:1]
    return word in ("✓", "✗") or text.startswith(("error:", "warning:", "Results store: "))


def run_cell(line: str, cell: str, show: Callable[[str], None] = print
             ) -> tuple[Path | None, str, int]:
    """Run the sweep, passing each progress line to ``show`` as it comes; (run directory
    or None, what it printed, exit code)."""
    with tempfile.TemporaryDirectory(prefix="cloudprof-cell-") as tmp:
        workdir = Path(tmp)
        (workdir / CELL_FILE).write_text(cell, encoding="utf-8")
        # Wide: rich must not wrap the "Report: PATH" line this reads; unbuffered: each
        # trial's line arrives when the trial ends, not when the sweep does.
        env = {**os.environ, "COLUMNS": "100000", "PYTHONUNBUFFERED": "1"}
        lines: list[str] = []
        with subprocess.Popen(sweep_argv(line, workdir), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                              env=env) as proc:
            assert proc.stdout is not None
            for raw in proc.stdout:
                # A kernel's environment makes rich colour its output (FORCE_COLOR...).
                text = _ANSI.sub("", raw.rstrip("\n"))
                lines.append(text)
                if _progress_line(text):
                    show(text)
        code = proc.returncode
    output = "\n".join(lines)
    run = None
    for text in lines:
        if text.startswith("Results store: "):
            run = Path(text.removeprefix("Results store: ").strip())
        elif text.startswith("Report: ") and text.endswith(" (report.md beside it)"):
            run = Path(text.removeprefix("Report: ").removesuffix(" (report.md beside it)")).parent
    return run, output, code


def summary_table(run: Path) -> Any:
    """The per machine × workers table of the run, as the report computes it, as a pandas
    frame (what a notebook displays and works on)."""
    from orchestrator.results.report import load_run, summarise

    return summarise(load_run(run).trials)


def cloudprof(line: str, cell: str) -> Path | None:
    """``%%cloudprof sweep OPTIONS``: profile this cell as a job; its value is the run dir."""
    from IPython.display import display

    try:
        sweep_argv(line, Path("."))  # a bad line is one error, before anything runs
    except MagicError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    print(f"cloudprof {line.strip()}: running; each trial is listed as it ends", flush=True)
    run, output, _ = run_cell(line, cell, show=lambda text: print(text, flush=True))
    errors = [ln for ln in output.splitlines() if ln.startswith("error:")]
    if run is None:
        if not errors:  # the sweep's own last words, when it printed no error line
            print(output[-2000:], file=sys.stderr)
        return None
    display(summary_table(run))
    return run


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magic_function(cloudprof, magic_kind="cell", magic_name="cloudprof")
