"""--setup once per (setup command, workdir content, host): later sweeps reuse the environment
from the host's cache, and the run directory holds results, not the environment."""

from __future__ import annotations

import json
import os
import textwrap
import threading
from pathlib import Path

import pytest

from tests.fixtures.in_process import cloudprof
from workloads import job

JOB = textwrap.dedent('''\
    """Uses what its setup built: a module written into the site dir by the setup."""
    import built

    print("cloudprof:units", built.VALUE)
''')
# A setup that installs something the job imports (as pip would, into the site dir) and
# counts its runs in a file outside the copy.
SETUP = ('mkdir -p .cloudprof-site && echo VALUE = 7 > .cloudprof-site/built.py '
         '&& echo ran >> "$SETUP_COUNTER"')


def _sweep(tmp_path: Path, project: Path, setup: str = SETUP) -> Path:
    env = {"CLOUDPROF_CACHE": str(tmp_path / "cache"), "SETUP_COUNTER": str(tmp_path / "counter")}
    out = tmp_path / "runs"
    before = set(out.iterdir()) if out.exists() else set()
    result = cloudprof(
        "sweep", "--no-report", "--machine", "n2-highcpu-2", "--dry-run", "--workers", "1",
        "--repeats", "1",
        "--workdir", str(project), "--setup", setup, "--command", "python userjob.py",
        "--out", str(out), cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-2000:] + result.stdout[-2000:]
    (run,) = set(out.iterdir()) - before
    return run


def _vm(run: Path) -> dict:
    (vm,) = json.loads((run / "sweep.json").read_text())["vms"].values()
    return vm


def _setups(tmp_path: Path) -> int:
    return len((tmp_path / "counter").read_text().split())


@pytest.mark.slow
def test_a_second_sweep_of_the_same_project_reuses_its_setup_and_a_change_builds_anew(
        tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "userjob.py").write_text(JOB)
    first = _sweep(tmp_path, project)
    second = _sweep(tmp_path, project)
    assert (_vm(first)["setup"], _vm(second)["setup"]) == ("ran", "reused")
    assert "set up by an earlier sweep" in next((second / "setup").iterdir()).read_text()
    assert "earlier sweep" not in next((first / "setup").iterdir()).read_text()
    assert _setups(tmp_path) == 1
    assert _vm(first)["job"]["dir"] == _vm(second)["job"]["dir"]
    copy = Path(_vm(second)["job"]["dir"])
    assert copy.is_relative_to(tmp_path / "cache") and (copy / ".cloudprof-site").is_dir()
    for run in (first, second):  # results, the setup's log, no environment
        assert not list(run.rglob(job.SITE_DIR)) and not list(run.rglob("userjob.py"))
        assert "mkdir -p .cloudprof-site" in next((run / "setup").iterdir()).read_text()
        import pyarrow.parquet as pq

        (row,) = pq.read_table(run / "trials.parquet").to_pylist()
        assert row["status"] == "ok" and row["units"] == 7  # the job imported the build
    (project / "userjob.py").write_text(JOB + "# edited\n")  # new content: a new environment
    third = _sweep(tmp_path, project)
    assert _vm(third)["setup"] == "ran" and _setups(tmp_path) == 2
    fourth = _sweep(tmp_path, project, setup=SETUP + " && true")  # another setup: the same
    assert _vm(fourth)["setup"] == "ran" and _setups(tmp_path) == 3
    assert len({_vm(r)["job"]["dir"] for r in (first, third, fourth)}) == 3


def test_concurrent_setups_of_one_copy_build_it_once(tmp_path):
    dest = tmp_path / "copy"
    dest.mkdir()
    counter = tmp_path / "counter"
    command = f"echo ran >> {counter}; sleep 0.5"
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(job.setup(dest, command)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["ran", "reused", "reused"]
    assert counter.read_text().split() == ["ran"]


def test_a_failed_setup_leaves_no_partial_install_for_the_next_attempt(tmp_path):
    dest = tmp_path / "copy"
    dest.mkdir()
    flag = tmp_path / "fail"
    flag.write_text("")
    # the first attempt installs half of what it means to, then fails
    command = (f"if test -e {flag}; then mkdir -p .cloudprof-site/half; exit 1; fi; "
               "mkdir -p .cloudprof-site/whole")
    with pytest.raises(job.JobError):
        job.setup(dest, command)
    assert (dest / job.SITE_DIR / "half").is_dir()
    flag.unlink()
    assert job.setup(dest, command) == "ran"
    assert sorted(p.name for p in (dest / job.SITE_DIR).iterdir()) == ["whole"]


def _archive(tmp_path: Path, name: str) -> Path:
    import tarfile

    src = tmp_path / f"src-{name}"
    src.mkdir()
    (src / "job.py").write_text(f"# {name}\n")
    out = tmp_path / f"{name}.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(src / "job.py", arcname="job.py")
    return out


def test_copies_unused_for_two_weeks_are_removed_when_another_is_unpacked(tmp_path):
    root = tmp_path / "cache" / "jobs"
    assert job.unpack(_archive(tmp_path, "old"), root / "old") == "unpacked"
    assert job.unpack(_archive(tmp_path, "recent"), root / "recent") == "unpacked"
    (root / "archives").mkdir()  # not a copy: never removed
    weeks_ago = job.KEEP_UNUSED_S + 3600
    for name, age in (("old", weeks_ago), ("recent", job.KEEP_UNUSED_S - 3600)):
        mark = root / name / job.UNPACKED_MARK
        then = mark.stat().st_mtime - age
        os.utime(mark, (then, then))
    assert job.unpack(_archive(tmp_path, "new"), root / "new") == "unpacked"
    assert sorted(p.name for p in root.iterdir()) == ["archives", "new", "recent"]
    # a reuse marks the copy used: it is not the next one removed
    mark = root / "recent" / job.UNPACKED_MARK
    os.utime(mark, (mark.stat().st_mtime - 7200,) * 2)
    assert job.unpack(_archive(tmp_path, "recent2"), root / "recent") == "reused"
    assert _age(mark) < 60


def _age(path: Path) -> float:
    import time

    return time.time() - path.stat().st_mtime
