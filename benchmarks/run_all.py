"""Run the benchmark scripts and write the benchmarks page from what they measured.

    python benchmarks/run_all.py                     # every script, full size (make bench)
    python benchmarks/run_all.py --quick             # fewer rounds, shorter trials
    python benchmarks/run_all.py --only bench_report.py --quick   # its figures replaced
    python benchmarks/run_all.py --render benchmarks/results.json   # the page again, no run

Benchmarks are whole scripts rather than timed unit tests: they measure ratios side
by side in one run (so a busy machine slows both sides alike). Each script's tables
come back as JSON lines (``_common.print_table`` appends them to the file named by
``CLOUDPROF_BENCH_RESULTS``); this script keeps them with the machine they ran on in
benchmarks/results.json and renders docs/benchmarks.md: every table under the
command that produced it, the machine's CPU model, cores and memory, the date, and
a note when the machine was loaded. A script that cannot run here (a missing
package, a tool the machine lacks) says so on the page instead of failing the run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PAGE = ROOT / "docs" / "benchmarks.md"
RESULTS = HERE / "results.json"

# What --quick passes each script: the same measurements, fewer rounds and shorter trials.
QUICK_ARGS: dict[str, list[str]] = {
    "bench_agent.py": ["--rounds", "10", "--steady", "1", "--duration", "1"],
    "bench_bootstrap.py": ["--rounds", "1"],
    "bench_cleanup_listing.py": ["--rounds", "2"],
    "bench_cli_exit.py": ["--rounds", "3"],
    "bench_cli_start.py": ["--repeats", "3"],
    "bench_command_job.py": ["--rounds", "1", "--duration", "1"],
    "bench_cube_kernel.py": ["--repeats", "2", "--seconds", "0.2", "--skip-article"],
    "bench_inputs.py": ["--rounds", "1", "--skip-generate"],
    "bench_model.py": ["--replays", "10"],
    "bench_process_start.py": ["--rounds", "2", "--per-round", "2"],
    "bench_profilers.py": ["--rounds", "1", "--duration", "1"],
    "bench_ray.py": ["--rounds", "1", "--duration", "1"],
    "bench_report.py": ["--quick"],
    "bench_report_command.py": ["--repeats", "2"],
    "bench_sampler_tick.py": ["--rounds", "2", "--seconds", "0.5"],
    "bench_search_confidence.py": ["--replays", "300"],
    "bench_sweep.py": ["--repeats", "1", "--duration", "1"],
    "bench_sweep_process.py": ["--repeats", "1"],
    "bench_trial_cycle.py": ["--repeats", "2", "--trials", "4"],
}


def machine() -> dict[str, Any]:
    """What the figures were measured on, read from the machine itself."""
    cpu = platform.processor() or platform.machine()
    memory = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = int(line.split()[1]) * 1024
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_bytes": memory,
            "system": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(), "load": _load()}


def _load() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def run_script(script: Path, extra: list[str], timeout: float) -> dict[str, Any]:
    """One script in its own process; its tables, notes and how it ended."""
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl", delete=False) as fh:
        sink = Path(fh.name)
    env = {**os.environ, "CLOUDPROF_BENCH_RESULTS": str(sink), "PYTHONPATH": str(ROOT)}
    start, load = time.perf_counter(), _load()
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    try:
        proc = subprocess.run([sys.executable, script.name, *extra], cwd=HERE, env=env,
                              capture_output=True, text=True, timeout=timeout, check=False)
        status, tail = ("ok" if proc.returncode == 0 else f"exit {proc.returncode}"), \
            (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:]
    except subprocess.TimeoutExpired:
        status, tail = f"did not finish within {timeout:.0f} s", []
    seconds = time.perf_counter() - start
    lines = [json.loads(line) for line in sink.read_text().splitlines() if line.strip()]
    sink.unlink()
    print(f"{script.name}: {status} in {seconds:.0f} s, {len(lines)} results", flush=True)
    return {"script": script.name, "command": shlex.join(["python", f"benchmarks/{script.name}",
                                                          *extra]),
            "status": status, "error": tail[0] if tail and status != "ok" else None,
            "seconds": seconds, "load_before": load, "date": date, "results": lines,
            "summary": _first_line(script)}


def _first_line(script: Path) -> str:
    """The script's docstring's first line: what it measures."""
    text = script.read_text(encoding="utf-8")
    match = re.search(r'"""(.+?)\n', text)
    return match.group(1).strip() if match else ""


# ---------------------------------------------------------------- the page

_SCRATCH = re.compile(r"(/tmp|/var/folders|/private/var)/[^\s|`'\")]*")


def clean(text: str) -> str:
    """A cell or line as the page may show it: no machine paths."""
    text = text.replace(str(ROOT) + "/", "").replace(str(ROOT), ".")
    text = text.replace(str(Path.home()), "~")
    return _SCRATCH.sub("<temporary directory>", text)


def cleaned(value: Any) -> Any:
    """``value`` (a results document or any part of it) with :func:`clean` strings."""
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, list):
        return [cleaned(v) for v in value]
    if isinstance(value, dict):
        return {k: cleaned(v) for k, v in value.items()}
    return value


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 10 else f"{value:,.1f}"
    return clean(str(value)).replace("|", "\\|")


def _table(result: dict[str, Any]) -> list[str]:
    headers, rows = result["headers"], result["rows"]
    numeric = [bool(rows) and all(isinstance(r[i], (int, float)) for r in rows)
               for i in range(len(headers))]
    out = []
    if result.get("title"):
        out += [f"**{_cell(result['title'])}**", ""]
    out.append("| " + " | ".join(_cell(h) for h in headers) + " |")
    out.append("|" + "|".join("---:" if n else "---" for n in numeric) + "|")
    out += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return [*out, ""]


def _gib(n: int | None) -> str:
    return f"{n / 2**30:.1f} GiB" if n else "unknown"


def _dates(doc: dict[str, Any]) -> str:
    dates = sorted({s.get("date") or doc["date"] for s in doc["scripts"]}) or [doc["date"]]
    return dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"


def render(doc: dict[str, Any]) -> str:
    """The benchmarks page (Markdown) from a results document (see ``main``)."""
    m = doc["machine"]
    lines = [
        "# Benchmarks",
        "",
        "<!-- generated by benchmarks/run_all.py (make bench): edit the scripts, not this page -->",
        "",
        "Every figure below was measured by a script in `benchmarks/`, run by `make bench`"
        + (" in quick mode (`make bench BENCH_ARGS=--quick`: fewer rounds, shorter trials)"
           if doc.get("quick") else "") + ". Each table sits under the command that produced"
        " it; spreads are the min–max over the rounds the table names. Rerun a command to "
        "measure on your machine.",
        "",
        f"- **Machine:** {m['cpu']}, {m['cores']} logical cores, {_gib(m.get('memory_bytes'))} "
        f"memory; {m['system']}, Python {m['python']}",
        f"- **Date:** {_dates(doc)}",
    ]
    loads = [s["load_before"] for s in doc["scripts"] if s.get("load_before") is not None]
    if loads and m.get("cores") and max(loads) > 0.5 * m["cores"]:
        lines.append(
            f"- **The host was shared and loaded while these ran** (1-minute load average "
            f"{min(loads):.1f}–{max(loads):.1f} on {m['cores']} cores): absolute times are "
            "inflated and noisy; the ratios each script measures side by side are the fairer "
            "figures.")
    lines.append("")
    for s in doc["scripts"]:
        lines += [f"## {s['script']}", ""]
        if s.get("summary"):
            lines += [clean(s["summary"]), ""]
        lines += ["```bash", clean(s["command"]), "```", ""]
        shown = [r for r in s["results"] if r.get("kind") in ("table", "note")]
        for r in s["results"]:
            if r.get("kind") == "unavailable":
                lines += [f"Not run on this machine: {_cell(r['reason'])}.", ""]
        if s["status"] != "ok":
            why = f" ({_cell(s['error'])})" if s.get("error") else ""
            lines += [f"This run: {s['status']}{why}.", ""]
        for r in shown:
            lines += _table(r) if r["kind"] == "table" else [_cell(r["text"]), ""]
        if not shown and s["status"] == "ok" and not any(
                r.get("kind") == "unavailable" for r in s["results"]):
            lines += ["It printed no table.", ""]
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer rounds, shorter trials")
    ap.add_argument("--only", action="append", help="a script to run (repeatable; default all)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds per script (default 1800, quick 300)")
    ap.add_argument("--render", type=Path,
                    help="write the page from this results file; run nothing")
    ap.add_argument("--page", type=Path, default=PAGE)
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args()
    if args.render:
        doc = json.loads(args.render.read_text(encoding="utf-8"))
    else:
        timeout = args.timeout or (300.0 if args.quick else 1800.0)
        scripts = sorted(HERE.glob("bench_*.py"))
        if args.only:
            scripts = [s for s in scripts if s.name in args.only]
        doc = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "quick": args.quick,
               "scripts": [run_script(s, QUICK_ARGS.get(s.name, []) if args.quick else [],
                                      timeout) for s in scripts]}
        if args.only and args.results.is_file():  # the other scripts' figures stay
            kept = json.loads(args.results.read_text(encoding="utf-8"))
            ran = {s["script"]: s for s in doc["scripts"]}
            kept["scripts"] = [ran.pop(s["script"], s) for s in kept["scripts"]] + list(
                ran.values())
            kept["scripts"].sort(key=lambda s: s["script"])
            doc = kept
        doc = cleaned(doc)  # the results are committed beside the page: no machine paths
        args.results.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    args.page.write_text(render(doc), encoding="utf-8")
    print(f"wrote {args.page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
