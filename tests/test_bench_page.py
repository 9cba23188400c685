"""The benchmarks page is rendered from what the scripts recorded (no benchmark runs here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import run_all  # noqa: E402 - benchmarks/ is a folder of scripts, not a package


def _doc(load: float) -> dict:
    table = {"kind": "table", "title": "report_run: median of 3 rounds",
             "headers": ["machines", "trials", "s (median)", "min–max"],
             "rows": [[1, 10, 0.161, "0.15–0.17"], [200, 10000, 4.2, "4.1–4.6"]],
             "command": "python benchmarks/bench_report.py --quick"}
    return {
        "machine": {"cpu": "Example CPU 9000", "cores": 2, "memory_bytes": 8 * 2**30,
                    "system": "Linux 6.1", "python": "3.11.7", "load": load},
        "date": "2026-11-26 11:00 UTC", "quick": True,
        "scripts": [
            {"script": "bench_report.py", "command": "python benchmarks/bench_report.py --quick",
             "status": "ok", "error": None, "seconds": 12.0, "load_before": load,
             "summary": "The report's time.", "results": [
                 table, {"kind": "note", "text": "stores made under /tmp/bench-x1/run in 2 s"}]},
            {"script": "bench_ray.py", "command": "python benchmarks/bench_ray.py", "status": "ok",
             "error": None, "seconds": 1.0, "load_before": load, "summary": "Ray.",
             "results": [{"kind": "unavailable", "reason": "Ray is not installed here"}]},
            {"script": "bench_sweep.py", "command": "python benchmarks/bench_sweep.py",
             "status": "exit 1", "error": f"FileNotFoundError: {REPO}/runs/x and /tmp/abc/y",
             "seconds": 3.0, "load_before": load, "summary": "A sweep.", "results": []},
        ],
    }


def test_the_page_shows_each_table_under_its_command_with_the_machine_and_date() -> None:
    page = run_all.render(_doc(load=0.3))
    assert page.startswith("# Benchmarks\n")
    assert "Example CPU 9000, 2 logical cores, 8.0 GiB memory" in page
    assert "2026-11-26 11:00 UTC" in page and "quick mode" in page
    report = page.index("## bench_report.py")
    assert page.index("python benchmarks/bench_report.py --quick", report) \
        < page.index("| machines | trials | s (median) | min–max |", report)
    assert "| 200 | 10000 | 4.2 | 4.1–4.6 |" in page and "|---:|---:|---:|---|" in page
    assert "Not run on this machine: Ray is not installed here." in page
    assert "This run: exit 1 (FileNotFoundError: runs/x and <temporary directory>)" in page
    assert "/tmp/" not in page and str(REPO) not in page
    assert "loaded" not in page  # a quiet host gets no warning


def test_a_loaded_host_is_said_on_the_page() -> None:
    page = run_all.render(_doc(load=6.5))
    assert "The host was shared and loaded while these ran" in page
    assert "load average 6.5–6.5 on 2 cores" in page


def test_a_scripts_tables_come_back_as_json_lines(tmp_path: Path) -> None:
    """What a script prints with print_table is what run_all collects: a real script run."""
    sink = tmp_path / "results.jsonl"
    script = tmp_path / "bench_tiny.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(REPO / 'benchmarks')!r})\n"
        "from _common import print_table\n"
        "print_table(['n', 's'], [[1, 0.5], [2, 0.25]], title='tiny')\n")
    subprocess.run([sys.executable, str(script), "--rounds", "2"], check=True,
                   env={**os.environ, "CLOUDPROF_BENCH_RESULTS": str(sink)},
                   capture_output=True)
    (line,) = [json.loads(x) for x in sink.read_text().splitlines()]
    assert line["kind"] == "table" and line["rows"] == [[1, 0.5], [2, 0.25]]
    assert line["command"].endswith("bench_tiny.py --rounds 2")


def test_the_committed_page_is_the_render_of_the_committed_results() -> None:
    doc = json.loads((REPO / "benchmarks" / "results.json").read_text(encoding="utf-8"))
    assert run_all.render(doc) == (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")


def test_recorded_results_keep_no_machine_paths() -> None:
    doc = run_all.cleaned(_doc(load=0.3))
    text = json.dumps(doc)
    assert "/tmp/" not in text and str(REPO) not in text
    assert doc["scripts"][2]["error"] == "FileNotFoundError: runs/x and <temporary directory>"
