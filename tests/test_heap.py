"""What is on the heap at the peak (--profile memory): object types by size, for a workload in
the runner's process and for a --command job's Python processes, through the start-up hook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from workloads import protocol
from workloads.profilers.heap import HEAP_FILE, heap_env, read_heap
from workloads.profilers.hook import cloudprof_heap
from workloads.protocol import TrialRequest

REPO = Path(__file__).resolve().parents[1]

# Holds 4,000 bytearrays of 8 KiB (32 MiB) in a list for a few seconds, then frees them:
# the census at its high-water mark must see them, the one before or after would not.
JOB = textwrap.dedent('''\
    import time

    time.sleep(0.5)
    rows = [bytearray(8192) for _ in range(4000)]
    time.sleep(4)
    del rows
    time.sleep(0.5)
''')


def _bytearrays(heap: dict) -> dict:
    return next(t for t in heap["top_types"] if t["type"] == "bytearray")


def test_a_census_counts_objects_the_collector_does_not_track():
    # in a process of its own, as below: the census walks the whole heap (11 s of CPU in a
    # test worker that had run a few hundred tests)
    code = textwrap.dedent('''\
        import json
        from workloads.profilers.hook import cloudprof_heap

        keep = [{"n": i} for i in range(50_000)]  # dicts of atoms: untracked, as their ints
        print(json.dumps({**cloudprof_heap.census(top=30), "kept": len(keep)}))
    ''')
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120, check=True)
    found = json.loads(done.stdout)
    kinds = {t["type"]: t for t in found["top_types"]}
    assert kinds["dict"]["count"] >= 50_000 and kinds["int"]["count"] >= 49_000
    assert kinds["dict"]["bytes"] >= 50_000 * sys.getsizeof({})
    assert found["objects"] >= 100_000 and found["bytes"] >= sum(t["bytes"] for t in
                                                                found["top_types"])
    assert found["kept"] == 50_000


def test_a_census_of_an_emptied_heap_at_a_later_high_does_not_replace_the_fuller_one(
        monkeypatch):
    """Resident memory can go on rising after a job frees its objects (the allocator keeps
    the pages, memray's buffers grow): the census there found less heap and is not kept.
    One beside a CPU hog replaced the census that saw the test job's 4,000 bytearrays."""
    mib = 1 << 20
    rss = [100 * mib]
    heaps = iter([{"bytes": 50 * mib, "objects": 9, "top_types": []},
                  {"bytes": 10 * mib, "objects": 1, "top_types": []},
                  {"bytes": 60 * mib, "objects": 12, "top_types": []}])
    monkeypatch.setattr(cloudprof_heap, "resident_bytes", lambda: rss[0])
    monkeypatch.setattr(cloudprof_heap, "census", lambda top=10: next(heaps))
    watch = cloudprof_heap.HeapWatch()
    watch.started -= 10  # past the first second's settling
    watch.look()
    watch.look()  # the first high, growth paused: a census
    rss[0] = 120 * mib
    watch.look()
    watch.look()  # a later high, growth paused: a census, of less heap
    assert watch.censuses == 2 and watch.result()["bytes"] == 50 * mib
    assert watch.result()["peak_rss_bytes"] == 120 * mib
    rss[0] = 160 * mib
    watch.look(force=True)  # a census that finds more heap replaces it
    assert watch.censuses == 3 and watch.result()["bytes"] == 60 * mib
    assert watch.result()["rss_bytes"] == 160 * mib


def test_an_in_process_watch_keeps_the_census_at_the_highest_resident_memory():
    # in a process of its own: a census walks the whole heap, and a long-lived test
    # process's (thousands of tests' objects) would make this test about its size
    code = textwrap.dedent('''\
        import json, os, time
        from workloads.profilers.heap import watch_in_process

        watch = watch_in_process()
        time.sleep(0.4)
        rows = [bytearray(8192) for _ in range(4000)]
        time.sleep(3)
        del rows
        print(json.dumps({**watch.stop(), "me": os.getpid()}))
    ''')
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120, check=True)
    found = json.loads(done.stdout)
    assert found["pid"] == found["me"]
    assert _bytearrays(found)["count"] >= 4000 and _bytearrays(found)["bytes"] >= 4000 * 8192
    assert found["rss_bytes"] <= found["peak_rss_bytes"] and found["censuses"] >= 1


def test_a_commands_python_processes_each_write_their_census_through_the_hook(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = heap_env({**os.environ, "PYTHONPATH": ""}, tmp_path)
    subprocess.run([sys.executable, str(script)], env=env, check=True, timeout=120)
    found = read_heap(tmp_path)
    assert found is not None and found["processes"] == 1
    assert _bytearrays(found)["count"] >= 4000 and _bytearrays(found)["bytes"] >= 4000 * 8192
    assert list(tmp_path.glob(f"{HEAP_FILE}.*.tmp")) == []


def test_a_profiled_command_trial_carries_the_heap_beside_memrays_sites(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    out = tmp_path / "trial"
    request = TrialRequest(command=(sys.executable, str(script)), job=True,
                           vars={"trial": "t-prof-memory", "repeat": "0"},
                           profile="memory", out=str(out), quiet=True)
    done = subprocess.run([sys.executable, "-m", "workloads.run", *request.argv()],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / protocol.SUMMARY_FILE).read_text())
    heap = summary["profile"]["heap"]
    assert _bytearrays(heap)["count"] >= 4000, heap
    assert heap["processes"] == 1  # memray's own probe of the interpreter is no census
    assert summary["profile"]["top_sites"]
